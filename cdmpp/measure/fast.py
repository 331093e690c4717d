"""``FastMeasurer``, the fast local measurer (``Measurer`` kind ``"fast"``): a task's programs sampled,
built and linked as one module in a worker process (``cdmpp.measure.fast_build``), then run in one
long-lived runner process with adaptive repeats (here). Starting, timing out, killing and pausing those
processes is ``cdmpp.measure.processes``'s.

Why not MetaSchedule's ``LocalBuilder``/``LocalRunner`` (``cdmpp.measure.metaschedule``): per program they
export a tar, link it with gcc in the runner, load it, and go through a process-pool round trip; the
builder starts a new pool (and imports TVM) per batch. Here one ``tvm.tirx.build`` of an IRModule that
holds all of a task's schedules (each PrimFunc under its own symbol) is linked once into one ``.so``,
loaded once, and each function is timed in the same process. The generated code is the same: the same
``RemoveWeightLayoutRewriteBlock`` + ``tvm.tirx.build`` as MetaSchedule's default builder. A task's
programs take the same buffers, so the runner allocates and fills them once per task (random floats,
zero integers: random indices read out of bounds).

Repeats are adaptive: after a probe run (after TVM's warm-up call) fixes how many calls make one repeat
last ``min_repeat_ms``, repeats are taken until the fastest one has not improved by more than
``stable_tol`` for ``stable_patience`` repeats (at least ``min_repeats``, at most ``repeat``, within
``run_budget_s``). A kernel whose one call fills a repeat counts its probe as the first repeat and needs
``min_repeats_long`` (patience at most one fewer). The label is still the fastest repeat
(``cdmpp.records.labels.label``).

Overlap (the default for 1-thread CPU and for GPU programs on a machine with 2+ cores, ``default_overlap``): the
runner is pinned to core 0 and the build workers to the other cores, and the next tasks are built while
one runs.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import tempfile
import time
import traceback

from cdmpp.errors import error_message
from cdmpp.measure.measurer import SKIP_AFTER_TIMEOUTS, Built, Measurer, Result
from cdmpp.measure.fast_build import build_worker_init, prepare_task
from cdmpp.measure.processes import (Builders, Runner, cores_for, default_overlap, die_with_parent, hold, next_ready,
                                     pin, release, wait_stoppable)

BUILD_SECONDS_PER_PROGRAM = 20.0  # a build job hangs past this per program (+ 60 s); builds take 1-3 s per program
_clock = time.perf_counter  # the direct timer's clock (a test replaces it)
DIRECT_MIN_S = 1e-3  # repeats of kernels at least this long are timed around direct calls (adaptive_repeats)


# ---- runner process side --------------------------------------------------------------------------

def runner_main(conn, threads: int, cores: list[int] | None, device_type: str = "cpu") -> None:
    """Serve ``(so, fname, args, cfg)`` requests: answer ``("ok", seconds)`` or ``("error", message)``
    (the runner process of ``cdmpp.measure.processes.Runner``)."""
    die_with_parent()
    pin(cores)
    from cdmpp.program import tvm_env

    tvm_env.keep_torch_out()
    tvm = tvm_env.setup(threads)
    import numpy as np

    fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")
    dev = tvm.device(device_type, 0)
    loaded: tuple[str | None, object] = (None, None)
    inputs: dict = {}
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        so, fname, args, cfg = msg
        try:
            if loaded[0] != so:
                loaded, inputs = (so, tvm.runtime.load_module(so)), {}
            key = repr(args)  # a task's programs take the same buffers: filled once per task
            if key not in inputs:
                arrays = []
                for dtype, shape in args:
                    a = tvm.runtime.empty(shape, dtype, dev)
                    if dtype.startswith(("int", "uint", "bool")):  # indices: random ones read out of bounds
                        a.copyfrom(np.zeros(shape, dtype=dtype))
                    else:
                        fill(a)
                    arrays.append(a)
                inputs = {key: arrays}
            conn.send(("ok", adaptive_repeats(loaded[1], fname, dev, inputs[key], cfg)))
        except Exception as e:
            conn.send(("error", error_message(f"{e}\n{traceback.format_exc(limit=1)}", lines=3, limit=600)))
            if device_type != "cpu":  # a failed kernel (illegal address, ...) leaves the GPU context unusable
                return


def adaptive_repeats(rt_mod, fname: str, dev, arrays: list, cfg: dict) -> list[float]:
    """Seconds of each repeat; stops once the fastest repeat is stable (module docstring).

    TVM's ``time_evaluator`` makes one untimed call before it times ("skip first time call"), so the probe
    is the warm-up plus one warm timed call, and a repeat taken with a fresh evaluator would cost one more
    call each: for a kernel longer than ``min_repeat_ms`` (one call per repeat) that doubled its run time.
    So the probe counts as the first repeat when one call fills a repeat, and repeats of kernels of at
    least ``DIRECT_MIN_S`` are timed here around direct calls (Python's call overhead, about a microsecond,
    is < 0.1 % of them); shorter ones keep TVM's evaluator, whose extra call is 1/number of a repeat."""
    probe = rt_mod.time_evaluator(fname, dev, number=1, repeat=1)
    dev.sync()
    t = float(probe(*arrays).results[0])
    budget = cfg["run_budget_s"]
    if 2 * t > budget:  # too slow for two more runs: seconds-long runs vary little
        return [t]
    number = max(1, math.ceil(cfg["min_repeat_ms"] / 1e3 / max(t, 1e-9)))
    kind = getattr(dev, "dlpack_device_type", None)
    if t >= DIRECT_MIN_S and (kind is None or int(kind()) == 1):  # CPU (kDLCPU); GPUs keep TVM's timer
        f = rt_mod.get_function(fname)

        def timed() -> float:
            t0 = _clock()
            for _ in range(number):
                f(*arrays)
            dev.sync()
            return (_clock() - t0) / number
    else:
        ev = rt_mod.time_evaluator(fname, dev, number=number, repeat=1)

        def timed() -> float:
            return float(ev(*arrays).results[0])
    secs: list[float] = []
    best, since, spent = math.inf, 0, 2 * t
    need, patience = cfg["min_repeats"], cfg["stable_patience"]
    if number == 1:  # the probe's call came after a warm-up and fills a repeat by itself
        secs, best = [t], t
        need = cfg.get("min_repeats_long", need)
        patience = max(1, min(patience, need - 1))
    while len(secs) < cfg["repeat"]:
        if len(secs) >= 2 and spent + secs[-1] * number > budget:
            break
        s = timed()
        secs.append(s)
        spent += s * number
        if s < best * (1 - cfg["stable_tol"]):
            since = 0
        else:
            since += 1
        best = min(best, s)
        if len(secs) >= need and since >= patience:
            break
    return secs


def runner_cfg(cfg) -> dict:
    return {"repeat": cfg.repeat, "min_repeat_ms": cfg.min_repeat_ms, "run_budget_s": cfg.run_budget_s,
            "min_repeats": cfg.min_repeats, "stable_tol": cfg.stable_tol, "stable_patience": cfg.stable_patience,
            "min_repeats_long": cfg.min_repeats_long}


def build_budget(job: dict) -> float:
    """Seconds a task's build job may be waited on before it counts as hung."""
    return BUILD_SECONDS_PER_PROGRAM * max(1, len(job.get("traces") or ()) or job.get("n", 1)) + 60


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class FastMeasurer(Measurer):
    """Prepares tasks in build workers and runs their programs in the runner process, guarded like
    ``cdmpp.measure.metaschedule.MetaScheduleMeasurer``: no program runs while another process is busy (``CpuGuard``), a task
    whose run phase others disturbed is run again, ``PAUSE`` files pause it, a stop signal ends it
    after the program in flight (KeyboardInterrupt)."""

    kind = "fast"

    def __init__(self, target, cfg, threads: int, pause_dir: str | None = None, overlap: bool | None = None):
        from cdmpp.devices.guard import CpuGuard
        from cdmpp.measure.stop import ROOT_PREFIX, _remove_stale_roots
        from cdmpp.program import tvm_env

        tvm_env.setup(threads)
        _remove_stale_roots()
        self.tmp_root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-")
        self.device_type = "cuda" if "gpu" in [str(k) for k in target.keys] else "cpu"
        if overlap is None:
            overlap = default_overlap(threads, self.device_type)
        self.target_json, self.cfg, self.overlap = str(target), cfg, overlap
        run_cores, build_cores = cores_for(threads, overlap)
        workers = len(build_cores) if overlap else cfg.builders
        job = functools.partial(prepare_task, out_dir=self.tmp_root)
        self.builders = Builders(workers, job, build_worker_init, (threads, build_cores))
        # overlap: one more build worker on the runner's cores, stopped (SIGSTOP) while a task runs, so
        # that those cores build whenever the runner waits for a build
        self.helper = (Builders(1, job, build_worker_init, (threads, run_cores))
                       if overlap and getattr(cfg, "idle_builder", False) and hasattr(signal, "SIGSTOP") else None)
        # a failed GPU kernel (illegal address, ...) leaves the context unusable: the runner exits after it
        self.runner = Runner(runner_main, (threads, run_cores, self.device_type), cfg.run_timeout_s + cfg.kill_grace_s,
                             restart_after_error=self.device_type != "cpu")
        self.ahead = workers + 1 + 2 * bool(self.helper) if overlap else 2 * workers
        self._held: list[int] = []  # helper processes stopped while a task runs
        self.guard = CpuGuard()
        self.pause_dir = pause_dir
        self.on_wait = None  # callback(seconds waited) while waiting for a quiet machine or a pause
        self.times = {"wait_build": 0.0, "run": 0.0, "rerun": 0.0, "wait_quiet": 0.0, "paused": 0.0,
                      "sample_cpu": 0.0, "build_cpu": 0.0, "worker_cpu": 0.0}
        self.skipped = 0  # programs already stored
        self._quiet = False  # the last run phase saw a quiet machine: no need to wait a second first

    def close(self) -> None:
        from cdmpp.measure.stop import STOP

        self.builders.close(kill=True)
        if self.helper:
            self.helper.close(kill=True)
        # stopped (a signal, the budget): the runner holds nothing to keep, and may still be importing TVM,
        # deaf to a polite request for 5 s
        self.runner.close(kill=STOP.is_set())
        remove_dir(self.tmp_root)

    def _hold_helper(self, stop: bool) -> None:
        """Stop (or continue) the helper build worker and its children (the linker it may be running):
        they may use the runner's cores only between runs."""
        if stop:
            self._held += hold(self.helper.pool if self.helper else None)
        else:
            pids, self._held = self._held, []
            release(pids)

    def provenance(self) -> dict:
        return {"measurer": self.kind, "overlap": self.overlap}

    def measure_jobs(self, jobs):
        """``Measurer.measure_jobs``: as their builds finish with overlap, else in the order given."""
        from collections import deque

        from cdmpp.measure.stop import STOP, _measuring

        jobs, queue = iter(jobs), deque()

        def pending(pool):
            return sum(1 for _, f, q in queue if q is pool and not f.done())

        def refill():
            while len(queue) < self.ahead:
                job = next(jobs, None)
                if job is None:
                    return
                pool = self.helper if self.helper and pending(self.helper) < pending(self.builders) else self.builders
                queue.append((job, pool.submit(target_json=self.target_json, **job), pool))

        _measuring.set()
        try:
            refill()
            if self.runner.proc is None:  # it imports TVM while the first tasks build
                self.runner.start()
            while queue:
                if STOP.is_set():
                    raise KeyboardInterrupt
                t0 = time.perf_counter()
                if self.overlap:  # builds as they finish; the head's budget bounds the wait
                    job, fut, pool = next_ready(queue, build_budget(queue[0][0]))
                else:  # nothing builds while a program runs: all first; a hung one is given up after its budget
                    wait_stoppable([f for _, f, _ in queue], max(build_budget(j) for j, _, _ in queue))
                    job, fut, pool = queue.popleft()
                value, err = pool.result(fut)
                progs, sample_s, skipped = value if value is not None else (None, 0.0, 0)
                self.times["wait_build"] += time.perf_counter() - t0
                if self.overlap:
                    refill()
                if progs is None:  # the whole job failed: one record per program is impossible (unknown)
                    yield job, err
                    if not self.overlap and not queue:
                        refill()
                    continue
                self.times["sample_cpu"] += sample_s
                self.times["worker_cpu"] += sum(b.cpu_s for b in progs)
                self.skipped += skipped
                self.times["build_cpu"] += sum(b.build_s for b in progs)
                self._hold_helper(True)
                try:
                    results = self._run_task(progs)
                finally:
                    self._hold_helper(False)
                yield job, results
                for so in {b.so for b in progs if b.so}:
                    try:
                        os.remove(so)
                    except OSError:
                        pass
                if not self.overlap and not queue:
                    refill()
        finally:
            _measuring.clear()

    def _paused(self) -> bool:
        from cdmpp.measure.stop import pause_files

        return bool(self.pause_dir and pause_files(self.pause_dir))

    def _wait_while_paused(self) -> None:
        from cdmpp.measure.stop import STOP

        t0 = time.monotonic()
        while self._paused():
            if STOP.is_set():
                raise KeyboardInterrupt
            if self.on_wait:
                self.on_wait(time.monotonic() - t0, "paused")
            time.sleep(1)
        if time.monotonic() - t0 > 1:
            self._quiet = False  # whatever ran during the pause may still run
        self.times["paused"] += time.monotonic() - t0

    def _run_task(self, progs: list[Built]) -> list:
        from cdmpp.measure.stop import STOP

        cfg, rcfg = self.cfg, runner_cfg(self.cfg)
        ok = [b for b in progs if b.error is None]
        tries, results, others = 0, [], 0.0
        while ok:
            self._wait_while_paused()
            if not self._quiet:
                t0 = time.monotonic()
                self.guard.wait_quiet(cfg.quiet_share, cfg.max_wait_s,
                                      lambda w: self.on_wait and self.on_wait(w, "waiting for a quiet machine"),
                                      stop=STOP)
                self.times["wait_quiet"] += time.monotonic() - t0
            mark, t0 = self.guard.start(), time.perf_counter()
            results, timeouts = [], 0
            for b in ok:
                if STOP.is_set():
                    raise KeyboardInterrupt
                if self._paused():
                    results = None
                    break
                if timeouts >= SKIP_AFTER_TIMEOUTS:
                    results.append((None, f"skipped: {SKIP_AFTER_TIMEOUTS} programs of this task timed out in this batch"))
                    continue
                secs, err = self.runner.request((b.so, b.fname, b.args, rcfg))
                timeouts += bool(err and "Timeout" in err)
                results.append((secs, err))
            self.times["rerun" if tries else "run"] += time.perf_counter() - t0
            if results is None:  # paused midway: whatever ran meanwhile disturbed this phase
                self._quiet = False
                continue
            others = self.guard.others_share(mark)
            tries += 1
            self._quiet = others < cfg.quiet_share
            if self._quiet or tries >= cfg.max_tries:
                break
        by_prog = dict(zip(map(id, ok), results))
        out = []
        for b in progs:
            if b.error is not None:
                out.append(Result(b, [], b.error, 0.0))
            else:
                secs, err = by_prog[id(b)]
                out.append(Result(b, [] if err else [float(s) for s in secs], err, others))
        return out
