"""Within-task rank correlation, vectorized over all tasks at once: the blend of cdmpp's transformer and GBT
chooses its order weight by it (``cdmpp.model.blend``) and the evaluation reports it
(``cdmpp.evaluation.metrics``), so it lives below both."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _ranks_within(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values`` within each group, ties given their average rank (scipy's rankdata)."""
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    pos = np.arange(len(v), dtype=np.float64)
    new_group = np.r_[True, g[1:] != g[:-1]]
    run = np.cumsum(new_group | np.r_[True, v[1:] != v[:-1]]) - 1
    tied = (np.bincount(run, weights=pos) / np.bincount(run))[run]
    ranks = np.empty(len(v))
    ranks[order] = tied - np.maximum.accumulate(np.where(new_group, pos, 0.0)) + 1.0
    return ranks


def within_task_spearman(seconds: Sequence[float], key: Sequence[float], tasks: Sequence[str],
                         min_group: int = 3) -> float:
    """Spearman ρ between ``key`` and ``seconds`` within each task of ≥ ``min_group`` programs, averaged
    over tasks; a task with constant key or latency counts 0. All tasks at once, without a per-task loop:
    choosing a blend weight calls it for many candidate keys."""
    ids: dict = {}
    groups = np.array([ids.setdefault(t, len(ids)) for t in tasks], dtype=np.int64)  # any hashable task key
    counts = np.bincount(groups)
    keep = counts[groups] >= min_group
    if not keep.any():
        return float("nan")
    _, groups = np.unique(groups[keep], return_inverse=True)
    n = np.bincount(groups).astype(np.float64)
    rx = _ranks_within(np.asarray(key, dtype=np.float64)[keep], groups)
    ry = _ranks_within(np.asarray(seconds, dtype=np.float64)[keep], groups)
    dx = rx - (np.bincount(groups, weights=rx) / n)[groups]
    dy = ry - (np.bincount(groups, weights=ry) / n)[groups]
    sxx, syy = np.bincount(groups, weights=dx * dx), np.bincount(groups, weights=dy * dy)
    sxy = np.bincount(groups, weights=dx * dy)
    ok = (sxx > 1e-9) & (syy > 1e-9)
    rho = np.where(ok, sxy / np.sqrt(np.where(ok, sxx * syy, 1.0)), 0.0)
    return float(rho.mean())
