"""The network zoo's PyTorch modules."""

from __future__ import annotations

import pytest
import torch

from cdmpp.zoo import networks as zn


@pytest.mark.parametrize("name", sorted(zn.NETWORKS))
def test_forward_runs(name):
    """Every zoo network builds and runs in torch at batch 1 (small inputs where the net allows)."""
    spec = zn.NETWORKS[name]
    assert len(spec.batch_sizes) >= 2
    torch.manual_seed(0)
    with torch.no_grad():
        out = spec.build().eval()(*spec.example_inputs(1, small=True))
    out = out if isinstance(out, torch.Tensor) else out[0]
    assert out.shape[0] == 1 and torch.isfinite(out).all()


def test_zoo_has_required_architectures():
    need = {"resnet18", "resnet50", "mobilenet_v2", "squeezenet1_1", "densenet121", "googlenet", "bert_tiny",
            "bert_base", "vit_tiny", "gpt2_small", "dcgan_gen"}
    assert need <= set(zn.NETWORKS)
    assert zn.NETWORKS["bert_base"].inputs[0][1] == "int64"
