import numpy as np

from cdmpp.evaluation.metrics import ranking_metrics
from cdmpp.model.blend import WEIGHTS, blend, blend_weight


def _two_predictors(seed=0):
    """SYNTHETIC: ``a`` is right on average but orders each task's programs by noise; ``b`` orders them
    perfectly but is 40 % high."""
    rng = np.random.default_rng(seed)
    tasks = np.repeat([f"t{i}" for i in range(20)], 15)
    y = np.exp(rng.normal(-8, 1, len(tasks)))
    a = y * np.exp(rng.normal(0, 0.35, len(tasks)))
    b = 1.4 * y
    return y, a, b, tasks


def _mape(p, y):
    return float(np.mean(np.abs(p - y) / y))


def test_without_slack_the_weight_has_the_lowest_mape_on_the_grid():
    y, a, b, tasks = _two_predictors()
    w = blend_weight(y, a, b, tasks)
    assert min(_mape(blend(a, b, v), y) for v in WEIGHTS) == _mape(blend(a, b, w), y)


def test_with_slack_the_weight_ranks_better_within_the_mape_bound():
    y, a, b, tasks = _two_predictors()
    w0, w = blend_weight(y, a, b, tasks), blend_weight(y, a, b, tasks, rank_slack=0.05)
    rho = lambda v: ranking_metrics(y, blend(a, b, v), tasks)["spearman"]  # noqa: E731
    assert w < w0  # toward b, the better-ranking part
    assert rho(w) > rho(w0)
    assert _mape(blend(a, b, w), y) <= 1.05 * _mape(blend(a, b, w0), y)
    assert rho(w) == max(rho(v) for v in WEIGHTS if _mape(blend(a, b, v), y) <= 1.05 * _mape(blend(a, b, w0), y))
