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
    """Per program: sum, max and log-sum-exp of its leaf rows, leaf count and log2 FLOPs (device-free)."""
    out = []
    for p in programs:
        r = program_rows(p.features).astype(np.float64)
        m = r.max(axis=0)
        lse = m + np.log(np.exp(r - m).sum(axis=0))
        out.append(np.concatenate([r.sum(axis=0), m, lse, [len(r), np.log2(p.features.flops + 1.0)]]))
    return np.asarray(out, dtype=np.float32)
