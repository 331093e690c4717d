"""The CDMPP predictor network, top to bottom: leaves -> transformer -> program embedding -> latency.

A program arrives as a sequence of leaf (buffer-store) feature vectors, each tagged with its position
in the pre-order serialization of the compact AST. The network

1. projects the (already normalized) leaf features to ``d_model``;
2. adds a sinusoidal encoding of the pre-order position, so that leaves under the same loop nest,
   which sit close together in pre-order, look alike to attention (switch off with ``use_pe=False``);
3. runs a transformer encoder over the leaves with a key-padding mask, so any number of leaves works
   (the original code kept only programs with exactly five leaves);
4. mean-pools the valid leaves into a program embedding, plus an embedding of log(#leaves): a mean
   cannot count, and with a variable leaf count the total work is mean x count;
5. adds a device embedding computed from the device's spec vector, and decodes one scalar: the
   latency as standardized log seconds (see ``cdmpp.model.transforms.LogLatency``).

``n_program_inputs`` adds program-level inputs (log FLOPs, bytes, unique bytes; ``program_stats``; and, trained
with ``assembly_counts``, the built program's instruction counts, ``assembly_stats``) to the embedding. What issue 19's study tried beside this network and dropped (sum and attention pooling, a device
FiLM, loop tokens, pooled leaf inputs, a roofline offset) is in reports/study-issue19.md, "Options removed".

``PackedPrograms`` and ``collate`` turn ``ProgramFeatures`` objects into padded tensors with one
gather, without a Python loop per leaf, because prediction must handle thousands of programs a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
from torch import nn

from cdmpp.program import assembly

if TYPE_CHECKING:  # features.py belongs to the featurizer; the model only reads three attributes
    from cdmpp.program.features import ProgramFeatures


@dataclass
class ModelConfig:
    """The network's shape (``CDMPPModel``'s keyword arguments); the defaults are the shipped recipe's."""

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    # none: at the shipped budget 0.0 against 0.1 was lower on every seed (reports/study-issue19.md, round 17)
    dropout: float = 0.0
    use_pe: bool = True  # the pre-order positional encoding (off: the ablation ``train/ablation-no-pe.toml``)


def sinusoidal_encoding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(p / 10000^(2i/dim)).

    ``positions`` is an integer tensor of any shape; the result has shape ``positions.shape + (dim,)``.
    Pre-order indices reach a few hundred, far below the ~10000*2pi wavelength limit of the code.
    """
    two_i = torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device)
    inv_freq = torch.exp(-math.log(10000.0) * two_i / dim)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    pe = torch.empty(*positions.shape, dim, dtype=torch.float32, device=positions.device)
    pe[..., 0::2] = torch.sin(angles)
    pe[..., 1::2] = torch.cos(angles[..., : dim // 2])
    return pe


class CDMPPModel(nn.Module):
    """Transformer over leaf features + device encoder + MLP decoder; one scalar per program.

    Inputs of ``forward``: ``x [B, L, F]`` normalized leaf features (zeros where padded), ``pos [B, L]``
    pre-order positions, ``mask [B, L]`` bool, True where a leaf is present, ``device [B, D]``
    normalized device spec vectors, and with ``n_program_inputs`` the program-level inputs ``extra [B, n]``
    (``TrainedModel.extra_inputs``). Dropout sits in the encoder and the decoder.
    """

    def __init__(self, n_features: int, device_dim: int, d_model: int = 128, n_heads: int = 4,
                 n_layers: int = 2, d_ff: int = 256, dropout: float = 0.0, use_pe: bool = True,
                 n_program_inputs: int = 0):
        super().__init__()
        # Stored as given so a checkpoint can rebuild the module from JSON alone.
        self.hparams = dict(n_features=n_features, device_dim=device_dim, d_model=d_model, n_heads=n_heads,
                            n_layers=n_layers, d_ff=d_ff, dropout=dropout, use_pe=use_pe,
                            n_program_inputs=n_program_inputs)
        self.d_model = d_model
        self.use_pe = use_pe
        self.program_proj = (nn.Sequential(nn.Linear(n_program_inputs, d_model), nn.GELU(), nn.Linear(d_model, d_model))
                             if n_program_inputs else None)

        self.input_proj = nn.Linear(n_features, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        # Nested tensors would drop padded rows in eval mode; plain padding keeps train and eval identical.
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(d_model)
        self.count_proj = nn.Linear(1, d_model)

        self.device_encoder = nn.Sequential(nn.Linear(device_dim, d_model), nn.GELU(), nn.Linear(d_model, d_model))
        # A spec direction no training device varies along gets no gradient and would keep its random
        # initial weights: trained on one device (whose specs normalize to 0), a new device's specs
        # would add a random offset. Zero weights make such a direction count for nothing until
        # training (or k-shot fine-tuning) sees devices that differ along it.
        nn.init.zeros_(self.device_encoder[0].weight)
        self.decoder = nn.Sequential(
            nn.Linear(d_model, d_model), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(d_model, d_model // 2), nn.GELU(),
            nn.Linear(d_model // 2, 1),
        )

    def embed(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
              extra: torch.Tensor | None = None) -> torch.Tensor:
        """Program embedding ``[B, d_model]``: what domain adaptation aligns and KMeans clusters.
        ``extra [B, n_program_inputs]``: program-level inputs (required when the model has them)."""
        h = self.input_proj(x)
        if self.use_pe:
            h = h + sinusoidal_encoding(pos, self.d_model)
        h = self.final_norm(self.encoder(h, src_key_padding_mask=~mask))
        m = mask.unsqueeze(-1).to(h.dtype)
        count = m.sum(dim=1).clamp_min(1.0)
        out = (h * m).sum(dim=1) / count + self.count_proj(torch.log(count))
        if self.program_proj is not None:
            out = out + self.program_proj(extra)
        return out

    def head(self, program_embedding: torch.Tensor, device: torch.Tensor) -> torch.Tensor:
        """Latency (standardized log seconds) from a program embedding and a device spec vector."""
        return self.decoder(program_embedding + self.device_encoder(device)).squeeze(-1)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, device: torch.Tensor,
                extra: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.embed(x, pos, mask, extra), device)


_N_TVM_FEATURES = 164
_BYTES_COLS = [60 + 18 * b for b in range(5)]  # B{b}_bytes of TVM's PerStoreFeature (log2(x+1)-scaled)
_UNIQUE_BYTES_COLS = [61 + 18 * b for b in range(5)]  # B{b}_unique_bytes


_FLOAT_MAD, _FLOAT_OTHER_OPS = 0, slice(1, 7)  # float mad; addsub, mul, divmod, cmp, math, other


def leaf_flops(raw_leaves: np.ndarray) -> np.ndarray:
    """FLOPs per leaf from TVM's log2(x+1)-scaled op counts, a fused multiply-add counted as 2 FLOPs
    (the convention of peak FLOP/s figures; ``ProgramFeatures.flops`` counts it as 1)."""
    x = np.exp2(raw_leaves.astype(np.float64)) - 1.0
    return 2.0 * x[:, _FLOAT_MAD] + x[:, _FLOAT_OTHER_OPS].sum(axis=1)


def program_stats(raw_leaves: np.ndarray, offsets: np.ndarray, flops: np.ndarray | None = None) -> np.ndarray:
    """Per program ``[n, 3]``: log2(1 + FLOPs), log2(1 + bytes accessed), log2(1 + unique bytes), the
    inputs of a roofline bound. FLOPs are ``flops`` (``ProgramFeatures.flops``: counted on the program's
    blocks, schedule-independent) when given, else TVM's per-store counts (``leaf_flops``, which count
    recomputation at the loops' trip count); bytes are summed over the leaves' raw TVM rows."""
    x = raw_leaves.astype(np.float64)
    if flops is None:
        flops = np.add.reduceat(leaf_flops(raw_leaves), offsets[:-1])
    total = np.add.reduceat(np.exp2(x[:, _BYTES_COLS]) - 1.0, offsets[:-1], axis=0).sum(axis=1)
    unique = np.add.reduceat(np.exp2(x[:, _UNIQUE_BYTES_COLS]) - 1.0, offsets[:-1], axis=0).sum(axis=1)
    flops = np.asarray(flops, dtype=np.float64)
    return np.log2(1.0 + np.stack([np.maximum(flops, 0.0), np.maximum(total, 0.0), np.maximum(unique, 0.0)], axis=1))


N_ROOFLINE_STATS = 3  # program_stats' columns, the program-level inputs of every model
N_STATS = N_ROOFLINE_STATS + assembly.N_INPUTS + 1  # with assembly_stats'
N_INNER_STATS = N_STATS + assembly.N_INPUTS + 1  # and the innermost loops' (``TrainConfig.assembly_inner``)


def assembly_stats(counts: Sequence[np.ndarray | None]) -> np.ndarray:
    """Per program ``[n, N_INPUTS + 1]``: ``count_inputs`` of its build's instruction counts (0 where it was not
    built) and 1 where it was."""
    x = np.stack([assembly.count_inputs(c) for c in counts]) if len(counts) else np.zeros((0, assembly.N_INPUTS))
    built = ~np.isnan(x[:, :1])
    return np.hstack([np.nan_to_num(x, nan=0.0), built.astype(np.float64)])


class PackedPrograms:
    """Many programs as one leaf matrix plus offsets, so a padded batch is a single numpy gather.

    ``leaves [N_leaves, F]`` float32 (normalized or not), ``positions [N_leaves]`` int64 and
    ``offsets [n_programs + 1]``: program i owns rows ``offsets[i]:offsets[i+1]``. A program without
    leaves gets one all-zero leaf at position 0 so attention always has a key to look at.

    The arrays may be memory-mapped (``cdmpp.model.feature_store``): then ``transform`` (a row-wise map such as
    ``FeatureNormalizer.transform``) normalizes the rows a batch gathers instead of a normalized copy of every
    row, and ``release`` is called every ``RELEASE_EVERY`` batches to hand the pages read back to the kernel.
    """

    # a fault on a mapped file maps the whole cached folio around the row (2 MB on a 6.18 kernel: one row read,
    # +2.1 MB resident; 256 random rows, +366 MB), so the pages go back after every batch (~2 ms)
    RELEASE_EVERY = 1

    def __init__(self, leaves: np.ndarray, positions: np.ndarray, offsets: np.ndarray, stats: np.ndarray | None = None,
                 transform: Callable[[np.ndarray], np.ndarray] | None = None, release: Callable[[], None] | None = None):
        self.transform, self.release, self._batches = transform, release, 0
        self.leaves = np.ascontiguousarray(leaves, dtype=np.float32)
        self.positions = np.ascontiguousarray(positions, dtype=np.int64)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.lengths = np.diff(self.offsets)
        # [n, N_STATS]: log2 of FLOPs, bytes, unique bytes (program_stats), from raw features; then the assembly's
        # counts (assembly_stats), which a model reads only when trained with them (``TrainConfig.assembly_counts``);
        # where programs carry them, the innermost loops' counts after those (``N_INNER_STATS`` columns)
        self.stats = stats

    @classmethod
    def from_programs(cls, programs: Sequence["ProgramFeatures"],
                      normalize: Callable[[np.ndarray], np.ndarray] | None = None) -> "PackedPrograms":
        """Pack programs; ``normalize`` maps the stacked ``[N_leaves, F]`` matrix (e.g. FeatureNormalizer.transform)."""
        if not programs:
            raise ValueError("no programs to pack")
        n_features = programs[0].leaf_features.shape[-1]
        empty_leaf, empty_pos = np.zeros((1, n_features), np.float32), np.zeros(1, np.int64)
        feats, poss = [], []
        for p in programs:
            f = p.leaf_features
            if len(f) == 0:
                feats.append(empty_leaf)
                poss.append(empty_pos)
            else:
                feats.append(f)
                poss.append(p.positions)
        lengths = np.fromiter((len(f) for f in feats), dtype=np.int64, count=len(feats))
        offsets = np.zeros(len(feats) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        leaves = np.concatenate(feats).astype(np.float32, copy=False)
        flops = [getattr(p, "flops", None) for p in programs]
        flops = None if any(f is None for f in flops) else np.array(flops, dtype=np.float64)
        stats = None
        if n_features == _N_TVM_FEATURES:
            counts = [getattr(p, "asm", None) for p in programs]
            stats = [program_stats(leaves, offsets, flops), assembly_stats(counts)]
            inner = [getattr(p, "asm_inner", None) for p in programs]
            if any(c is not None for c in inner):  # only where asked for (``load_dataset(..., innermost=True)``)
                stats.append(assembly_stats(inner))
            stats = np.hstack(stats)
        if normalize is not None:
            leaves = normalize(leaves)
        return cls(leaves, np.concatenate(poss), offsets, stats)

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, idx: np.ndarray) -> "PackedPrograms":
        """The programs ``idx`` as a new pack (used to split a pool without re-featurizing)."""
        idx = np.asarray(idx, dtype=np.int64)
        lengths = self.lengths[idx]
        offsets = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        rows = np.repeat(self.offsets[idx] - offsets[:-1], lengths) + np.arange(offsets[-1])
        return PackedPrograms(self.leaves[rows], self.positions[rows], offsets,
                              None if self.stats is None else self.stats[idx])

    def with_leaves(self, leaves: np.ndarray) -> "PackedPrograms":
        """The same programs with other leaf rows (e.g. normalized), stats kept."""
        return PackedPrograms(leaves, self.positions, self.offsets, self.stats)

    def with_transform(self, transform: Callable[[np.ndarray], np.ndarray]) -> "PackedPrograms":
        """The same programs, their rows mapped by ``transform`` as batches gather them (the leaves stay as stored)."""
        return PackedPrograms(self.leaves, self.positions, self.offsets, self.stats, transform, self.release)

    def program_means(self) -> np.ndarray:
        """Mean leaf vector per program ``[n, F]``: a model-free embedding for KMeans sampling."""
        sums = np.add.reduceat(self.leaves, self.offsets[:-1], axis=0)
        return sums / self.lengths[:, None]

    def batch(self, idx: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded ``(x [B, L, F], pos [B, L], mask [B, L])`` for programs ``idx`` (all if None); L = longest."""
        idx = np.arange(len(self)) if idx is None else np.asarray(idx, dtype=np.int64)
        lengths = self.lengths[idx]
        width = int(lengths.max())
        slots = np.arange(width)
        mask = slots[None, :] < lengths[:, None]
        rows = np.where(mask, self.offsets[idx][:, None] + slots[None, :], 0)
        x = self.leaves[rows]
        if self.transform is not None:
            x = self.transform(x)
        x[~mask] = 0.0
        pos = np.where(mask, self.positions[rows], 0)
        if self.release is not None:
            self._batches += 1
            if self._batches % self.RELEASE_EVERY == 0:
                self.release()
        return torch.from_numpy(x), torch.from_numpy(pos), torch.from_numpy(mask)


def collate(programs: Sequence["ProgramFeatures"],
            normalize: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a list of ``ProgramFeatures`` into ``(x [B, L, F], pos [B, L], mask [B, L])``; mask True = real leaf."""
    return PackedPrograms.from_programs(programs, normalize).batch()


def length_sorted_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Index batches of programs with similar leaf counts, so little compute goes to padding (inference)."""
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def bucketed_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                     bucket_batches: int = 32) -> list[np.ndarray]:
    """Random training batches with little padding: shuffle, sort by length within chunks of
    ``bucket_batches`` batches, cut into batches, shuffle the batch order."""
    perm = rng.permutation(len(lengths))
    chunk = batch_size * bucket_batches
    batches = []
    for start in range(0, len(perm), chunk):
        part = perm[start:start + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches.extend(part[i:i + batch_size] for i in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches
