"""A real tiny collection on this CPU: build and run 2 tasks x 4 schedules, kill it, resume, load back."""

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import time

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


def test_collect_kill_resume_and_load(tmp_path, monkeypatch):
    ds = str(tmp_path / "ds")
    store = RecordStore(ds)
    proc = _run(ds)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # wait for the first finished batch
        if any(len(list(store.iter_records())) for _ in [0]):
            break
        time.sleep(0.01)  # a task's 4 programs run in ~0.1 s: kill before the second task is stored
    import psutil

    workers = psutil.Process(proc.pid).children(recursive=True)  # its build and runner processes
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=20)
    assert workers and not alive  # none is left waiting for a parent that is gone
    before = {r["id"]: r for r in store.iter_records()}
    assert 0 < len(before) < 8
    assert len(list(tmp_path.glob("cdmpp-measure-*"))) == 1  # the killed run's build folder

    out, err = _run(ds).communicate(timeout=300)
    assert "'measured'" in out, err
    assert not list(tmp_path.glob("cdmpp-measure-*"))  # the resumed run removed it, and its own
    report = LoadReport()
    after = {r["id"]: r for r in store.iter_records(report=report)}
    assert len(after) == 8 and report.duplicates == 0 and not report.problems
    for rid, rec in before.items():  # nothing finished before the kill was lost or redone
        assert after[rid] == rec
    for rec in after.values():
        assert rec["error"] is None and len(rec["seconds"]) == 3 and all(s > 0 for s in rec["seconds"])
        assert rec["trace"] and rec["task_name"] in ("matmul", "softmax")
    runs = store.runs()
    assert len(runs) == 2 and all(r["tvm_version"] and r["cpu_model"] and r["target"] for r in runs.values())

    # a resumed run over a complete dataset measures nothing
    out, _ = _run(ds).communicate(timeout=300)
    assert "'measured': 0" in out and "'skipped_done': 8" in out

    # load it back: features, labels, filters; the second load comes from the feature cache only
    from cdmpp.records import dataset as data
    from cdmpp.zoo.tasks import TaskTable

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
    monkeypatch.undo()

    # run-to-run noise: a fixed probe set, re-measured the same way each time
    from types import SimpleNamespace

    from cdmpp.program import tvm_env
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.remeasure import remeasure_noise

    dev = SimpleNamespace(id="test-cpu-1t/llvm", threads=1)
    cfg = MeasureConfig(repeat=3, min_repeat_ms=5, builders=1, quiet_share=1.0)
    target = tvm_env.make_target("llvm", num_cores=1)
    first = remeasure_noise(ds, table, dev, target, n=5, cfg=cfg, progress=False)
    second = remeasure_noise(ds, table, dev, target, n=7, cfg=cfg, progress=False)
    assert first["programs"] == second["programs"] == 5
    assert [p["id"] for p in first["pairs"]] == [p["id"] for p in second["pairs"]]
    assert all(p["old"] == min(after[p["id"]]["seconds"]) and p["new"] > 0 for p in second["pairs"])
    history = json.load(open(os.path.join(ds, "noise-test-cpu-1t_llvm.json")))
    assert len(history) == 2 and 0 <= history[-1]["median_rel_diff"] <= history[-1]["p90_rel_diff"]

    # a later pass over every program: real measurements appended, labels the fastest over both passes
    from cdmpp.measure.remeasure import remeasure
    from cdmpp.records.labels import label

    assert remeasure(table, ds, dev, target, passes=2, min_gap_minutes=60, cfg=cfg, progress=False)["too_recent"] == 8
    killed_run = {r["run"] for r in before.values()}  # only the programs the killed run measured
    assert remeasure(table, ds, dev, target, passes=2, min_gap_minutes=60, cfg=cfg, runs=killed_run,
                     progress=False)["too_recent"] == len(before)
    with pytest.raises(ValueError, match="no-such-run"):  # a mistyped run id is named, not a silent no-op
        remeasure(table, ds, dev, target, runs={"no-such-run"}, cfg=cfg, progress=False)
    s = remeasure(table, ds, dev, target, passes=2, min_gap_minutes=0, cfg=cfg, batch_size=3, progress=False)
    assert s["measured"] == 8 and s["failed"] == 0
    report = LoadReport()
    passed = {r["id"]: r for r in store.iter_records(report=report)}
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
    before = {p["id"]: p["new"] for p in third["pairs"]}
    assert fourth["same_passes_programs"] == 5 and fourth["same_passes_median_rel_diff"] >= 0
    assert all(p["new_same_passes"] == min(p["new"], before[p["id"]]) for p in fourth["pairs"])


def test_corrupt_lines_are_reported_and_the_rest_loads(tmp_path):
    store = RecordStore(str(tmp_path), seal_every=3)
    recs = [{"id": f"d|t|{i}", "seconds": [1.0], "error": None} for i in range(5)]
    store.append("d", recs[:3])  # sealed into part-0000
    store.append("d", recs[3:])
    active = tmp_path / "d.active.jsonl"
    with open(active, "a") as f:
        f.write("this is not json\n")
        f.write('{"id": "d|t|half", "seconds": [1.')  # a write cut short by a kill
    report = LoadReport()
    ids = [r["id"] for r in store.iter_records(report=report)]
    assert ids == [r["id"] for r in recs]
    assert len(report.problems) == 2 and all("d.active.jsonl:" in p for p in report.problems)
    store.append("d", [{"id": "d|t|5", "seconds": [2.0], "error": None}])  # repairs the tail first
    assert (tmp_path / "d.active.jsonl.partial").read_text().startswith('{"id": "d|t|half"')
    assert len(list(store.iter_records())) == 6

    part = tmp_path / "d.part-0000.jsonl.gz"
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])  # truncated compressed part
    report = LoadReport()
    rest = list(store.iter_records(report=report))
    assert any("part-0000" in p and "truncated" in p for p in report.problems)
    assert {r["id"] for r in rest} >= {"d|t|3", "d|t|4", "d|t|5"}


def test_sealed_parts_are_gzip_json_lines(tmp_path):
    store = RecordStore(str(tmp_path), seal_every=2)
    store.append("dev/x", [{"id": "a"}, {"id": "b"}])
    parts = [p for p in os.listdir(tmp_path) if p.endswith(".jsonl.gz")]
    assert parts == ["dev_x.part-0000.jsonl.gz"]
    lines = gzip.open(tmp_path / parts[0], "rt").read().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["a", "b"]
    assert not (tmp_path / "dev_x.active.jsonl").exists()


def _quiet_guard(max_share: float):
    """A ``CpuGuard`` and the share others use now; skips the test when the machine is too busy to tell."""
    from cdmpp.measure.guard import CpuGuard

    guard = CpuGuard()
    mark = guard.start()
    time.sleep(1.0)
    quiet = guard.others_share(mark)
    if quiet > max_share:
        pytest.skip(f"other processes already use {quiet:.0%} of the CPU: the guard cannot be checked now")
    return guard, quiet


def test_cpu_guard_sees_other_processes():
    guard, quiet = _quiet_guard(0.3)
    # a busy loop outside this process tree (its shell parent exits, so init adopts it)
    subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time; t=time.time()\nwhile time.time()-t<3: pass' &"], check=True)
    time.sleep(0.3)
    mark = guard.start()
    time.sleep(1.5)
    busy = guard.others_share(mark)
    assert busy > quiet + 0.2, (quiet, busy)
    mine = guard.start()
    t = time.time()
    while time.time() - t < 1.0:  # our own work is not counted
        pass
    time.sleep(2.0)  # let the outside loop end
    assert guard.others_share(mine) < busy


def test_a_disturbed_record_is_measured_again_and_superseded(tmp_path):
    store = RecordStore(str(tmp_path))
    store.append("d", [{"id": "d|t|0", "seconds": [9.0], "error": None, "disturbed": True},
                       {"id": "d|t|1", "seconds": [1.0], "error": None, "disturbed": False},
                       {"id": "d|t|2", "seconds": [1.0], "error": None, "others_cpu": 0.3}])  # older format
    assert store.done_ids("d") == {"d|t|1"}  # a resumed collection measures d|t|0 and d|t|2 again
    store.append("d", [{"id": "d|t|0", "seconds": [2.0], "error": None, "disturbed": False},
                       {"id": "d|t|1", "seconds": [5.0], "error": None, "disturbed": False}])
    report = LoadReport()
    got = {r["id"]: r["seconds"] for r in store.iter_records(report=report)}
    assert got == {"d|t|0": [2.0], "d|t|1": [1.0], "d|t|2": [1.0]} and report.duplicates == 2
    assert store.done_ids("d") == {"d|t|0", "d|t|1"}


def test_later_passes_attach_to_their_record_and_lower_its_label(tmp_path):
    from cdmpp.records.labels import label

    store = RecordStore(str(tmp_path))
    store.append("d", [{"id": "d|t|0", "seconds": [3.0, 2.0], "error": None, "disturbed": False},
                       {"id": "d|t|1", "seconds": [], "error": "run: boom", "disturbed": False}])
    store.append("d", [{"id": "d|t|0|pass2", "of": "d|t|0", "seconds": [1.5], "error": None, "disturbed": False},
                       {"id": "d|t|0|pass3", "of": "d|t|0", "seconds": [0.1], "error": None, "disturbed": True},
                       {"id": "d|t|0|pass4", "of": "d|t|0", "seconds": [], "error": "run: x", "disturbed": False},
                       {"id": "d|t|9|pass2", "of": "d|t|9", "seconds": [1.0], "error": None, "disturbed": False}])
    report = LoadReport()
    recs = {r["id"]: r for r in store.iter_records(report=report)}
    assert set(recs) == {"d|t|0", "d|t|1"} and report.records == 2 and report.remeasures == 4
    assert label(recs["d|t|0"]) == 1.5 and label(recs["d|t|0"], passes=1) == 2.0  # disturbed/failed passes ignored
    assert label(recs["d|t|1"]) is None and store.done_ids("d") == {"d|t|0", "d|t|1"}


@pytest.fixture
def measurer():
    """``measurer(cfg, **kw)``: a Measurer for this CPU, 1 thread, closed after the test."""
    from cdmpp.program import tvm_env

    tvm_env.setup(1)
    from cdmpp.measure.measurer import Measurer

    made = []

    def make(cfg, **kw):
        made.append(Measurer(tvm_env.make_target("llvm", num_cores=1), cfg, **kw))
        return made[-1]

    yield make
    for m in made:
        m.close()


def test_integer_inputs_are_valid_indices(measurer):
    """A gather (``take``) with random int64 indices reads out of bounds and kills the runner; the
    collector fills integer inputs with zeros, so it measures."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup(1)
    from tvm import te

    from cdmpp.measure.measurer import MeasureConfig

    table = te.placeholder((100_000, 64), name="table")
    idx = te.placeholder((256,), dtype="int64", name="idx")
    out = te.compute((256, 64), lambda i, j: table[idx[i], j], name="gather")
    mod = tvm.IRModule({"main": te.create_prim_func([table, idx, out])})
    m = measurer(MeasureConfig(repeat=3, min_repeat_ms=2, builders=1, quiet_share=1.0))
    [(secs, err, _, _)] = m.measure([mod])
    assert err is None and len(secs) == 3 and all(s > 0 for s in secs)


def test_a_slow_program_gets_fewer_repeats_instead_of_a_timeout(measurer):
    """A program that runs ~0.5 s gets run_budget_s / 0.5 s repeats, not 15 x 0.5 s."""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    from cdmpp.measure.measurer import MeasureConfig

    slow = workloads.matmul(768, 768, 768)  # unscheduled: a naive triple loop, ~0.1-1 s here
    cfg = MeasureConfig(repeat=15, min_repeat_ms=15, builders=1, quiet_share=1.0, run_budget_s=3.0)
    m = measurer(cfg)
    [(secs, err, _, _)] = m.measure([slow])
    assert err is None
    expected = min(15, int(cfg.run_budget_s / secs[0]))
    assert len(secs) < 15 and abs(len(secs) - expected) <= 2, (len(secs), secs[:3])


def test_a_task_whose_programs_time_out_is_skipped_for_the_batch(measurer):
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    from cdmpp.measure.measurer import MeasureConfig, SKIP_AFTER_TIMEOUTS

    slow, fast = workloads.matmul(768, 768, 768), workloads.matmul(16, 16, 16)
    m = measurer(MeasureConfig(repeat=3, min_repeat_ms=1, builders=1, quiet_share=1.0, run_timeout_s=0.5))
    out = m.measure([slow, slow, slow, fast], groups=["big", "big", "big", "small"])
    errors = [err for _, err, _, _ in out]
    assert all("Timeout" in e for e in errors[:SKIP_AFTER_TIMEOUTS])
    assert errors[2].startswith("run: skipped") and errors[3] is None


def test_a_kernel_that_ignores_the_timeout_is_killed(measurer):
    """TVM's runner times out with a Python timer that cannot fire while the kernel runs; the collector
    kills the worker itself after ``run_timeout_s + kill_grace_s``."""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    from cdmpp.measure.measurer import MeasureConfig

    endless = workloads.matmul(2048, 2048, 2048)  # unscheduled: one call of many seconds
    m = measurer(MeasureConfig(repeat=3, min_repeat_ms=1, builders=1, quiet_share=1.0, run_timeout_s=0.5,
                               kill_grace_s=1.0))
    t = time.time()
    [(secs, err, _, _)] = m.measure([endless])
    assert secs == [] and "Timeout" in err and time.time() - t < 30
    m.cfg.run_timeout_s = 30.0  # a fresh runner worker starts (imports TVM) within the limit
    [(secs, err, _, _)] = m.measure([workloads.matmul(16, 16, 16)])  # the runner works again
    assert err is None and secs


def test_measuring_leaves_no_built_artifacts_behind():
    """MetaSchedule's builder writes each artifact into a temporary folder that nothing removes: a long
    collection once left ~15,000 of them (4 GB) in /tmp. Here they go under the Measurer's own folder,
    emptied after each batch and removed on close."""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    from cdmpp.measure.measurer import MeasureConfig, Measurer

    with Measurer(tvm_env.make_target("llvm", num_cores=1),
                  MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0)) as m:
        seen = []
        run_one = m._run_one
        m._run_one = lambda inp: (seen.append(inp.artifact_path), run_one(inp))[1]
        out = m.measure([workloads.matmul(16, 16, 16), workloads.matmul(32, 32, 32)])
        assert [err for _, err, _, _ in out] == [None, None]
        assert len(seen) == 2 and all(p.startswith(m.tmp_root + os.sep) for p in seen)
        assert not any(os.path.exists(p) for p in seen) and not os.listdir(m.tmp_root)
    assert not os.path.exists(m.tmp_root)


TERM_SCRIPT = textwrap.dedent("""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    tvm_env.setup(1)
    from cdmpp.cli import stop_signals_interrupt
    from cdmpp.measure.measurer import MeasureConfig, Measurer
    cfg = MeasureConfig(repeat=3, min_repeat_ms=1, builders=1, quiet_share=1.0)
    with stop_signals_interrupt(), Measurer(tvm_env.make_target("llvm", num_cores=1), cfg) as m:
        print(m.tmp_root, flush=True)
        m.measure([workloads.matmul(1024, 1024, 1024)])  # unscheduled: runs for seconds
""")


def test_sigterm_midway_leaves_no_build_folders():
    """``kill`` in the middle of a batch (as the CLI runs it) still removes what the batch built."""
    proc = subprocess.Popen([sys.executable, "-c", TERM_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, TVM_NUM_THREADS="1"))
    try:
        root = proc.stdout.readline().strip()
        deadline = time.time() + 120
        while time.time() < deadline and not any(files for _, _, files in os.walk(root)):
            time.sleep(0.1)  # until the build is written and the run begins
        assert any(files for _, _, files in os.walk(root)), proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a hung run must not outlive the test
    assert "KeyboardInterrupt" in err and not os.path.exists(root)


def test_a_stop_request_ends_measuring_before_the_next_program(measurer):
    """TVM may swallow the KeyboardInterrupt of a stop signal; ``STOP`` still ends the batch."""
    from cdmpp.zoo import workloads
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.stop import STOP

    m = measurer(MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0))
    runs, run_one = [], m._run_one
    m._run_one = lambda inp: (runs.append(inp), STOP.set(), run_one(inp))[2]
    try:
        with pytest.raises(KeyboardInterrupt):
            m.measure([workloads.matmul(16, 16, 16), workloads.matmul(32, 32, 32)])
    finally:
        STOP.clear()
    assert len(runs) == 1 and not os.listdir(m.tmp_root)


def test_a_stop_signal_ends_a_command_as_interrupted(monkeypatch, capsys):
    """SIGTERM mid-command runs its cleanup and exits 130, also when the interrupt was raised inside a
    TVM callback and came back out of TVM as a RuntimeError; the handlers are restored afterwards."""
    from cdmpp import cli
    from cdmpp.cli import measure

    cleaned, handler = [], signal.getsignal(signal.SIGTERM)

    def noise(args):
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            except KeyboardInterrupt:
                raise RuntimeError("KeyboardInterrupt")  # what TVM's FFI turns it into
        finally:
            cleaned.append(True)

    monkeypatch.setattr(measure, "cmd_noise", noise)
    assert cli.main(["noise", "--device", "d"]) == 130
    assert cleaned == [True] and "cdmpp noise: interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is handler

    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(measure, "cmd_noise", broken)
    with pytest.raises(RuntimeError, match="a bug"):  # without a signal a RuntimeError is a bug
        cli.main(["noise", "--device", "d"])


def test_a_kept_artifact_is_run_again_without_building(tmp_path, measurer):
    """Later passes of a program run the artifact its first pass built (building is a third of a pass)."""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    from cdmpp.measure.measurer import MeasureConfig

    kept = tmp_path / "artifacts"
    m = measurer(MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0), artifact_dir=str(kept))
    built, builder = [], m.builder

    class CountingBuilder:
        def build(self, inputs):
            built.append(len(inputs))
            return builder.build(inputs)

    m.builder = CountingBuilder()
    mods = [workloads.matmul(16, 16, 16), workloads.matmul(32, 32, 32)]
    first = m.measure(mods, keys=["a", "b"])
    again = m.measure(mods, keys=["a", "b"])
    third = m.measure(mods, keys=["a", "c"])
    assert built == [2, 1]  # nothing built the second time, only "c" the third
    for out in (first, again, third):
        assert all(err is None and secs and min(secs) > 0 for secs, err, _, _ in out)
    assert all(b > 0 for _, _, b, _ in first) and [b for _, _, b, _ in again] == [0.0, 0.0]
    assert len(os.listdir(kept)) == 3 and not os.listdir(m.tmp_root)


def test_cli_keeps_artifacts_beside_the_feature_cache_unless_told(tmp_path, monkeypatch):
    from cdmpp.cli import build_parser
    from cdmpp.cli.measure import _artifact_dir

    monkeypatch.setenv("CDMPP_CACHE", str(tmp_path / "cache"))
    parse = build_parser().parse_args
    assert _artifact_dir(parse(["remeasure", "--device", "d"])) == str(tmp_path / "cache" / "artifacts")
    assert _artifact_dir(parse(["collect", "--artifacts", "/x"])) == "/x"
    assert _artifact_dir(parse(["noise", "--device", "d", "--artifacts", "none"])) is None


def test_pause_stops_a_run_phase_midway_and_reruns_it_once_resumed(tmp_path, measurer):
    """PAUSE created while a batch runs stops it before its next program; whatever ran meanwhile may have
    disturbed the programs already run, so the whole run phase is run again once PAUSE is gone."""
    import threading

    from cdmpp.program import tvm_env

    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    from cdmpp.measure.measurer import MeasureConfig

    flag = tmp_path / "PAUSE"
    m = measurer(MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0), pause_flag=str(flag))
    runs, run_one, paused_at = [], m._run_one, []

    def run_one_then_pause(inp):
        runs.append(inp.artifact_path)
        out = run_one(inp)
        if len(runs) == 1:  # someone pauses while the first program runs, and resumes 3 s later
            flag.touch()
            paused_at.append(time.time())
            threading.Timer(3.0, flag.unlink).start()
        return out

    m._run_one = run_one_then_pause
    out = m.measure([workloads.matmul(16, 16, 16), workloads.matmul(32, 32, 32)])
    assert [err for _, err, _, _ in out] == [None, None] and all(secs for secs, _, _, _ in out)
    assert len(runs) == 3 and runs[0] == runs[1] != runs[2]  # first program, then the whole phase again
    assert time.time() - paused_at[0] >= 3.0


def test_cpu_guard_counts_exited_children_as_ours():
    """A child that ran and exited (a killed runner worker) is part of this tree, not another process."""
    guard, quiet = _quiet_guard(0.1)
    mark = guard.start()
    subprocess.run([sys.executable, "-c", "import time; t=time.time()\nwhile time.time()-t<1.5: pass"], check=True)
    assert guard.others_share(mark) < quiet + 0.15
