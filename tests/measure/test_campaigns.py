"""``cdmpp collect``: resumable collections, twins first, either measurer."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cdmpp.devices.probe import local_hardware
from cdmpp.records.store import LoadReport, RecordStore

SCRIPT = textwrap.dedent("""
    import sys
    from types import SimpleNamespace
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    tvm = tvm_env.setup(1)
    from cdmpp.measure.campaigns import collect
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.zoo.tasks import Task, task_key
    target = tvm_env.make_target("llvm", num_cores=1)
    tasks = []
    for name, make in [("matmul", lambda: workloads.matmul(64, 64, 64)), ("softmax", lambda: workloads.softmax(64, 128))]:
        mod = make()
        tasks.append(Task(task_key(mod), name, tvm.ir.save_json(mod), None, {"toy@1": 1}))
    from cdmpp.zoo.tasks import TaskTable
    table = TaskTable()
    table.add(tasks)
    table.save(sys.argv[1] + "-tasks.json")
    device = SimpleNamespace(id="test-cpu-1t/llvm", threads=1)
    cfg = MeasureConfig(repeat=3, min_repeat_ms=5, builders=1, quiet_share=float(sys.argv[2]))
    print(collect(tasks, sys.argv[1], device, target, per_task=4, cfg=cfg, batch_size=2, progress=False))
""")


def _run(dataset, **kw):
    # quiet_share 1.0: the CPU guard would otherwise wait for a quiet machine (tested on its own below)
    return subprocess.Popen([sys.executable, "-c", SCRIPT, dataset, "1.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, TVM_NUM_THREADS="1", TMPDIR=os.path.dirname(dataset)), **kw)


def _task(tvm, name, mod):
    from cdmpp.zoo.tasks import Task, task_key

    return Task(task_key(mod), name, tvm.ir.save_json(mod), None, {"toy@1": 1})


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A collection killed after its first stored batch, then run again to the end: (dataset folder, the
    records before the kill, after the resume, the build folders the kill left, those left after)."""
    import psutil

    tmp = tmp_path_factory.mktemp("collect")
    ds = str(tmp / "ds")
    store = RecordStore(ds)
    proc = _run(ds)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # wait for the first finished batch
        if any(len(list(store.iter_records())) for _ in [0]):
            break
        time.sleep(0.01)  # a task's 4 programs run in ~0.1 s: kill before the second task is stored
    workers = psutil.Process(proc.pid).children(recursive=True)  # its build and runner processes
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert workers and not alive  # none is left waiting for a parent that is gone
    before = {r["id"]: r for r in store.iter_records()}
    left_by_kill = list(tmp.glob("cdmpp-measure-*"))
    out, err = _run(ds).communicate(timeout=300)
    assert "'measured'" in out, err
    after = {r["id"]: r for r in store.iter_records()}
    return ds, before, after, left_by_kill, list(tmp.glob("cdmpp-measure-*"))


def _copy(collected, tmp_path) -> str:
    """A copy of the collected dataset (and its task table) that a test may add to."""
    import shutil

    ds = str(tmp_path / "ds")
    shutil.copytree(collected[0], ds)
    shutil.copy(collected[0] + "-tasks.json", ds + "-tasks.json")
    return ds


@pytest.mark.slow
def test_a_killed_collection_resumes_without_losing_or_redoing_work(collected):
    ds, before, after, left_by_kill, left_after = collected
    assert 0 < len(before) < 8
    assert len(left_by_kill) == 1 and not left_after  # the resumed run removed the killed run's build folder
    report = LoadReport()
    assert len({r["id"] for r in RecordStore(ds).iter_records(report=report)}) == 8
    assert report.duplicates == 0 and not report.problems
    for rid, rec in before.items():  # nothing finished before the kill was lost or redone
        assert after[rid] == rec
    for rec in after.values():
        assert rec["error"] is None and len(rec["seconds"]) == 3 and all(s > 0 for s in rec["seconds"])
        assert rec["trace"] and rec["task_name"] in ("matmul", "softmax")
    runs = RecordStore(ds).runs()
    assert len(runs) == 2 and all(r["tvm_version"] and r["cpu_model"] and r["target"] for r in runs.values())


@pytest.mark.slow
def test_a_resumed_run_over_a_complete_dataset_measures_nothing(collected, tmp_path):
    out, _ = _run(_copy(collected, tmp_path)).communicate(timeout=300)
    assert "'measured': 0" in out and "'skipped_done': 8" in out


@pytest.mark.slow
def test_a_collection_loads_back_and_then_from_the_feature_cache(collected, tmp_path, monkeypatch):
    """Features, labels and filters; the second load comes from the feature cache only."""
    from cdmpp.records import dataset as data
    from cdmpp.zoo.tasks import TaskTable

    ds, _, after, _, _ = collected
    table = TaskTable.load(ds + "-tasks.json")
    cache = str(tmp_path / "cache")
    loaded = data.load_dataset(ds, table, cache_dir=cache, progress=False)
    assert len(loaded) == 8 and loaded.devices() == ["test-cpu-1t/llvm"]
    for p in loaded.programs:
        assert p.features.n_leaves >= 1 and p.seconds == min(after[p.record_id]["seconds"])
    assert len(loaded.filter(tasks=["softmax"])) == 4 and len(loaded.filter(networks=["toy"])) == 8
    assert len(loaded.filter(networks=["resnet18"])) == 0

    def no_tvm(*a, **k):
        raise AssertionError("features should come from the cache")

    monkeypatch.setattr(data, "_featurize_records", no_tvm)
    again = data.load_dataset(ds, table, cache_dir=cache, progress=False)
    assert [p.features.program_hash for p in again.programs] == [p.features.program_hash for p in loaded.programs]


def _remeasure_setup(collected, tmp_path):
    from types import SimpleNamespace

    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.program import tvm_env
    from cdmpp.zoo.tasks import TaskTable

    ds = _copy(collected, tmp_path)
    dev = SimpleNamespace(id="test-cpu-1t/llvm", threads=1, kind="cpu", hardware=local_hardware())
    cfg = MeasureConfig(repeat=3, min_repeat_ms=5, builders=1, quiet_share=1.0)
    return ds, TaskTable.load(ds + "-tasks.json"), dev, tvm_env.make_target("llvm", num_cores=1), cfg


@pytest.mark.slow
def test_noise_checks_remeasure_a_fixed_probe_set(collected, tmp_path):
    from cdmpp.measure.remeasure import remeasure_noise

    ds, table, dev, target, cfg = _remeasure_setup(collected, tmp_path)
    after = collected[2]
    first = remeasure_noise(ds, table, dev, target, n=5, cfg=cfg, progress=False)
    second = remeasure_noise(ds, table, dev, target, n=7, cfg=cfg, progress=False)
    assert first["programs"] == second["programs"] == 5
    assert [p["id"] for p in first["pairs"]] == [p["id"] for p in second["pairs"]]
    assert all(p["old"] == min(after[p["id"]]["seconds"]) and p["new"] > 0 for p in second["pairs"])
    history = json.load(open(os.path.join(ds, "noise-test-cpu-1t_llvm.json")))
    assert len(history) == 2 and 0 <= history[-1]["median_rel_diff"] <= history[-1]["p90_rel_diff"]
    other = type(dev)(**{**vars(dev), "hardware": "Another CPU (znver9)"})  # its code may not even run here
    with pytest.raises(ValueError, match="measure it on its own machine"):
        remeasure_noise(ds, table, other, target, n=5, cfg=cfg, progress=False)


@pytest.mark.slow
def test_a_later_pass_lowers_labels_to_the_fastest_over_both_passes(collected, tmp_path):
    """Real measurements appended to every program; the noise check then compares like with like."""
    from cdmpp.measure.remeasure import remeasure, remeasure_noise
    from cdmpp.records.labels import label

    ds, table, dev, target, cfg = _remeasure_setup(collected, tmp_path)
    before, after = collected[1], collected[2]
    remeasure_noise(ds, table, dev, target, n=5, cfg=cfg, progress=False)  # fixes the probe set
    assert remeasure(table, ds, dev, target, passes=2, min_gap_minutes=60, cfg=cfg, progress=False)["too_recent"] == 8
    killed_run = {r["run"] for r in before.values()}  # only the programs the killed run measured
    assert remeasure(table, ds, dev, target, passes=2, min_gap_minutes=60, cfg=cfg, runs=killed_run,
                     progress=False)["too_recent"] == len(before)
    with pytest.raises(ValueError, match="no-such-run"):  # a mistyped run id is named, not a silent no-op
        remeasure(table, ds, dev, target, runs={"no-such-run"}, cfg=cfg, progress=False)
    s = remeasure(table, ds, dev, target, passes=2, min_gap_minutes=0, cfg=cfg, batch_size=3, progress=False)
    assert s["measured"] == 8 and s["failed"] == 0
    report = LoadReport()
    passed = {r["id"]: r for r in RecordStore(ds).iter_records(report=report)}
    assert set(passed) == set(after) and report.remeasures == 8 and report.duplicates == 0
    for rid, rec in passed.items():
        (later,) = rec["remeasures"]
        assert later["id"] == rid + "|pass2" and len(later["seconds"]) == 3 and later["run"] != rec["run"]
        assert label(rec) == min(rec["seconds"] + later["seconds"]) and label(rec, passes=1) == min(rec["seconds"])
    assert remeasure(table, ds, dev, target, passes=2, min_gap_minutes=0, cfg=cfg, progress=False)["todo"] == 0
    third = remeasure_noise(ds, table, dev, target, cfg=cfg, progress=False)
    assert third["label_passes"] == {"2": 5} and all(p["old"] <= p["first_pass"] for p in third["pairs"])
    assert third["same_passes_programs"] == 0  # the earlier checks are seconds old, not 30 minutes
    # like for like: 2-pass labels against this check combined with the one before, fastest wins
    fourth = remeasure_noise(ds, table, dev, target, cfg=cfg, min_gap_minutes=0, progress=False)
    previous = {p["id"]: p["new"] for p in third["pairs"]}
    assert fourth["same_passes_programs"] == 5 and fourth["same_passes_median_rel_diff"] >= 0
    assert all(p["new_same_passes"] == min(p["new"], previous[p["id"]]) for p in fourth["pairs"])


@pytest.mark.slow
def test_programs_from_measures_the_other_devices_programs_first(tmp_path):
    """Twins: device B measures A's stored programs (same hashes) before new ones; a second run skips them."""
    from types import SimpleNamespace

    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm = tvm_env.setup(1)
    from cdmpp.measure.campaigns import collect
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.records.store import RecordStore

    tasks = [_task(tvm, "matmul", workloads.matmul(32, 32, 32)), _task(tvm, "softmax", workloads.softmax(16, 32))]
    cfg = MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0)
    target = tvm_env.make_target("llvm", num_cores=1)
    ds = str(tmp_path / "ds")
    here = dict(threads=1, kind="cpu", hardware=local_hardware())  # measured here: this chip's devices
    a, b = SimpleNamespace(id="dev-a/llvm", **here), SimpleNamespace(id="dev-b/llvm", **here)
    sa = collect(tasks, ds, a, target, per_task=3, cfg=cfg, progress=False)
    assert sa["measured"] == 6 and sa["failed"] == 0
    with pytest.raises(ValueError, match="no records"):
        collect(tasks, ds, b, target, per_task=0, cfg=cfg, programs_from="dev-nothing/llvm", progress=False)
    sb = collect(tasks, ds, b, target, per_task=0, cfg=cfg, programs_from=a.id, progress=False)
    assert sb["twins_measured"] == 6
    store = RecordStore(ds)
    hashes = lambda dev: sorted((r["task"], r["program_hash"]) for r in store.iter_records(dev))
    assert hashes(a.id) == hashes(b.id)
    again = collect(tasks, ds, b, target, per_task=0, cfg=cfg, programs_from=a.id, progress=False)
    assert again["measured"] == 0 and again["skipped_done"] == 6
    runs = store.runs()
    assert runs[sb["run"]]["programs_from"] == a.id and runs[sb["run"]]["measurer"] == "fast"

    # the fast collector's single-pass labels against a later check the usual way, on a probe set of their own
    from cdmpp.measure.remeasure import remeasure_noise
    from cdmpp.zoo.tasks import TaskTable

    table = TaskTable()
    table.add(tasks)
    check = remeasure_noise(ds, table, b, target, n=3, cfg=cfg, probe_runs={sb["run"]}, progress=False)
    assert check["programs"] == 3 and check["runs"] == [sb["run"]] and check["median_rel_diff"] >= 0
    assert [f for f in os.listdir(ds) if f.startswith("probe-dev-b_llvm-runs-")]
    with pytest.raises(ValueError, match="unknown collection run"):
        remeasure_noise(ds, table, b, target, cfg=cfg, probe_runs={"nope"}, progress=False)


@pytest.mark.slow
def test_the_fast_measurer_resumes_a_collection_the_metaschedule_one_began(tmp_path):
    """Same seeds, same programs: switching measurers never measures a stored program again."""
    from types import SimpleNamespace

    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm = tvm_env.setup(1)
    from cdmpp.measure.campaigns import collect
    from cdmpp.measure.measurer import MeasureConfig

    tasks = [_task(tvm, "matmul", workloads.matmul(32, 32, 32))]
    cfg = MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0)
    target, dev, ds = tvm_env.make_target("llvm", num_cores=1), SimpleNamespace(id="d/llvm", threads=1), str(tmp_path)
    first = collect(tasks, ds, dev, target, per_task=3, cfg=cfg, measurer="metaschedule", progress=False)
    assert first["measured"] == 3
    keys = ["id", "device", "task", "task_name", "networks", "program_hash", "trace", "seconds", "error", "build_s",
            "others_cpu", "disturbed", "run", "measured_at", "stable"]  # the stored form, as before records were typed
    assert all(list(r) == keys for r in RecordStore(ds).iter_records())
    again = collect(tasks, ds, dev, target, per_task=3, cfg=cfg, progress=False)
    assert again["measured"] == 0 and again["skipped_done"] == 3


def test_a_job_that_failed_as_a_whole_is_listed_and_skipped_when_resumed(tmp_path):
    """A task whose build job fails as a whole (here: its module does not load; on real data, an LLVM
    build that outlives its timeout) is listed once, and a resumed run with the same seed skips it
    instead of waiting on it again; the other task is measured as usual."""
    import json
    from types import SimpleNamespace

    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    from cdmpp.zoo.tasks import Task

    tvm = tvm_env.setup(1)
    from cdmpp.measure.campaigns import collect, failed_jobs_path
    from cdmpp.measure.measurer import MeasureConfig

    good = _task(tvm, "matmul", workloads.matmul(16, 16, 16))
    bad = Task("0" * 16, "broken", "not a module", None, {"toy@1": 1})
    cfg = MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0)
    target, dev, ds = tvm_env.make_target("llvm", num_cores=1), SimpleNamespace(id="d/llvm", threads=1), str(tmp_path)
    first = collect([good, bad], ds, dev, target, per_task=2, cfg=cfg, seed=7, progress=False)
    assert first["measured"] == 2 and first["failed_jobs"] == 1 and first["skipped_failed_jobs"] == 0
    with open(failed_jobs_path(ds, dev.id)) as f:
        listed = [json.loads(line) for line in f]
    assert [(j["task"], j["seed"]) for j in listed] == [(bad.key, 7)] and listed[0]["error"].startswith("build: ")
    again = collect([good, bad], ds, dev, target, per_task=2, cfg=cfg, seed=7, progress=False)
    assert again["measured"] == 0 and again["skipped_failed_jobs"] == 1 and "failed_jobs" not in again
    other_seed = collect([bad], ds, dev, target, per_task=2, cfg=cfg, seed=8, progress=False)
    assert other_seed["skipped_failed_jobs"] == 0 and other_seed["failed_jobs"] == 1  # other programs: tried
