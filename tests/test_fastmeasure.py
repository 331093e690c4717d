"""The fast measurer (``cdmpp.fastmeasure``) and the collector options around it, on this CPU."""

import os
import threading
import time

import pytest

EMPTY_TRACE = [[], []]  # a trace with no instruction: the unscheduled program itself


class _FakeModule:
    """``time_evaluator`` (and direct calls, on a fake clock) that return preset seconds, to check the
    stopping rule without timing."""

    def __init__(self, seconds):
        self.seconds, self.calls, self.now = list(seconds), [], 0.0

    def time_evaluator(self, fname, dev, number=1, repeat=1):
        self.calls.append(number)

        class R:
            pass

        def ev(*args):
            r = R()
            r.results = [self.seconds.pop(0)]
            return r
        return ev

    def get_function(self, fname):
        self.calls.append("direct")
        state = {"left": 0}

        def f(*args):  # one call of a repeat: the repeat's preset seconds spread over its calls
            if state["left"] == 0:
                state["per"], state["left"] = self.seconds.pop(0), self.number
            self.now += state["per"]
            state["left"] -= 1
        return f

    def clock(self):
        return self.now


class _Dev:
    def sync(self):
        pass


def _cfg(**kw):
    c = {"repeat": 15, "min_repeat_ms": 15, "run_budget_s": 10.0, "min_repeats": 5, "stable_tol": 0.01,
         "stable_patience": 3}
    c.update(kw)
    return c


def _repeats(monkeypatch, seconds, **cfg):
    from cdmpp import fastmeasure

    m = _FakeModule(seconds)
    c = _cfg(**cfg)
    m.number = max(1, -(-c["min_repeat_ms"] // (seconds[0] * 1e3)))  # calls per repeat, as the probe decides
    m.number = int(m.number)
    monkeypatch.setattr(fastmeasure, "_clock", m.clock)
    return fastmeasure.adaptive_repeats(m, "f", _Dev(), [], c), m


def test_adaptive_repeats_stop_once_the_fastest_is_stable(monkeypatch):
    # probe 0.1 ms -> 150 calls per repeat (TVM's evaluator); the best (0.090) stops improving after the 4th repeat
    secs, m = _repeats(monkeypatch, [1e-4, 1.00e-4, 0.95e-4, 0.92e-4, 0.90e-4, 0.905e-4, 0.91e-4, 0.90e-4, 0.5e-4])
    assert secs == [1.00e-4, 0.95e-4, 0.92e-4, 0.90e-4, 0.905e-4, 0.91e-4, 0.90e-4]
    assert m.calls == [1, 150]
    # never more than ``repeat``, never fewer than ``min_repeats`` while the budget allows
    assert len(_repeats(monkeypatch, [1e-4] + [1e-4 * (1 - 0.02 * i) for i in range(20)], repeat=6)[0]) == 6
    assert len(_repeats(monkeypatch, [1e-4] * 10)[0]) == 5
    # a slow program: the budget decides; one too slow for two runs keeps its probe alone
    assert len(_repeats(monkeypatch, [0.3] * 10, run_budget_s=1.0)[0]) == 2
    assert _repeats(monkeypatch, [0.6] * 10, run_budget_s=1.0)[0] == [0.6]


def test_repeats_of_longer_kernels_are_direct_calls_and_a_long_probe_is_one(monkeypatch):
    """TVM's evaluator calls the kernel once more than it times: a kernel of a millisecond or more is
    timed around direct calls instead, and a probe as long as a repeat (after that warm-up) is a repeat."""
    # 2 ms: 8 calls per repeat, timed directly; the probe is not a repeat (one call, not 15 ms)
    secs, m = _repeats(monkeypatch, [2e-3, 2.1e-3, 2.0e-3, 2.0e-3, 2.0e-3, 2.0e-3, 1e-3])
    assert m.calls == [1, "direct"] and secs == pytest.approx([2.1e-3, 2.0e-3, 2.0e-3, 2.0e-3, 2.0e-3])
    # 50 ms: the probe is the first repeat, then single direct calls until the fastest is stable; such
    # kernels need 3 repeats (``min_repeats_long``) with a patience of 2
    secs, m = _repeats(monkeypatch, [0.05, 0.051, 0.049, 0.0495, 0.049, 0.049, 0.01], min_repeats_long=3)
    assert m.calls == [1, "direct"] and secs == pytest.approx([0.05, 0.051, 0.049, 0.0495, 0.049])
    assert _repeats(monkeypatch, [0.05, 0.0501, 0.0502, 0.01], min_repeats_long=3)[0] == pytest.approx(
        [0.05, 0.0501, 0.0502])
    # 0.3 s within 1 s: probe (with its warm-up, 0.6 s) + one more call; the label is the faster
    secs, m = _repeats(monkeypatch, [0.3, 0.29, 0.28, 0.27], run_budget_s=1.0)
    assert secs == pytest.approx([0.3, 0.29])


def _task(tvm, name, mod):
    from cdmpp.zoo.tasks import Task, task_key

    return Task(task_key(mod), name, tvm.ir.save_json(mod), None, {"toy@1": 1})


def _gather(tvm):
    from tvm import te

    table = te.placeholder((100_000, 64), name="table")
    idx = te.placeholder((256,), dtype="int64", name="idx")
    out = te.compute((256, 64), lambda i, j: table[idx[i], j], name="gather")
    return tvm.IRModule({"main": te.create_prim_func([table, idx, out])})


def _wild_store(tvm, stride=100_000_000):
    """Reads far outside its buffer: kills the process that runs it (a stride past int32: fails to build)."""
    from tvm import te

    a = te.placeholder((16,), name="a")
    out = te.compute((16,), lambda i: a[i] + a[(i + 1) * stride], name="wild")
    return tvm.IRModule({"main": te.create_prim_func([a, out])})


def test_fast_measurer_runs_crashes_and_timeouts_without_losing_the_next_program(tmp_path):
    """Integer inputs are zeros (valid indices); a kernel that kills the runner process and one that runs
    past the timeout are recorded with their error, and the next program is measured."""
    from cdmpp import tvm_env, workloads

    tvm = tvm_env.setup(1)
    from cdmpp.collect import MeasureConfig
    from cdmpp.fastmeasure import FastMeasurer

    small = workloads.matmul(16, 16, 16)
    endless = workloads.matmul(2048, 2048, 2048)  # unscheduled: one call of many seconds
    jobs = [{"task_key": t.key, "mod_json": t.mod_json, "traces": [EMPTY_TRACE], "skip": frozenset()}
            for t in (_task(tvm, "gather", _gather(tvm)), _task(tvm, "wild", _wild_store(tvm)),
                      _task(tvm, "endless", endless), _task(tvm, "small", small),
                      _task(tvm, "unbuildable", _wild_store(tvm, 1_000_000_000)))]
    cfg = MeasureConfig(repeat=4, min_repeat_ms=2, builders=1, quiet_share=1.0, run_timeout_s=2.0, kill_grace_s=0.5)
    target = tvm_env.make_target("llvm", num_cores=1)
    with FastMeasurer(target, cfg, threads=1, pause_dir=str(tmp_path)) as m:
        got = {job["task_key"]: res for job, res in m.measure_jobs(jobs)}
        root = m.tmp_root
        assert m.times["run"] > 0 and m.times["build_cpu"] > 0 and m.times["worker_cpu"] > 0
        # 1 thread on a machine with more cores: overlap by default, with a helper builder that was
        # stopped only while programs ran
        assert m.overlap == (len(os.sched_getaffinity(0)) > 1) and (m.helper is not None) == m.overlap
    assert not os.path.exists(root)  # nothing built is left behind
    (gather,), (wild,), (slow,), (ok,), (bad,) = (got[j["task_key"]] for j in jobs)
    assert bad[1] == [] and bad[2].startswith("build: ") and "int32" in bad[2]
    assert gather[2] is None and 1 <= len(gather[1]) <= 4 and all(s > 0 for s in gather[1])
    assert wild[1] == [] and "runner process died" in wild[2], wild
    assert slow[1] == [] and "Timeout" in slow[2]
    assert ok[2] is None and ok[1]
    assert gather[0].build_s > 0 and gather[0].program_hash and gather[0].trace == EMPTY_TRACE


def test_overlap_by_default_only_for_one_thread_cpu_programs_with_cores_to_spare():
    from cdmpp.fastmeasure import default_overlap

    spare = len(os.sched_getaffinity(0)) > 1
    assert default_overlap(1, "cpu") == spare
    assert not default_overlap(len(os.sched_getaffinity(0)), "cpu") and not default_overlap(1, "cuda")


def test_the_helper_builder_and_its_children_are_stopped_while_a_task_runs():
    """The helper build worker shares the runner's core; while a task runs it and whatever it started (the
    linker) are stopped, and continued afterwards."""
    import subprocess
    import types

    from cdmpp.fastmeasure import FastMeasurer

    worker = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])  # a worker with a child
    try:
        time.sleep(0.3)
        m = FastMeasurer.__new__(FastMeasurer)
        m.helper, m._held = types.SimpleNamespace(pool=types.SimpleNamespace(_processes={1: worker})), []

        def states():
            out = []
            for pid in [worker.pid] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
                try:
                    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if pid == worker.pid or int(stat[1]) == worker.pid:
                    out.append(stat[0])
            return out
        m._hold_helper(True)
        assert len(m._held) == 2 and set(states()) == {"T"}
        m._hold_helper(False)
        assert m._held == [] and "T" not in states()
    finally:
        from cdmpp.fastmeasure import _descendants

        for pid in _descendants(worker.pid):
            os.kill(pid, 9)
        worker.kill()
        worker.wait()


def test_pause_files_in_the_dataset_folder_or_its_parent(tmp_path):
    from cdmpp.collect import pause_files

    ds = tmp_path / "measurements"
    ds.mkdir()
    (tmp_path / "PAUSED").write_text("")  # not a pause flag
    (ds / "xPAUSE").write_text("")
    assert pause_files(str(ds)) == []
    (tmp_path / "PAUSE.accuracy").write_text("")
    (ds / "PAUSE").write_text("")
    assert pause_files(str(ds)) == [str(ds / "PAUSE"), str(tmp_path / "PAUSE.accuracy")] or \
        sorted(pause_files(str(ds))) == sorted([str(ds / "PAUSE"), str(tmp_path / "PAUSE.accuracy")])


def test_a_stop_signal_is_honoured_while_waiting_for_a_quiet_machine(monkeypatch):
    from cdmpp.collect import CpuGuard

    guard = CpuGuard()
    if not guard.enabled:
        pytest.skip("no /proc")
    monkeypatch.setattr(CpuGuard, "others_share", lambda self, mark: 1.0)  # never quiet
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    t = time.time()
    with pytest.raises(KeyboardInterrupt):
        guard.wait_quiet(0.05, 600, stop=stop)
    assert time.time() - t < 5


def test_a_paused_fast_collection_waits_and_honours_a_stop(tmp_path):
    from cdmpp import tvm_env, workloads

    tvm = tvm_env.setup(1)
    from cdmpp.collect import STOP, MeasureConfig
    from cdmpp.fastmeasure import FastMeasurer

    (tmp_path / "PAUSE.someone").write_text("")
    t = _task(tvm, "small", workloads.matmul(16, 16, 16))
    cfg = MeasureConfig(repeat=3, min_repeat_ms=1, builders=1, quiet_share=1.0)
    waits = []
    with FastMeasurer(tvm_env.make_target("llvm", num_cores=1), cfg, threads=1, pause_dir=str(tmp_path)) as m:
        def on_wait(waited, what):  # paused: now a stop signal comes
            waits.append(what)
            STOP.set()

        m.on_wait = on_wait
        try:
            with pytest.raises(KeyboardInterrupt):
                list(m.measure_jobs([{"task_key": t.key, "mod_json": t.mod_json, "traces": [EMPTY_TRACE],
                                      "skip": frozenset()}]))
        finally:
            STOP.clear()
    assert waits and set(waits) == {"paused"}


def test_programs_from_measures_the_other_devices_programs_first(tmp_path):
    """Twins: device B measures A's stored programs (same hashes) before new ones; a second run skips them."""
    from types import SimpleNamespace

    from cdmpp import tvm_env, workloads

    tvm = tvm_env.setup(1)
    from cdmpp.collect import MeasureConfig, collect
    from cdmpp.store import RecordStore

    tasks = [_task(tvm, "matmul", workloads.matmul(32, 32, 32)), _task(tvm, "softmax", workloads.softmax(16, 32))]
    cfg = MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0)
    target = tvm_env.make_target("llvm", num_cores=1)
    ds = str(tmp_path / "ds")
    a, b = SimpleNamespace(id="dev-a/llvm", threads=1), SimpleNamespace(id="dev-b/llvm", threads=1)
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
    from cdmpp.collect import remeasure_noise
    from cdmpp.zoo.tasks import TaskTable

    table = TaskTable()
    table.add(tasks)
    check = remeasure_noise(ds, table, b, target, n=3, cfg=cfg, probe_runs={sb["run"]}, progress=False)
    assert check["programs"] == 3 and check["runs"] == [sb["run"]] and check["median_rel_diff"] >= 0
    assert [f for f in os.listdir(ds) if f.startswith("probe-dev-b_llvm-runs-")]
    with pytest.raises(ValueError, match="unknown collection run"):
        remeasure_noise(ds, table, b, target, cfg=cfg, probe_runs={"nope"}, progress=False)


def test_tasks_match_exact_names_and_tasks_like_substrings():
    from cdmpp.zoo.tasks import Task, TaskTable

    table = TaskTable()
    table.add([Task("k1", "conv2d", "{}", None, {"n@1": 1}), Task("k2", "fused_conv2d_add", "{}", None, {"n@1": 1}),
               Task("k3", "softmax", "{}", None, {"n@1": 1})])
    assert set(table.filter(task_names=["conv2d"]).tasks) == {"k1"}
    assert set(table.filter(task_like=["conv2d"]).tasks) == {"k1", "k2"}
    assert set(table.filter(task_keys=["k3"]).tasks) == {"k3"}


def test_collect_help_shows_the_guard_defaults():
    from cdmpp.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    for cmd in ("collect", "remeasure", "noise"):
        text = sub[cmd].format_help()
        assert "--quiet-share" in text and "(default 0.05)" in text.replace("\n", " ").replace("  ", " ")
        assert "--max-wait-minutes" in text and "default 30.0" in " ".join(text.split())
    assert "--tasks-like" in sub["collect"].format_help() and "--programs-from" in sub["collect"].format_help()


def test_a_cuda_spec_from_what_the_runtime_reports():
    """No GPU here: the spec arithmetic from the H100's reported attributes (shared GPU-NOTES)."""
    from cdmpp.devices import cuda_spec, gpu_slug

    assert gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100"
    assert gpu_slug("NVIDIA GeForce RTX 4090") == "nvidia-rtx-4090"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100"
    spec = cuda_spec({"name": "NVIDIA H100 80GB HBM3", "compute_version": "9.0", "sm_count": 132,
                      "clock_khz": 1_980_000, "l2_bytes": 50 * 2**20, "warp_size": 32}, 3000.0, "emeraldrapids", 16)
    assert spec.id == "nvidia-h100/cuda-sm90" and spec.kind == "gpu" and spec.cores == 132
    assert spec.peak_gflops == round(132 * 128 * 2 * 1.98, 1) and spec.l2_kb == 51200.0 and spec.l1d_kb == 256.0
    assert spec.target["arch"] == "sm_90" and spec.target["host"]["mcpu"] == "emeraldrapids"


def test_bench_collect_reports_rate_and_where_the_time_went(tmp_path):
    from cdmpp.bench import bench_collect

    r = bench_collect("datasets/tasks-llvm.json.gz", "datasets/devices.json", threads=1, mcpu=None, tasks=1,
                      per_task=2, seed=3, measurer="fast", overlap=False, quiet_share=1.0, run_budget_s=0.2,
                      dataset=str(tmp_path / "ds"))
    assert r["measured"] + r["failed"] >= 1 and r["programs_per_s"] >= 0 and r["device"].endswith("-1t/" + r["device"].split("/")[1])
    assert {"wait_build", "run", "wait_quiet", "paused", "build_cpu", "sample_cpu"} <= set(r["times"])
    assert len(list((tmp_path / "ds").glob("*.active.jsonl"))) == 1


def test_stability_of_a_pass_and_which_labels_get_a_later_pass():
    from cdmpp.collect import MeasureConfig, _drawn, is_stable

    cfg = MeasureConfig()  # at least 5 repeats, 1 %, 3 repeats of patience
    assert is_stable([1.0, 0.9, 0.91, 0.9, 0.905], cfg) is True
    assert is_stable([1.0, 0.99, 0.98, 0.97, 0.9], cfg) is False  # still improving when it stopped
    assert is_stable([0.5, 0.5], cfg) is None  # a slow program's few repeats
    assert is_stable([0.05, 0.051, 0.0502], cfg) is True  # one call per repeat: 3 repeats, patience 2
    assert is_stable([0.05, 0.051, 0.045], cfg) is False
    ids = [f"d|t|{i}" for i in range(2000)]
    drawn = [i for i in ids if _drawn(i, 0.05, 0)]
    assert 50 < len(drawn) < 150 and drawn == [i for i in ids if _drawn(i, 0.05, 0)]
    assert not any(_drawn(i, 0.0, 0) for i in ids)


def test_collect_for_cuda_without_a_gpu_says_so(capsys):
    from cdmpp import tvm_env

    if tvm_env.setup().cuda(0).exist:
        pytest.skip("this machine has a GPU")
    from cdmpp.cli import main

    assert main(["collect", "--target", "cuda", "--tasks", "no-such-task-name", "--per-task", "1"]) == 2
    assert "no task matches" in capsys.readouterr().err
    assert main(["collect", "--target", "cuda", "--tasks-like", "softmax", "--per-task", "1"]) == 2
    assert "no CUDA GPU visible to TVM" in capsys.readouterr().err


def test_the_fast_measurer_resumes_a_collection_the_metaschedule_one_began(tmp_path):
    """Same seeds, same programs: switching measurers never measures a stored program again."""
    from types import SimpleNamespace

    from cdmpp import tvm_env, workloads

    tvm = tvm_env.setup(1)
    from cdmpp.collect import MeasureConfig, collect

    tasks = [_task(tvm, "matmul", workloads.matmul(32, 32, 32))]
    cfg = MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0)
    target, dev, ds = tvm_env.make_target("llvm", num_cores=1), SimpleNamespace(id="d/llvm", threads=1), str(tmp_path)
    first = collect(tasks, ds, dev, target, per_task=3, cfg=cfg, fast=False, progress=False)
    assert first["measured"] == 3
    again = collect(tasks, ds, dev, target, per_task=3, cfg=cfg, progress=False)
    assert again["measured"] == 0 and again["skipped_done"] == 3
