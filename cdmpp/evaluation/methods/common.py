"""What the peer methods share: a program's feature rows, leaf pooling, and a deadline for boosting."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

N_FEATURES = 164


def program_rows(features) -> np.ndarray:
    """A program's feature rows; a program without stores gets one zero row so it still gets a score."""
    f = np.asarray(features.leaf_features, dtype=np.float32)
    return f if len(f) else np.zeros((1, f.shape[1] if f.ndim == 2 else N_FEATURES), np.float32)


def deadline_callback(deadline: float):
    """An XGBoost callback that stops boosting at a wall-clock deadline (keeps the trees so far)."""
    from xgboost.callback import TrainingCallback

    class _Deadline(TrainingCallback):
        def after_iteration(self, model, epoch, evals_log) -> bool:
            return time.monotonic() > deadline

    return _Deadline()


def pooled_features(programs: Sequence) -> np.ndarray:
    """Per program: sum, max and log-sum-exp of its leaf rows, leaf count and log2 FLOPs (device-free).
    All programs at once (one array of every row, reduced per program): a cost model pools thousands."""
    if not len(programs):
        return np.zeros((0, 3 * N_FEATURES + 2), np.float32)
    rows = [program_rows(p.features) for p in programs]
    counts = np.array([len(r) for r in rows])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    flat = np.concatenate(rows).astype(np.float64)
    m = np.maximum.reduceat(flat, starts, axis=0)
    lse = m + np.log(np.add.reduceat(np.exp(flat - np.repeat(m, counts, axis=0)), starts, axis=0))
    flops = np.log2(np.array([p.features.flops for p in programs], dtype=np.float64) + 1.0)
    return np.hstack([np.add.reduceat(flat, starts, axis=0), m, lse, counts[:, None], flops[:, None]]).astype(np.float32)
