"""The learning curve (``cdmpp learning-curve``): the protocol's random-new and cross-model settings
trained on shares of each seed's training programs, on the same validation and test sets."""

from __future__ import annotations

import json
import math

import pytest

from tests.data import DEVICES_JSON, LIMIT, TASKS


def _ids(programs):
    return {p.record_id for p in programs}


@pytest.mark.parametrize("setting", ["random-new", "cross-model"])
def test_fractions_shrink_training_only_and_nest(real, setting):
    from cdmpp.evaluation.protocol import setting_splits

    parts = setting_splits(real[1], setting, 0, (0.25, 0.5, 1))
    assert [f for f, _ in parts] == [0.25, 0.5, 1]
    (_, quarter), (_, half), (_, full) = parts
    assert _ids(quarter.train) < _ids(half.train) < _ids(full.train)  # nested, strictly smaller
    assert len(quarter.train) == round(0.25 * len(full.train)) and quarter.info["n_train"] == len(quarter.train)
    assert _ids(quarter.test) == _ids(half.test) == _ids(full.test) and full.test
    assert _ids(quarter.val) == _ids(full.val)
    assert [u.features.program_hash for u in quarter.target_pool] == [u.features.program_hash for u in full.target_pool]
    (none, whole), = setting_splits(real[1], setting, 0)  # the protocol's own split: no fraction
    assert none is None and _ids(whole.train) == _ids(full.train) and "train_fraction" not in whole.info


def _row(setting, method, seed, mape, n_train, fraction=None, programs=50):
    r = dict(seed=seed, setting=setting, method=method, k=None, programs=programs, n_train=n_train,
             train_seconds=1.0, metrics=dict(mape=mape, median_ape=mape / 2, spearman=0.5))
    if fraction is not None:
        r["train_fraction"] = fraction
    return r


def test_curve_aggregation_and_no_leak_into_the_summary(tmp_path):
    """Curve rows (with a fraction) make the curve, the others the summary; the per-doubling factor is
    the MAPE ratio per doubling of n_train, per seed, mean ± std."""
    from cdmpp.evaluation.summary import aggregate, aggregate_curve, curve_markdown

    runs = tmp_path / "runs.jsonl"
    rows = [_row("random-new", "cdmpp", 0, 0.40, 1000)]  # a protocol row: summary only
    for seed, rate in ((0, 0.9), (1, 0.7)):
        for fraction in (0.125, 0.25, 0.5, 1):
            n = round(800 * fraction) + 2 * seed
            rows.append(_row("random-new", "cdmpp", seed, 0.5 * rate ** math.log2(n / 100), n, fraction))
            rows.append(_row("cross-model", "pooled GBT", seed, 0.6, n, fraction))
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))

    summary = aggregate(str(runs), "cmd")
    assert summary["random-new"]["cdmpp"]["mape"] == 0.40 and summary["random-new"]["cdmpp"]["seeds"] == 1
    assert "cross-model" not in summary

    curve = aggregate_curve(str(runs), "cdmpp learning-curve")
    assert curve["command"] == "cdmpp learning-curve" and curve["fractions"] == [0.125, 0.25, 0.5, 1]
    points = curve["random-new"]["cdmpp"]["points"]
    assert [p["fraction"] for p in points] == [0.125, 0.25, 0.5, 1]
    assert [p["n_train"] for p in points] == [101, 201, 401, 801]  # mean over seeds (seed 1 has 2 more)
    assert all(p["seeds"] == 2 and p["n_test"] == 50 for p in points)
    first = [r["metrics"]["mape"] for r in rows if r.get("train_fraction") == 0.125 and r["method"] == "cdmpp"]
    assert points[0]["mape"] == pytest.approx(sum(first) / 2) and points[0]["mape_std"] > 0
    assert {"median_ape", "median_ape_std", "spearman", "spearman_std"} <= set(points[0])
    cdmpp = curve["random-new"]["cdmpp"]
    assert cdmpp["mape_per_doubling"] == pytest.approx(0.8, abs=2e-3)  # mean of 0.9 and 0.7
    assert cdmpp["mape_per_doubling_std"] == pytest.approx(0.1, abs=2e-3)
    assert curve["cross-model"]["pooled GBT"]["mape_per_doubling"] == pytest.approx(1.0)
    md = curve_markdown(curve)
    assert "| cdmpp | 0.125 | 101 | 50 |" in md and "cdmpp 0.800 ± 0.100" in md


@pytest.mark.slow
def test_learning_curve_cli_end_to_end(real, tiny_recipe, tmp_path, monkeypatch):
    """MECHANICS (tiny recipe, 3 s of training): one seed, two fractions, cdmpp and the pooled GBT."""
    from cdmpp.cli import main
    from cdmpp.evaluation.summary import aggregate

    runs, out = tmp_path / "lc-runs.jsonl", tmp_path / "lc.json"
    argv = ["learning-curve", "--dataset", str(real[0]), "--task-table", str(TASKS), "--devices", str(DEVICES_JSON),
            "--limit", str(LIMIT), "--seeds", "0", "--train-fractions", "0.25,1", "--recipe", tiny_recipe,
            "--minutes", "0.05", "--runs", str(runs), "--out", str(out)]
    monkeypatch.setattr("sys.argv", ["cdmpp", *argv])  # the stored command is read from sys.argv, as run from a shell
    assert main(argv) == 0
    rows = [json.loads(line) for line in runs.read_text().splitlines()]
    assert rows and all(r["train_fraction"] in (0.25, 1) for r in rows)
    for setting in ("random-new", "cross-model"):
        mine = {(r["method"], r["train_fraction"]): r for r in rows if r["setting"] == setting}
        assert {("cdmpp", 0.25), ("cdmpp", 1), ("pooled GBT", 0.25), ("pooled GBT", 1)} <= set(mine)
        assert mine[("cdmpp", 0.25)]["n_train"] < mine[("cdmpp", 1)]["n_train"]
        assert mine[("cdmpp", 0.25)]["programs"] == mine[("cdmpp", 1)]["programs"]  # one test set per seed
    curve = json.loads(out.read_text())
    assert curve["command"].startswith("cdmpp learning-curve") and curve["fractions"] == [0.25, 1]
    for setting in ("random-new", "cross-model"):
        for method in ("cdmpp", "pooled GBT"):
            e = curve[setting][method]
            assert [p["fraction"] for p in e["points"]] == [0.25, 1] and e["points"][0]["mape"] > 0
            assert e["points"][0]["n_train"] < e["points"][1]["n_train"] and "mape_per_doubling" in e
    assert "cross-device-new" not in curve and (tmp_path / "lc.md").exists()
    assert set(aggregate(str(runs), "cmd")) == {"command", "created"}  # curve rows never reach the summary
    assert main(["learning-curve", "--settings", "cross-device-new", "--runs", str(runs), "--out", ""]) == 2
