"""A zoo of real network architectures, written as plain PyTorch modules (no torchvision, no weights).

Why in-project code: cdmpp only needs the *operator shapes* of real networks to extract TVM tuning
tasks, so architectures are rebuilt here, compactly, from their papers / reference configs. Weights are
random (default init); they do not change the tasks. Every entry in ``NETWORKS`` says how to build the
model and which example inputs (shape + dtype) to trace it with, for each batch size.

Transformers take int64 token ids (BERT, GPT-2) — the Relax importer handles the embedding lookup
(``take``), so no float-embedding workaround is needed. ViT takes images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------------
# Shared building blocks


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: type | None = nn.ReLU) -> nn.Sequential:
    """Conv (no bias) + BatchNorm (+ activation): the unit of nearly every CNN below."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6) else act())
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------------------------------
# ResNet (He et al. 2016) and Wide ResNet (Zagoruyko & Komodakis 2016)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1, base_width: int = 64):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, width, 3, stride), conv_bn(width, width, 3, act=None))
        self.down = conv_bn(cin, width, 1, stride, act=None) if stride != 1 or cin != width else None

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        return F.relu(self.body(x) + idt)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, base_width: int = 64):
        super().__init__()
        mid = int(width * base_width / 64)
        cout = width * self.expansion
        self.body = nn.Sequential(conv_bn(cin, mid, 1), conv_bn(mid, mid, 3, stride), conv_bn(mid, cout, 1, act=None))
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        return F.relu(self.body(x) + idt)


class ResNet(nn.Module):
    """torchvision-style ResNet v1.5 (stride in the 3x3 conv of a bottleneck)."""

    def __init__(self, block, layers: list[int], num_classes: int = 1000, base_width: int = 64):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1, base_width))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18():
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50():
    return ResNet(Bottleneck, [3, 4, 6, 3])


def wide_resnet50_2():
    """Wide ResNet-50-2: ResNet-50 with bottleneck inner width doubled (different conv shapes)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], base_width=128)


# --------------------------------------------------------------------------------------------------
# MobileNetV2 (Sandler et al. 2018)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hid = cin * expand
        layers = [] if expand == 1 else [conv_bn(cin, hid, 1, act=nn.ReLU6)]
        layers += [conv_bn(hid, hid, 3, stride, groups=hid, act=nn.ReLU6), conv_bn(hid, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, stride s) from the paper's Table 2
    CFG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, cin = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in self.CFG:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --------------------------------------------------------------------------------------------------
# SqueezeNet 1.1 (Iandola et al. 2016)


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, e1: int, e3: int):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.e1 = nn.Conv2d(squeeze, e1, 1)
        self.e3 = nn.Conv2d(squeeze, e3, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


class SqueezeNet11(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), pool(),
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), pool(),
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), pool(),
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256), Fire(512, 64, 256, 256),
        )
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1), nn.ReLU(inplace=True))

    def forward(self, x):
        return torch.flatten(F.adaptive_avg_pool2d(self.classifier(self.features(x)), 1), 1)


# --------------------------------------------------------------------------------------------------
# DenseNet-121 (Huang et al. 2017)


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1(4k)-BN-ReLU-Conv3x3(k), output concatenated to the input (pre-activation)."""

    def __init__(self, cin: int, growth: int, bn_size: int = 4):
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.Conv2d(cin, bn_size * growth, 1, bias=False),
            nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True), nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False),
        )

    def forward(self, x):
        return torch.cat([x, self.body(x)], 1)


class DenseNet(nn.Module):
    """Full DenseNet-121 by default (block config 6-12-24-16, growth 32): every dense layer sees a
    different input width, so it contributes many distinct conv/BN tasks."""

    def __init__(self, blocks=(6, 12, 24, 16), growth: int = 32, init: int = 64, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, init, 7, 2), nn.MaxPool2d(3, 2, 1)]
        c = init
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, growth))
                c += growth
            if i != len(blocks) - 1:  # transition: BN-ReLU-Conv1x1 halving channels, then 2x2 avg pool
                layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --------------------------------------------------------------------------------------------------
# GoogLeNet / Inception v1 (Szegedy et al. 2015), without auxiliary heads


class Inception(nn.Module):
    """Four parallel branches (1x1 | 1x1→3x3 | 1x1→3x3 | maxpool→1x1) concatenated on channels."""

    def __init__(self, cin, c1, c3r, c3, c5r, c5, pp):
        super().__init__()
        self.b1 = conv_bn(cin, c1, 1)
        self.b2 = nn.Sequential(conv_bn(cin, c3r, 1), conv_bn(c3r, c3, 3))
        self.b3 = nn.Sequential(conv_bn(cin, c5r, 1), conv_bn(c5r, c5, 3))  # torchvision uses 3x3 here too
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), conv_bn(cin, pp, 1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            conv_bn(3, 64, 7, 2), pool(), conv_bn(64, 64, 1), conv_bn(64, 192, 3), pool(),
            Inception(192, 64, 96, 128, 16, 32, 32), Inception(256, 128, 128, 192, 32, 96, 64), pool(),
            Inception(480, 192, 96, 208, 16, 48, 64), Inception(512, 160, 112, 224, 24, 64, 64),
            Inception(512, 128, 128, 256, 24, 64, 64), Inception(512, 112, 144, 288, 32, 64, 64),
            Inception(528, 256, 160, 320, 32, 128, 128), nn.MaxPool2d(2, 2, ceil_mode=True),
            Inception(832, 256, 160, 320, 32, 128, 128), Inception(832, 384, 192, 384, 48, 128, 128),
        )
        self.fc = nn.Sequential(nn.Dropout(0.2), nn.Linear(1024, num_classes))

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --------------------------------------------------------------------------------------------------
# Transformers: BERT encoder, ViT, GPT-2 decoder


class SelfAttention(nn.Module):
    """Multi-head self-attention written out (matmul / softmax), so the importer sees plain ops."""

    def __init__(self, dim: int, heads: int, causal: bool = False, max_len: int = 0):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        if causal:
            self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        if self.causal:
            att = att.masked_fill(~self.mask[:n, :n], float("-inf"))
        y = att.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class TransformerLayer(nn.Module):
    """Post-LN (BERT) or pre-LN (ViT, GPT-2) transformer layer with a GELU MLP of width 4·dim."""

    def __init__(self, dim: int, heads: int, pre_ln: bool, causal: bool = False, max_len: int = 0, eps: float = 1e-5):
        super().__init__()
        self.pre_ln = pre_ln
        self.attn = SelfAttention(dim, heads, causal, max_len)
        self.ln1, self.ln2 = nn.LayerNorm(dim, eps=eps), nn.LayerNorm(dim, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        if self.pre_ln:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class BertEncoder(nn.Module):
    """BERT encoder (Devlin et al. 2019): token + position + segment embeddings, post-LN layers, pooler."""

    def __init__(self, layers: int, dim: int, heads: int, vocab: int = 30522, max_len: int = 512):
        super().__init__()
        self.tok, self.pos, self.seg = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim), nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.Sequential(*[TransformerLayer(dim, heads, pre_ln=False, eps=1e-12) for _ in range(layers)])
        self.pooler = nn.Linear(dim, dim)

    def forward(self, ids):
        n = ids.shape[1]
        pos = torch.arange(n, device=ids.device)
        x = self.ln(self.tok(ids) + self.pos(pos)[None] + self.seg.weight[0])
        x = self.layers(x)
        return x, torch.tanh(self.pooler(x[:, 0]))


def bert_tiny():
    return BertEncoder(layers=2, dim=128, heads=2)


def bert_base():
    return BertEncoder(layers=12, dim=768, heads=12)


class ViT(nn.Module):
    """Vision Transformer (Dosovitskiy et al. 2021): 16x16 patch conv, class token, pre-LN layers."""

    def __init__(self, image: int = 224, patch: int = 16, dim: int = 192, layers: int = 12, heads: int = 3, num_classes: int = 1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.layers = nn.Sequential(*[TransformerLayer(dim, heads, pre_ln=True, eps=1e-6) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.ln(self.layers(x))[:, 0])


def vit_tiny():
    return ViT(dim=192, layers=12, heads=3)


class GPT2(nn.Module):
    """GPT-2 decoder (Radford et al. 2019): causal pre-LN layers, final LN, LM head tied to embeddings."""

    def __init__(self, layers: int = 12, dim: int = 768, heads: int = 12, vocab: int = 50257, max_len: int = 1024):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        self.layers = nn.Sequential(*[TransformerLayer(dim, heads, pre_ln=True, causal=True, max_len=max_len) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.layers(self.tok(ids) + self.pos(pos)[None]))
        return x @ self.tok.weight.t()  # logits


def gpt2_small():
    return GPT2(layers=12, dim=768, heads=12)


# --------------------------------------------------------------------------------------------------
# Generative / dense-prediction conv nets


class DCGANGenerator(nn.Module):
    """DCGAN generator (Radford et al. 2016): z (100) → 64x64x3 image via transposed convs."""

    def __init__(self, nz: int = 100, ngf: int = 64):
        super().__init__()

        def up(cin, cout, stride=2, pad=1):
            return [nn.ConvTranspose2d(cin, cout, 4, stride, pad, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]

        self.net = nn.Sequential(
            *up(nz, ngf * 8, 1, 0), *up(ngf * 8, ngf * 4), *up(ngf * 4, ngf * 2), *up(ngf * 2, ngf),
            nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh(),
        )

    def forward(self, z):
        return self.net(z)


class UNet(nn.Module):
    """Small U-Net (Ronneberger et al. 2015) for 128x128 segmentation: 4 levels, base width 32,
    double 3x3 conv blocks, max-pool down, transposed-conv up, skip concatenation."""

    def __init__(self, cin: int = 3, classes: int = 2, base: int = 32, levels: int = 4):
        super().__init__()
        ws = [base * 2**i for i in range(levels + 1)]
        block = lambda a, b: nn.Sequential(conv_bn(a, b, 3), conv_bn(b, b, 3))  # noqa: E731
        self.downs = nn.ModuleList([block(cin if i == 0 else ws[i - 1], ws[i]) for i in range(levels)])
        self.mid = block(ws[-2], ws[-1])
        self.ups = nn.ModuleList([nn.ConvTranspose2d(ws[i + 1], ws[i], 2, 2) for i in reversed(range(levels))])
        self.dec = nn.ModuleList([block(2 * ws[i], ws[i]) for i in reversed(range(levels))])
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        skips = []
        for d in self.downs:
            x = d(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for up, dec, s in zip(self.ups, self.dec, reversed(skips)):
            x = dec(torch.cat([up(x), s], 1))
        return self.head(x)


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int, tok_hidden: int, ch_hidden: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tok = nn.Sequential(nn.Linear(tokens, tok_hidden), nn.GELU(), nn.Linear(tok_hidden, tokens))
        self.ch = nn.Sequential(nn.Linear(dim, ch_hidden), nn.GELU(), nn.Linear(ch_hidden, dim))

    def forward(self, x):
        x = x + self.tok(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.ln2(x))


class MLPMixer(nn.Module):
    """MLP-Mixer S/16 (Tolstikhin et al. 2021) at 224: token-mixing and channel-mixing MLPs."""

    def __init__(self, image: int = 224, patch: int = 16, dim: int = 512, layers: int = 8, num_classes: int = 1000):
        super().__init__()
        n = (image // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.layers = nn.Sequential(*[MixerBlock(n, dim, 256, 2048) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.layers(self.patch(x).flatten(2).transpose(1, 2))
        return self.head(self.ln(x).mean(1))


# --------------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class NetworkSpec:
    """How to build a network and feed it.

    ``inputs``: per-sample input shapes (without the batch dimension) and dtypes, one per forward arg.
    ``small_inputs``: smaller per-sample shapes that still run (for fast forward tests), or None.
    """

    name: str
    build: Callable[[], nn.Module]
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    batch_sizes: tuple[int, ...] = (1, 8)
    small_inputs: tuple[tuple[tuple[int, ...], str], ...] | None = None
    description: str = ""
    meta: dict = field(default_factory=dict)

    def example_inputs(self, batch_size: int, small: bool = False, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Random example inputs (token ids drawn below 1000, i.e. valid for every vocab here)."""
        g = torch.Generator().manual_seed(seed)
        specs = self.small_inputs if (small and self.small_inputs) else self.inputs
        out = []
        for shape, dtype in specs:
            full = (batch_size, *shape)
            if dtype == "int64":
                out.append(torch.randint(0, 1000, full, generator=g, dtype=torch.int64))
            else:
                out.append(torch.randn(full, generator=g, dtype=getattr(torch, dtype)))
        return tuple(out)


IMG = (((3, 224, 224), "float32"),)
IMG_SMALL = (((3, 64, 64), "float32"),)


def _spec(name, build, inputs, small=None, desc=""):
    return NetworkSpec(name=name, build=build, inputs=inputs, small_inputs=small, description=desc)


NETWORKS: dict[str, NetworkSpec] = {
    s.name: s
    for s in [
        _spec("resnet18", resnet18, IMG, IMG_SMALL, "ResNet-18, 224x224"),
        _spec("resnet50", resnet50, IMG, IMG_SMALL, "ResNet-50 v1.5, 224x224"),
        _spec("wide_resnet50_2", wide_resnet50_2, IMG, IMG_SMALL, "Wide ResNet-50-2, 224x224"),
        _spec("mobilenet_v2", MobileNetV2, IMG, IMG_SMALL, "MobileNetV2 1.0, 224x224"),
        _spec("squeezenet1_1", SqueezeNet11, IMG, IMG_SMALL, "SqueezeNet 1.1, 224x224"),
        _spec("densenet121", DenseNet, IMG, IMG_SMALL, "DenseNet-121 (full depth), 224x224"),
        _spec("googlenet", GoogLeNet, IMG, IMG_SMALL, "GoogLeNet / Inception v1 without aux heads, 224x224"),
        _spec("bert_tiny", bert_tiny, (((128,), "int64"),), (((16,), "int64"),), "BERT-tiny L2 H128 A2, seq 128"),
        _spec("bert_base", bert_base, (((128,), "int64"),), (((16,), "int64"),), "BERT-base L12 H768 A12, seq 128"),
        _spec("vit_tiny", vit_tiny, IMG, None, "ViT-Ti/16 (dim 192, 12 layers, 3 heads), 224x224"),
        _spec("gpt2_small", gpt2_small, (((64,), "int64"),), (((16,), "int64"),), "GPT-2 small (12L, 768, 12 heads), seq 64"),
        _spec("dcgan_gen", DCGANGenerator, (((100, 1, 1), "float32"),), None, "DCGAN generator, z=100 → 64x64"),
        _spec("unet", UNet, (((3, 128, 128), "float32"),), IMG_SMALL, "U-Net (4 levels, base 32), 128x128"),
        _spec("mlp_mixer_s16", MLPMixer, IMG, None, "MLP-Mixer S/16, 224x224"),
    ]
}


def get_network(name: str) -> NetworkSpec:
    try:
        return NETWORKS[name]
    except KeyError:
        raise KeyError(f"unknown network {name!r}; known: {', '.join(NETWORKS)}") from None
