"""Discrepancies between two samples of embeddings, used as a domain-adaptation loss term.

Training adds ``weight * discrepancy(source_embeddings, target_embeddings)`` where the target
embeddings come from unlabeled programs of the unseen network or device, so the encoder learns a
representation on which source and target look alike and the decoder transfers.

* ``cmd``: central moment discrepancy (Zellinger et al., ICLR 2017), CDMPP's choice.
* ``mmd``: maximum mean discrepancy with a sum of Gaussian kernels, the public CDMPP code's default.
* ``none``: zero, for the ablation.
"""

from __future__ import annotations

from typing import Callable

import torch


def cmd(x: torch.Tensor, y: torch.Tensor, k: int = 5) -> torch.Tensor:
    """Central moment discrepancy of order ``k`` between samples ``x [n, d]`` and ``y [m, d]``.

    CMD = ||E x - E y|| / |b-a| + sum_{j=2..k} ||c_j(x) - c_j(y)|| / |b-a|^j, for data in [a, b].
    Our embeddings are not squashed into a fixed box, so each dimension is min-max scaled to [0, 1]
    over the union of both samples (bounds detached: they set the scale, not a gradient path), which
    is the paper's division by the range, done per dimension.
    """
    both = torch.cat([x, y]).detach()
    lo, hi = both.min(dim=0).values, both.max(dim=0).values
    scale = (hi - lo).clamp_min(1e-6)
    x, y = (x - lo) / scale, (y - lo) / scale
    mx, my = x.mean(dim=0), y.mean(dim=0)
    total = torch.linalg.vector_norm(mx - my)
    cx, cy = x - mx, y - my
    for order in range(2, k + 1):
        total = total + torch.linalg.vector_norm(cx.pow(order).mean(dim=0) - cy.pow(order).mean(dim=0))
    return total


def mmd(x: torch.Tensor, y: torch.Tensor, bandwidths: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)) -> torch.Tensor:
    """Squared maximum mean discrepancy (biased V-statistic) with a sum of Gaussian kernels.

    Bandwidths are multiples of the mean pairwise squared distance of the pooled sample (detached), so
    the loss works at any embedding scale without tuning. Zero for identical samples.
    """
    both = torch.cat([x, y])
    d2 = torch.cdist(both, both).pow(2)
    base = d2.detach().sum() / max(len(both) ** 2 - len(both), 1)
    base = base.clamp_min(1e-6)
    kernel = sum(torch.exp(-d2 / (base * b)) for b in bandwidths)
    n = len(x)
    kxx, kyy, kxy = kernel[:n, :n], kernel[n:, n:], kernel[:n, n:]
    return (kxx.mean() + kyy.mean() - 2 * kxy.mean()).clamp_min(0.0)


def no_discrepancy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Zero that still belongs to the graph (the no-adaptation ablation)."""
    return x.sum() * 0.0


def discrepancy(name: str, cmd_k: int = 5) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Look a discrepancy up by its short name: ``"cmd"`` (with ``cmd_k`` moments), ``"mmd"`` or ``"none"``."""
    if name == "cmd":
        return lambda x, y: cmd(x, y, k=cmd_k)
    if name == "mmd":
        return mmd
    if name == "none":
        return no_discrepancy
    raise ValueError(f"unknown discrepancy {name!r}: expected 'cmd', 'mmd' or 'none'")
