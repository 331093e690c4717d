"""Geometric blend of two latency predictors (the transformer and the pooled GBT, ``TrainConfig.gbt_blend``).

Their errors differ: the transformer, trained on the MAPE itself, keeps away from large
over-predictions; the trees rank the programs of one task better. A weighted mean of their log
predictions, its weight chosen on validation data, keeps some of both.
"""

from __future__ import annotations

import numpy as np


def blend(a: np.ndarray, b: np.ndarray, w: float) -> np.ndarray:
    """exp(w log a + (1 - w) log b)."""
    return np.exp(w * np.log(a) + (1.0 - w) * np.log(b))


def blend_weight(seconds: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """The weight w in [0, 1] (step 0.1) of ``blend(a, b, w)`` with the lowest MAPE against ``seconds``."""
    y = np.asarray(seconds, dtype=np.float64)
    grid = np.linspace(0.0, 1.0, 11)
    return float(grid[int(np.argmin([np.mean(np.abs(blend(a, b, w) - y) / y) for w in grid]))])
