"""One seed of the evaluation protocol."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tests.data import FAKE_DEVICE, ROOT


@pytest.mark.slow
def test_protocol_seed_writes_a_row_per_setting_and_method(two_devices, tiny_recipe, tmp_path):
    """MECHANICS ONLY (relabeled fake device): one seed of the protocol writes cdmpp, the pooled GBT
    and the twin rows for every setting asked for; with shots, cdmpp's row is the shipped k-shot path
    (``ShotChoice``, which the row names), beside the fine-tune and the shots-only GBT."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.protocol import ProtocolOptions, run_seed

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    real_dev = next(iter({p.device for p in two_devices.programs} - {FAKE_DEVICE}))
    table[FAKE_DEVICE] = {**table[real_dev], "cores": 1, "simd_width_bits": 256}
    runs = tmp_path / "runs.jsonl"
    opts = ProtocolOptions(target_device=FAKE_DEVICE, settings=("random-new", "cross-device-seen"), ks=("0", "8"),
                           samplers=("kmeans",), methods=("cdmpp", "pooled-gbt", "cdmpp-finetune"),
                           recipe=tiny_recipe, minutes=0.05, runs=str(runs))
    run_seed(opts, 0, ds=two_devices, device_table=table)
    assert not list((tmp_path / "runs.states").glob("*.pt"))  # cdmpp's saved runs went with their rows
    by = {(r["setting"], r["method"]): r for r in map(json.loads, runs.read_text().splitlines())}
    assert {("random-new", "cdmpp"), ("random-new", "pooled GBT"),
            ("cross-device-seen", "cdmpp k=8 (kmeans)"), ("cross-device-seen", "twin-ratio k=8 (kmeans)"),
            ("cross-device-seen", "cdmpp + twin k=8 (kmeans)"), ("cross-device-seen", "twin-Amdahl k=8 (kmeans)"),
            ("cross-device-seen", "cdmpp, fine-tune k=8 (kmeans)"), ("cross-device-seen", "shots-only GBT k=8 (kmeans)")} <= set(by)
    assert by[("cross-device-seen", "cdmpp k=8 (kmeans)")]["choice"]  # what ShotChoice kept, and its cross-validation
    assert "choice" not in by[("cross-device-seen", "cdmpp, fine-tune k=8 (kmeans)")]


@pytest.mark.slow
def test_protocol_seed_mechanics_with_every_peer(two_devices, tiny_recipe, tmp_path):
    """MECHANICS ONLY (relabeled fake device): one protocol seed writes rows for cdmpp, the pooled GBT,
    TVM's XGBModel (ranking metrics only), the Tenset MLP and the twin-based predictors."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation import protocol as P

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    real_dev = next(iter({p.device for p in two_devices.programs} - {FAKE_DEVICE}))
    table[FAKE_DEVICE] = {**table[real_dev], "cores": 1, "threads": 1}
    runs = tmp_path / "runs.jsonl"
    opts = P.ProtocolOptions(settings=("random-new", "cross-device-seen"), ks=("0", "8"), samplers=("random",),
                             methods=("cdmpp", "pooled-gbt", "xgb", "mlp"), recipe=tiny_recipe, minutes=0.2,
                             peer_minutes=0.1, runs=str(runs), target_device=FAKE_DEVICE)
    P.run_seed(opts, 0, two_devices, table)
    rows = [json.loads(line) for line in runs.read_text().splitlines()]
    by = {(r["setting"], r["method"]): r["metrics"] for r in rows}
    assert {"cdmpp", "pooled GBT", "Tenset MLP", "TVM XGBModel (ranking only)"} <= {m for s, m in by if s == "random-new"}
    xgb = by[("random-new", "TVM XGBModel (ranking only)")]
    assert "mape" not in xgb and "spearman" in xgb
    seen = {m for s, m in by if s == "cross-device-seen"}
    assert {"twin-ratio k=8 (random)", "Tenset MLP k=8 (random)", "TVM XGBModel (ranking only)"} <= seen
    assert "TVM XGBModel (ranking only) k=8 (random)" not in seen


def test_a_split_names_its_saved_training_run_and_is_skipped_once_scored(tmp_path):
    """``Resumable``: cdmpp's training of one split of one seed is saved under the runs file's ``.states``
    folder, named by the split and the row name (a rerun of the same command finds it); once the split's rows
    are written, ``finish`` removes it and marks the split done, so the same command started again skips it while
    other options (another recipe, other shot counts, another seed or chip) do not, and the same data read through a
    link is the same data. Peers without ``resume`` are left alone."""
    from cdmpp.evaluation.protocol import ProtocolOptions, Resumable

    class Method:
        label, resume = "cdmpp, no DA", None

    opts, method, peer = ProtocolOptions(runs=str(tmp_path / "r.jsonl")), Method(), object()
    resume = Resumable(opts, 2, "chip", "amd-epyc-znver5")
    resume(method)
    resume(peer)
    saved = tmp_path / "r.states" / "chip-amd-epyc-znver5-seed2-cdmpp_no_DA.pt"
    assert method.resume == str(saved) and Resumable(opts, 2, "random-new", None).prefix == "random-new-seed2"
    saved.parent.mkdir()
    for end in ("", ".run1", ".run1.no-da.tmp"):  # fit's files: a run, an ensemble's second run, its fallback
        saved.with_name(saved.name + end).touch()
    assert not resume.done()
    resume.finish()
    assert not list(saved.parent.glob(saved.name + "*"))
    again = dataclasses.replace(opts, threads=2, seeds=(2,), chips=("amd-epyc-znver5",))  # the pace, not the rows
    assert Resumable(again, 2, "chip", "amd-epyc-znver5").done()
    link = tmp_path / "linked-datasets"  # the same data reached through a link (another checkout's copy of the code)
    link.symlink_to(os.path.dirname(os.path.abspath(opts.dataset)))
    linked = dataclasses.replace(opts, dataset=str(link / os.path.basename(opts.dataset)))
    assert Resumable(linked, 2, "chip", "amd-epyc-znver5").done()
    assert not Resumable(dataclasses.replace(opts, recipe="ablation-no-counts"), 2, "chip", "amd-epyc-znver5").done()
    assert not Resumable(dataclasses.replace(opts, chip_ks=("0",)), 2, "chip", "amd-epyc-znver5").done()
    assert not Resumable(opts, 3, "chip", "amd-epyc-znver5").done()
    assert not Resumable(opts, 2, "chip", "amd-epyc-znver3").done()
    seen = Resumable(opts, 2, "cross-device", settings=["cross-device-new"])
    seen.finish()
    assert Resumable(opts, 2, "cross-device", settings=["cross-device-new"]).done()
    assert not Resumable(opts, 2, "cross-device", settings=["cross-device-new", "cross-device-seen"]).done()


def test_a_failed_job_stops_the_queued_and_running_ones():
    """`cdmpp protocol --jobs N` must stop when one job fails or the command is stopped, not run every queued job
    to its end first (``time.sleep(-1)`` fails at once; the others would sleep a minute each)."""
    import time

    from cdmpp.evaluation.protocol import run_in_processes

    t = time.monotonic()
    with pytest.raises(ValueError, match="non-negative"):
        run_in_processes(time.sleep, [(-1,), (60,), (60,), (60,)], jobs=2)
    assert time.monotonic() - t < 30


def test_the_gbt_peers_blend_and_the_paper_setting_write_their_rows(real, tmp_path):
    """The latency and MAPE-loss GBTs blended with a weight chosen on validation are one more peer (issue 55
    item 3), in every within-device setting, the paper's protocol included (on the sample, tasks of >= 48
    programs: none, so its split is refused with the reason)."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation import protocol as P

    folder, ds = real
    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    runs = tmp_path / "runs.jsonl"
    opts = P.ProtocolOptions(dataset=str(folder), settings=("random-new",), methods=("gbt-blend",), runs=str(runs),
                             device_ids=sorted({p.device for p in ds.programs}))
    P.run_seed(opts, 0, ds, table)
    rows = {r["method"]: r for r in map(json.loads, runs.read_text().splitlines())}
    assert {"pooled GBT, latency target", "pooled GBT, MAPE loss", P.GBT_BLEND} <= set(rows)
    assert 0.0 <= rows[P.GBT_BLEND]["weight"] <= 1.0 and rows[P.GBT_BLEND]["metrics"]["mape"] > 0
    with pytest.raises(ValueError, match="no task has 48 programs"):
        P.run_seed(P.ProtocolOptions(**{**opts.__dict__, "settings": ("paper",)}), 0, ds, table)
