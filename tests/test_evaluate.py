"""Evaluation protocol: metric math, leak-free splits, k-shot selection, peers, and `cdmpp eval` end to end.

Metric tests use hand-computed numbers. Split, peer and end-to-end tests use the first records of a
real dataset: ``$CDMPP_TEST_DATASET``, else ``datasets/measurements``, else any other folder under
``datasets/`` with enough records (skipped when there is none). Cross-device needs two devices; until a
second device has data, the tests RELABEL some real programs to a made-up device
(``FAKE_DEVICE``) — a mechanics test of the code path, not a measurement of transfer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import torch

from cdmpp import evaluate as ev
from cdmpp import splits

torch.set_num_threads(1)  # 2 threads on the shared 2-core machine: up to 100x slower small steps

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "datasets" / "tasks-llvm.json.gz"
FAKE_DEVICE = "fake-relabeled-1t/llvm-avx2"  # NOT a real device: relabeled real programs (mechanics only)
LIMIT = 240


# ---- metric math on hand-computed examples -----------------------------------------------------------

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
    line = ev._noise_line(floor)
    # the table prints the like-for-like figure, not the single check's (which shows its own slow spells)
    assert "1.0 %" in ev.markdown_table([{"method": "m", "metrics": {"mape": 0.1}}], floor)
    assert "single-pass labels 3.0 % / 30.0 %" in line and "like for like" in line and "1.0 % / 8.0 %" in line


# ---- splits on real programs ------------------------------------------------------------------------

def _candidate_dirs() -> list[Path]:
    if os.environ.get("CDMPP_TEST_DATASET"):
        return [Path(os.environ["CDMPP_TEST_DATASET"])]
    others = sorted(p for p in (ROOT / "datasets").glob("*") if p.is_dir() and p.name != "measurements")
    return [ROOT / "datasets" / "measurements", *others]


@pytest.fixture(scope="module")
def real():
    """(dataset folder, its first LIMIT programs)."""
    if not TASKS.exists():
        pytest.skip("no task table")
    from cdmpp.data import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    table = TaskTable.load(str(TASKS))
    for folder in _candidate_dirs():
        if folder.is_dir() and any(folder.glob("*.jsonl")):
            ds = load_dataset(str(folder), table, limit=LIMIT, progress=False)
            if len(ds) >= 100 and len(ds.networks()) >= 3:
                return folder, ds
    pytest.skip(f"no dataset with >= 100 records among {[str(d) for d in _candidate_dirs()]}")


@pytest.fixture(scope="module")
def held(real):
    """The two networks with the fewest programs in the subset: held out for the cross-model tests."""
    counts = Counter(n for p in real[1].programs for n in {o.split("@")[0] for o in p.networks})
    return tuple(sorted(counts, key=lambda n: (counts[n], n))[:2])


@pytest.fixture(scope="module")
def two_devices(real):
    """MECHANICS ONLY: every third real program copied onto FAKE_DEVICE (same latency) as a second device."""
    from cdmpp.data import Dataset

    real = real[1]
    fake = [dataclasses.replace(p, device=FAKE_DEVICE, record_id=p.record_id.replace(p.device, FAKE_DEVICE))
            for p in real.programs[::3]]
    return Dataset(list(real.programs) + fake)


def _ids(programs):
    return {p.record_id for p in programs}


def test_random_split_is_disjoint_deterministic_and_complete(real):
    real = real[1]
    a, b = splits.random_split(real, seed=0), splits.random_split(real, seed=0)
    assert _ids(a.test) == _ids(b.test) and _ids(a.val) == _ids(b.val)
    assert set(a.overlaps().values()) == {0}
    assert _ids(a.train) | _ids(a.val) | _ids(a.test) == _ids(real.programs)
    assert len(a.test) == pytest.approx(0.2 * len(real), abs=3)
    assert _ids(splits.random_split(real, seed=1).test) != _ids(a.test)


def test_train_fraction_shrinks_only_training(real):
    full = splits.random_split(real[1], seed=0)
    half = splits.subsample_train(splits.random_split(real[1], seed=0), 0.5)
    assert _ids(half.train) < _ids(full.train)
    assert len(half.train) == round(0.5 * len(full.train)) and half.info["n_train"] == len(half.train)
    assert _ids(half.test) == _ids(full.test) and _ids(half.val) == _ids(full.val)
    again = splits.subsample_train(splits.random_split(real[1], seed=0), 0.5)
    assert _ids(again.train) == _ids(half.train)
    with pytest.raises(ValueError, match="train fraction"):
        splits.subsample_train(full, 0)


def test_cross_model_split_keeps_held_out_tasks_out_of_training(real, held):
    real = real[1]
    sp = splits.cross_model_split(real, held)
    nets = lambda p: {o.split("@")[0] for o in p.networks}  # noqa: E731
    test_tasks = {p.task for p in sp.test}
    assert sp.test and sp.train and sp.val
    assert not test_tasks & {p.task for p in sp.train + sp.val}  # no test task in train or val
    assert not {p.task for p in sp.train} & {p.task for p in sp.val}  # val is carved by task
    assert all(nets(p) & set(held) for p in sp.test)
    assert all(not nets(p) & set(held) for p in sp.train + sp.val)
    pool_hashes = {u.features.program_hash for u in sp.target_pool}
    assert sp.target_pool and not pool_hashes & {p.features.program_hash for p in sp.test}  # DA pool is never tested
    assert len(_ids(sp.train) | _ids(sp.val) | _ids(sp.test)) + len(sp.target_pool) == len(real.programs)
    assert all(math.isnan(u.seconds) for u in sp.target_pool)


@pytest.mark.parametrize("sampler", ["kmeans", "random"])
def test_cross_device_k_shot_picks_k_distinct_programs_excluded_from_test(two_devices, sampler):
    pool = [p for p in two_devices.programs if p.device == FAKE_DEVICE]
    sp = splits.cross_device_split(two_devices, FAKE_DEVICE, k=8, sampler=sampler)
    assert len(sp.shots) == 8 and len(_ids(sp.shots)) == 8
    assert all(p.device == FAKE_DEVICE for p in sp.shots + sp.test)
    assert not _ids(sp.shots) & _ids(sp.test)
    test_hashes = {p.features.program_hash for p in sp.test}
    assert not test_hashes & {u.features.program_hash for u in sp.target_pool}  # DA pool: never a test program
    assert not test_hashes & {p.features.program_hash for p in sp.train + sp.val}  # "new": no twin in training
    assert all(p.device != FAKE_DEVICE for p in sp.train + sp.val)
    assert set(sp.overlaps().values()) == {0}
    zero = splits.cross_device_split(two_devices, FAKE_DEVICE, k=0)
    assert not zero.shots and _ids(zero.test) == _ids(sp.test)  # the test half depends on the seed only
    again = splits.cross_device_split(two_devices, FAKE_DEVICE, k=8, sampler=sampler)
    assert _ids(again.shots) == _ids(sp.shots)
    seen = splits.cross_device_split(two_devices, FAKE_DEVICE, k=0, programs="seen")
    assert all(seen.twins[p.features.program_hash] > 0 for p in seen.test)
    assert _ids(seen.test) <= _ids(sp.test)


def test_random_split_keeps_twins_on_one_side(two_devices):
    sp = splits.random_split(two_devices, seed=0)
    side = lambda part: {p.features.program_hash for p in part}  # noqa: E731
    assert not side(sp.train) & side(sp.test) and not side(sp.val) & side(sp.test) and not side(sp.train) & side(sp.val)


def test_mape_capped_limits_each_error_to_100_percent():
    m = ev.regression_metrics([1.0, 1.0], [1.5, 101.0])  # 50 % and 10,000 %
    assert m["mape_capped"] == pytest.approx(0.75) and m["mape"] == pytest.approx(50.25)


# ---- peers ------------------------------------------------------------------------------------------

def test_peers_train_and_predict_finite(real):
    from cdmpp.peers import MetaScheduleXGB, TensetMLP, XGBRegressorPeer

    sp = splits.random_split(real[1], seed=0)
    for peer in (MetaScheduleXGB(), XGBRegressorPeer(n_estimators=200), TensetMLP(epochs=3)):
        pred = peer.fit(sp.train, sp.val, time_budget_s=20).predict(sp.test)
        assert pred.shape == (len(sp.test),) and np.all(np.isfinite(pred)), peer.label
        if peer.predicts == "seconds":
            assert np.all(pred > 0)
        adapted = peer.adapt(sp.val[:5]).predict(sp.test[:7])
        assert adapted.shape == (7,) and np.all(np.isfinite(adapted))


def test_xgb_regressor_sees_device_specs(real):
    """Trained on two devices, the regressor needs to know which one a program runs on (as cdmpp does)."""
    from cdmpp.devices import DeviceTable
    from cdmpp.peers import N_FEATURES, XGBRegressorPeer
    from cdmpp.transforms import DeviceSpecs

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    programs = [p for p in real[1].programs if p.device in table]
    peer = XGBRegressorPeer(n_estimators=20, device_table=table).fit(programs)
    x = peer.pooled(programs[:3])
    assert x.shape == (3, N_FEATURES + DeviceSpecs().dim)
    assert np.allclose(x[:, N_FEATURES:], DeviceSpecs(table).raw_vector(table[programs[0].device]), equal_nan=True)
    with pytest.raises(KeyError, match="no-such-device"):
        peer.predict([dataclasses.replace(programs[0], device="no-such-device")])


# ---- end to end -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_recipe(tmp_path_factory):
    from cdmpp.train import RECIPES

    path = tmp_path_factory.mktemp("recipe") / "tiny.toml"
    path.write_text(f'base = "{RECIPES / "default"}"\nd_model = 32\nd_ff = 64\nepochs = 3\nensemble = 2\n'
                    "lr_cycle_epochs = 2\n")
    return str(path)


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
    assert "DA CMD" in report["methods"][0]["note"] and "no domain adaptation" in report["methods"][1]["note"]
    assert "| cdmpp |" in md and "noise floor" in md
    assert report["minutes_per_method"] == 0.15 and "up to 0.15 min per trained model" in md


def test_budget_shared_or_per_method():
    """A shared clock hands out time by weight and shrinks as jobs take theirs; a fixed one gives each the same."""
    import time

    from cdmpp.experiments import _Clock

    shared = _Clock(time.monotonic() + 100, pending=2.0, reserve=0.0)
    first = shared.share(1.0)
    assert 45 < first <= 50 and shared.pending == 1.0
    assert 90 < shared.share(1.0) <= 100  # the last job gets all that is left
    fixed = _Clock(time.monotonic() + 100, pending=2.0, fixed=30.0)
    assert fixed.share(1.0) == fixed.share(0.3) == 30.0


def test_cross_device_eval_mechanics(two_devices, tiny_recipe, tmp_path):
    """MECHANICS ONLY (relabeled fake device): zero-shot and k-shot rows for cdmpp, random shots, a peer."""
    from cdmpp.devices import DeviceTable
    from cdmpp.experiments import EvalOptions, run_eval

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


def test_train_and_sample_workflow(real, tiny_recipe, tmp_path):
    from cdmpp.checkpoint import TrainedModel
    from cdmpp.experiments import sample_ids, train_checkpoint

    folder, real = real
    out = tmp_path / "model"
    train_checkpoint(tiny_recipe, str(folder), str(out), str(TASKS), str(ROOT / "datasets" / "devices.json"),
                     max_minutes=0.1, limit=120, progress=False)
    s = TrainedModel.load(out).summary
    assert s["model_version"].startswith("cdmpp-") and s["data"]["programs"] == 120
    assert all("target" in spec for spec in s["devices"].values())
    device = real.devices()[0]
    assert len(sample_ids(5, str(folder), device, task_table=str(TASKS), limit=120)) == 0  # all measured there already
    ids = sample_ids(5, str(folder), "some-other-device", str(out), task_table=str(TASKS), limit=120)
    assert len(ids) == len(set(ids)) == 5


def test_train_checkpoint_leaves_out_excluded_networks(real, tiny_recipe, tmp_path):
    """A checkpoint for benchmarks on unseen networks never trains on a task of those networks."""
    from cdmpp.checkpoint import TrainedModel
    from cdmpp.experiments import train_checkpoint

    folder, real = real
    nets = real.networks()
    assert len(nets) >= 2
    out = tmp_path / "model"
    train_checkpoint(tiny_recipe, str(folder), str(out), str(TASKS), str(ROOT / "datasets" / "devices.json"),
                     max_minutes=0.1, limit=120, progress=False, exclude_networks=[nets[0]])
    s = TrainedModel.load(out).summary
    seen = {n for d in s["data"]["per_device"].values() for n in d["networks"]}
    assert nets[0] not in seen and seen
    kept = [p for p in real.programs[:120] if not any(o.split("@")[0] == nets[0] for o in p.networks)]
    assert s["data"]["programs"] == len(kept)


def test_protocol_seed_mechanics_with_every_peer(two_devices, tiny_recipe, tmp_path):
    """MECHANICS ONLY (relabeled fake device): one protocol seed writes rows for cdmpp, the pooled GBT,
    TVM's XGBModel (ranking metrics only), the Tenset MLP and the twin-based predictors."""
    import json

    from cdmpp import protocol as P
    from cdmpp.devices import DeviceTable

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


def test_pooled_gbt_targets(real):
    """The pooled GBT on log(latency / FLOPs) and on log(latency / roofline bound): finite positive
    latencies, and the roofline scale is a time no program beats by much (ON the real device table)."""
    from cdmpp.devices import DeviceTable
    from cdmpp.peers import PooledGBT

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    sp = splits.random_split(real[1], seed=0)
    for target in ("flops", "roofline"):
        gbt = PooledGBT(table, n_estimators=50, target=target).fit(sp.train, sp.val)
        pred = gbt.predict(sp.test)
        assert np.all(np.isfinite(pred)) and np.all(pred > 0), target
        assert np.all(np.isfinite(gbt.adapt(sp.val[:5], rounds=3).predict(sp.test[:7])))
    bound = PooledGBT(table, target="roofline").scale(sp.test)
    assert np.all(bound > 0)
    assert np.mean(np.array([p.seconds for p in sp.test]) >= 0.5 * bound) > 0.99
    with pytest.raises(ValueError, match="target"):
        PooledGBT(table, target="bytes")
