"""Metric math, by hand."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from cdmpp.evaluation import metrics as ev


def test_regression_metrics_by_hand():
    m = ev.regression_metrics([1.0, 2.0, 4.0], [1.05, 1.0, 5.0])  # relative errors 5 %, 50 %, 25 %
    assert m["mape"] == pytest.approx((0.05 + 0.5 + 0.25) / 3)
    assert m["rmse"] == pytest.approx(math.sqrt((0.05**2 + 1 + 1) / 3))
    assert m["within_10"] == pytest.approx(1 / 3)
    assert m["within_25"] == pytest.approx(2 / 3)


def test_top_k_score_by_hand():
    y = [3.0, 1.0, 2.0, 5.0]
    key = [0.0, 3.0, 1.0, 2.0]  # predicted order: program 0 (3 s), 2 (2 s), 3 (5 s), 1 (1 s)
    assert ev.top_k_score(y, key, 1) == pytest.approx(3.0)
    assert ev.top_k_score(y, key, 2) == pytest.approx(2.0)
    assert ev.top_k_score(y, key, 4) == pytest.approx(1.0)
    assert ev.top_k_score(y, y, 1) == 1.0  # a perfect ranking finds the best program


def test_ranking_metrics_by_hand():
    # task a: y = 1,2,3,4 ranked 1,3,2,4: one swapped pair -> rho = 1 - 6*2/(4*15) = 0.8, tau = (5-1)/6
    # task b: 2 programs (< 3): ignored; task c: constant predictions -> no information -> 0
    y = [1, 2, 3, 4, 1, 2, 1, 2, 3]
    key = [1, 3, 2, 4, 2, 1, 7, 7, 7]
    tasks = ["a"] * 4 + ["b"] * 2 + ["c"] * 3
    m = ev.ranking_metrics(y, key, tasks)
    assert m["n_tasks"] == 2
    assert m["spearman"] == pytest.approx((0.8 + 0.0) / 2)
    assert m["kendall"] == pytest.approx((4 / 6 + 0.0) / 2)
    # top-1: a picks y=1 (1.0); c's ties resolve by position -> y=1 (1.0). top-5: no task has > 5 programs
    assert m["top1"] == pytest.approx(1.0) and m["top1_tasks"] == 2
    assert math.isnan(m["top5"]) and m["top5_tasks"] == 0
    reversed_ = ev.ranking_metrics([1, 2, 3, 4], [4, 3, 2, 1], ["t"] * 4)
    assert reversed_["spearman"] == pytest.approx(-1.0) and reversed_["top1"] == pytest.approx(4.0)


def test_evaluate_with_intervals_and_scores():
    y = [1.0, 2.0, 4.0]
    m = ev.evaluate(y, ["t"] * 3, predicted=[1.0, 2.0, 4.0], lo=[0.5, 2.5, 3.0], hi=[1.5, 3.0, 5.0])
    assert m["mape"] == 0 and m["spearman"] == pytest.approx(1.0) and m["coverage90"] == pytest.approx(2 / 3)
    ranked_only = ev.evaluate(y, ["t"] * 3, rank_key=[-3.0, -2.0, -1.0])  # scores: higher = faster
    assert "mape" not in ranked_only and ranked_only["spearman"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        ev.evaluate(y, ["t"] * 3, predicted=[1.0, np.nan, 2.0])


def test_noise_floor(tmp_path):
    assert ev.noise_floor(str(tmp_path)) is None
    runs = [{"median_rel_diff": 0.2, "p90_rel_diff": 0.5}, {"median_rel_diff": 0.05, "p90_rel_diff": 0.12}]
    (tmp_path / "noise-dev.json").write_text(json.dumps(runs))
    floor = ev.noise_floor(str(tmp_path))
    assert floor["median_rel_diff"] == 0.05 and floor["p90_rel_diff"] == 0.12  # the last run counts
    assert "5.0 %" in ev.markdown_table([{"method": "m", "metrics": {"mape": 0.1}}], floor)
    assert "not measured yet" in ev.markdown_table([{"method": "m", "metrics": {"mape": 0.1}}], None)
    runs.append({"median_rel_diff": 0.02, "p90_rel_diff": 0.2, "first_pass_median_rel_diff": 0.03,
                 "first_pass_p90_rel_diff": 0.3, "same_passes_median_rel_diff": 0.01, "same_passes_p90_rel_diff": 0.08})
    (tmp_path / "noise-dev.json").write_text(json.dumps(runs))
    floor = ev.noise_floor(str(tmp_path))
    line = ev.noise_line(floor)
    # the table prints the like-for-like figure, not the single check's (which shows its own slow spells)
    assert "1.0 %" in ev.markdown_table([{"method": "m", "metrics": {"mape": 0.1}}], floor)
    assert "single-pass labels 3.0 % / 30.0 %" in line and "like for like" in line and "1.0 % / 8.0 %" in line


def test_mape_capped_limits_each_error_to_100_percent():
    m = ev.regression_metrics([1.0, 1.0], [1.5, 101.0])  # 50 % and 10,000 %
    assert m["mape_capped"] == pytest.approx(0.75) and m["mape"] == pytest.approx(50.25)


def test_within_task_spearman_matches_scipy_per_task_with_ties_and_constant_tasks():
    from scipy import stats

    rng = np.random.default_rng(0)
    tasks = rng.integers(0, 60, 600).astype(str)
    y = rng.integers(0, 6, 600).astype(float)  # many ties
    key = np.round(rng.normal(size=600), 1)
    key[tasks == "7"] = 1.0  # a constant prediction: undefined, counts 0
    y[tasks == "8"] = 2.0  # a constant latency: the same
    expected = []
    for t in np.unique(tasks):
        i = tasks == t
        if i.sum() >= 3:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the constant tasks
                r = stats.spearmanr(key[i], y[i]).statistic
            expected.append(r if np.isfinite(r) else 0.0)
    assert ev.within_task_spearman(y, key, tasks) == pytest.approx(np.mean(expected), abs=1e-12)
    assert math.isnan(ev.within_task_spearman([1.0, 2.0], [1.0, 2.0], ["a", "a"]))


def test_fast_share_mape_by_hand():
    """Each task's fastest tenth (at least one program): task a's fastest is off by 50 %, task b's by 0."""
    from cdmpp.evaluation.metrics import evaluate, fast_share_mape

    seconds = [1.0, 2.0, 3.0, 10.0, 20.0]
    predicted = [1.5, 2.0, 9.0, 10.0, 99.0]
    tasks = ["a", "a", "a", "b", "b"]
    assert fast_share_mape(seconds, predicted, tasks) == 0.25
    assert fast_share_mape(seconds, predicted, tasks, share=1.0) == (0.5 + 0 + 2 + 0 + 3.95) / 5
    assert evaluate(seconds, tasks, predicted)["mape_fast10"] == 0.25
