"""``cdmpp eval`` end to end, and its shared time budget."""

from __future__ import annotations

import json

import pytest

from tests.data import FAKE_DEVICE, LIMIT, ROOT, TASKS


@pytest.mark.slow
def test_cdmpp_eval_cli_writes_both_reports(real, held, tiny_recipe, tmp_path):
    from cdmpp.cli import main

    rc = main(["eval", "--name", "tiny", "--split", "cross-model", "--limit", str(LIMIT), "--minutes-per-method", "0.15",
               "--recipe", tiny_recipe, "--peers", "xgb", "--ablations", "no-da", "--reports-dir", str(tmp_path),
               "--held-out", ",".join(held), "--dataset", str(real[0]), "--task-table", str(TASKS), "--devices", str(ROOT / "datasets" / "devices.json")])
    assert rc == 0
    report = json.loads((tmp_path / "tiny.json").read_text())
    md = (tmp_path / "tiny.md").read_text()
    methods = [r["method"] for r in report["methods"]]
    assert methods == ["cdmpp", "cdmpp no-da", "xgb (TVM XGBModel, ranking)", "xgb-regressor (TVM features + device specs)"]
    assert report["split"]["kind"] == "cross-model" and report["split"]["n_test"] > 0
    assert report["methods"][0]["metrics"]["mape"] >= 0 and report["methods"][0]["predict_per_s"] > 0
    # the recipe adapts only towards a new device (da_when): held-out networks on known devices are not one
    assert all("no domain adaptation" in r["note"] for r in report["methods"][:2])
    assert "| cdmpp |" in md and "noise floor" in md
    assert report["minutes_per_method"] == 0.15 and "up to 0.15 min per trained model" in md


def test_budget_shared_or_per_method():
    """A shared clock hands out time by weight and shrinks as jobs take theirs; a fixed one gives each the same."""
    import time

    from cdmpp.evaluation.harness import _Clock

    shared = _Clock(time.monotonic() + 100, pending=2.0, reserve=0.0)
    first = shared.share(1.0)
    assert 45 < first <= 50 and shared.pending == 1.0
    assert 90 < shared.share(1.0) <= 100  # the last job gets all that is left
    fixed = _Clock(time.monotonic() + 100, pending=2.0, fixed=30.0)
    assert fixed.share(1.0) == fixed.share(0.3) == 30.0


@pytest.mark.slow
def test_cross_device_eval_mechanics(two_devices, tiny_recipe, tmp_path):
    """MECHANICS ONLY (relabeled fake device): zero-shot and k-shot rows for cdmpp, random shots, a peer."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.harness import EvalOptions, run_eval

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    real_dev = next(iter({p.device for p in two_devices.programs} - {FAKE_DEVICE}))
    table[FAKE_DEVICE] = {**table[real_dev], "cores": 1, "simd_width_bits": 256}
    opts = EvalOptions("xdev", split="cross-device", target_device=FAKE_DEVICE, ks=(0, 4), recipe=tiny_recipe,
                       peers=("xgb",), ablations=("random-sampler",), max_minutes=0.3, reports_dir=str(tmp_path),
                       device_table=table)
    report = run_eval(opts, ds=two_devices)
    rows = {r["method"]: r for r in report["methods"]}
    assert {"cdmpp k=0 (zero-shot)", "cdmpp k=4 (kmeans shots)", "cdmpp k=4 (random shots)"} <= set(rows)
    # shots come from the target's non-test half: every k is scored on the same test programs
    assert rows["cdmpp k=4 (kmeans shots)"]["metrics"]["n"] == rows["cdmpp k=0 (zero-shot)"]["metrics"]["n"]
    assert (tmp_path / "xdev.md").exists()
