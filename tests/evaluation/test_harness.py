"""``cdmpp eval``: one setting of the protocol for one seed, through the protocol's runner, as one report."""

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
    rows = report["cross-model"]
    assert {"cdmpp", "cdmpp no-da", "pooled GBT", "TVM XGBModel (ranking only)",
            "XGBoost regressor (TVM features + device specs)"} <= set(rows)
    assert rows["cdmpp"]["mape"] >= 0 and rows["cdmpp"]["seeds"] == 1
    assert "mape" not in rows["TVM XGBModel (ranking only)"] and "spearman" in rows["TVM XGBModel (ranking only)"]
    assert "| cdmpp |" in md and "noise floor" in md
    assert report["options"]["minutes_per_method"] == 0.15
    assert (tmp_path / "tiny-runs.jsonl").exists()


def test_eval_options_map_onto_the_protocol():
    """The eval's options are protocol options: the split's setting, the peers by registry name (xgb brings the
    regressor), one cdmpp row per trained ablation, random shots beside KMeans for random-sampler."""
    from cdmpp.evaluation.harness import EvalOptions, protocol_runs

    base, no_pe = protocol_runs(EvalOptions("x", split="cross-device", target_device="d", ks=(0, 8), peers=("xgb",),
                                            ablations=("no-pe", "random-sampler"), minutes_per_method=3.0))
    assert base.settings == ("cross-device-new",) and base.ks == ("0", "8") and base.samplers == ("kmeans", "random")
    assert base.methods == ("cdmpp", "pooled-gbt", "xgb", "xgb-regressor") and base.minutes == base.peer_minutes == 3.0
    assert no_pe.methods == ("cdmpp",) and no_pe.label == "cdmpp no-pe" and no_pe.overrides == {"use_pe": False}
    assert no_pe.runs == base.runs
    with pytest.raises(ValueError, match="target-device"):
        protocol_runs(EvalOptions("x", split="cross-device"))


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
    rows = report["cross-device-new"]
    assert {"cdmpp", "cdmpp k=4 (kmeans)", "cdmpp k=4 (random)", "pooled GBT k=4 (kmeans)"} <= set(rows)
    # shots come from the target's non-test half: every k is scored on the same test programs
    assert rows["cdmpp k=4 (kmeans)"]["programs"] == rows["cdmpp"]["programs"]
    assert (tmp_path / "xdev.md").exists()
