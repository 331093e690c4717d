"""The fast measurer: adaptive repeats, crashes and timeouts, pausing."""

import os
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


def _repeats(monkeypatch, seconds, **cfg):
    from cdmpp.measure import fast as fastmeasure

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


@pytest.mark.slow
def test_fast_measurer_runs_crashes_and_timeouts_without_losing_the_next_program(tmp_path):
    """Integer inputs are zeros (valid indices); a kernel that kills the runner process and one that runs
    past the timeout are recorded with their error, and the next program is measured."""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm = tvm_env.setup(1)
    from cdmpp.measure.fast import FastMeasurer
    from cdmpp.measure.measurer import MeasureConfig

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


@pytest.mark.slow
def test_a_paused_fast_collection_waits_and_honours_a_stop(tmp_path):
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm = tvm_env.setup(1)
    from cdmpp.measure.fast import FastMeasurer
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.stop import STOP

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


def test_overlap_by_default_for_one_thread_cpu_and_for_gpu_programs_with_cores_to_spare():
    from cdmpp.measure.processes import default_overlap

    spare = len(os.sched_getaffinity(0)) > 1
    assert default_overlap(1, "cpu") == spare
    assert not default_overlap(len(os.sched_getaffinity(0)), "cpu")
    assert default_overlap(1, "cuda") == spare  # the host builds while the GPU runs


def test_the_helper_builder_and_its_children_are_stopped_while_a_task_runs():
    """The helper build worker shares the runner's core; while a task runs it and whatever it started (the
    linker) are stopped, and continued afterwards."""
    import subprocess
    import types

    from cdmpp.measure.fast import FastMeasurer

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

        def settled(want):  # a signal is delivered asynchronously: give the kernel a moment on a busy machine
            deadline = time.monotonic() + 5
            while not want(states()) and time.monotonic() < deadline:
                time.sleep(0.01)
            return want(states())

        m._hold_helper(True)
        assert len(m._held) == 2 and settled(lambda s: set(s) == {"T"})
        m._hold_helper(False)
        assert m._held == [] and settled(lambda s: "T" not in s)
    finally:
        from cdmpp.measure.processes import descendants

        for pid in descendants(worker.pid):
            os.kill(pid, 9)
        worker.kill()
        worker.wait()


def test_a_stop_signal_does_not_wait_for_a_build_in_flight():
    """A build may take minutes; the collector waits on it in short slices, so a stop ends it at once."""
    import concurrent.futures as cf
    import threading
    import time

    from cdmpp.measure.processes import wait_stoppable
    from cdmpp.measure.stop import STOP

    never = cf.Future()
    assert wait_stoppable([never], timeout=0.2) is False
    done = cf.Future()
    done.set_result(1)
    assert wait_stoppable([done]) is True
    threading.Timer(0.3, STOP.set).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            wait_stoppable([never], timeout=600)
    finally:
        STOP.clear()
    assert time.monotonic() - t0 < 3


def test_builds_are_taken_as_they_finish_and_a_hung_head_is_given_up_after_its_budget():
    """A slow task's build holds up only its own worker: the measurer takes whichever build is done first."""
    import concurrent.futures as cf
    from collections import deque

    from cdmpp.measure.processes import next_ready

    slow, fast, later = cf.Future(), cf.Future(), cf.Future()
    queue = deque([("slow", slow, None), ("fast", fast, None), ("later", later, None)])
    fast.set_result("built")
    assert next_ready(queue, budget=5)[0] == "fast"
    t0 = time.monotonic()
    assert next_ready(queue, budget=0.3)[0] == "slow"  # nothing done within the budget: the head
    assert 0.25 <= time.monotonic() - t0 < 2
    later.set_result("built")
    assert next_ready(queue, budget=5)[0] == "later" and not queue
