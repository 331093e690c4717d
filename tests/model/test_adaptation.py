"""Discrepancy terms for domain adaptation."""

from __future__ import annotations

import pytest
import torch

from cdmpp.model.adaptation import cmd, discrepancy, mmd


@pytest.mark.parametrize("name", ["cmd", "mmd"])
def test_discrepancy_zero_for_identical_and_grows_with_shift(name):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    y = torch.randn(256, 16, generator=g)
    fn = discrepancy(name)
    assert fn(x, x).item() == pytest.approx(0.0, abs=1e-6)
    values = [fn(x, y + shift).item() for shift in (0.0, 0.5, 2.0)]
    assert values[0] < values[1] < values[2]
    assert discrepancy("none")(x, y + 3).item() == 0.0
    with pytest.raises(ValueError):
        discrepancy("coral")


def test_cmd_has_gradient():
    x = torch.randn(64, 8, requires_grad=True)
    cmd(x, torch.randn(64, 8) + 1).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert mmd(x, x.detach() + 1).item() > 0
