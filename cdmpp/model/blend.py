"""Geometric blend of two latency predictors (the transformer and the pooled GBT, ``TrainConfig.gbt_blend``).

Their errors differ: the transformer, trained on the MAPE itself, keeps away from large
over-predictions; the trees rank the programs of one task better. A weighted mean of their log
predictions, its weight chosen on validation data, keeps some of both. Validation MAPE is flat near
its minimum while within-task ranking is not, so with ``rank_slack`` the weight is the best-ranking
one among those whose MAPE is within that relative slack of the lowest. A compiler's search uses the
ranking, a user the latency: a trained model keeps one weight for each (``TrainedModel.predict(order=...)``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from cdmpp.ranking import within_task_spearman

WEIGHTS = np.linspace(0.0, 1.0, 11)
RANKED = 3  # programs a task needs for within_task_spearman to rank it (its min_group)


def blend(a: np.ndarray, b: np.ndarray, w: float) -> np.ndarray:
    """exp(w log a + (1 - w) log b)."""
    return np.exp(w * np.log(a) + (1.0 - w) * np.log(b))


def ranked_tasks(tasks: Sequence) -> int:
    """How many tasks hold enough programs for ``within_task_spearman`` to rank them: the evidence behind
    an order weight."""
    counts: dict = {}
    for t in tasks:
        counts[t] = counts.get(t, 0) + 1
    return sum(n >= RANKED for n in counts.values())


def blend_weight(seconds: np.ndarray, a: np.ndarray, b: np.ndarray, tasks: Sequence[str] | None = None,
                 rank_slack: float = 0.0) -> float:
    """The weight w in [0, 1] (step 0.1) of ``blend(a, b, w)``: the lowest MAPE against ``seconds``, or,
    given ``tasks`` and ``rank_slack`` > 0, the highest mean within-task Spearman among the weights whose
    MAPE is at most (1 + rank_slack) x the lowest."""
    y = np.asarray(seconds, dtype=np.float64)
    mape = np.array([np.mean(np.abs(blend(a, b, w) - y) / y) for w in WEIGHTS])
    best = int(np.argmin(mape))
    if tasks is None or rank_slack <= 0:
        return float(WEIGHTS[best])
    near = [i for i in range(len(WEIGHTS)) if mape[i] <= (1.0 + rank_slack) * mape[best]]
    rho = {i: within_task_spearman(y, blend(a, b, WEIGHTS[i]), tasks) for i in near}
    rho = {i: r if np.isfinite(r) else -np.inf for i, r in rho.items()}
    return float(WEIGHTS[max(near, key=lambda i: (rho[i], -mape[i]))])
