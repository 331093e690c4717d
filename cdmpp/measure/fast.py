"""``FastMeasurer``, the fast local measurer (``Measurer`` kind ``"fast"``): a task's programs sampled, built and linked as one module in a worker
process, then run in one long-lived runner process with adaptive repeats.

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

import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import traceback

from cdmpp.errors import error_message
from cdmpp.measure.measurer import SKIP_AFTER_TIMEOUTS, Built, Measurer, Result

BUILD_SECONDS_PER_PROGRAM = 20.0  # a build job hangs past this per program (+ 60 s); builds take 1-3 s per program
STARTUP_S = 120.0  # a new runner process imports TVM
_clock = time.perf_counter  # the direct timer's clock (a test replaces it)
DIRECT_MIN_S = 1e-3  # repeats of kernels at least this long are timed around direct calls (adaptive_repeats)


# ---- build worker side ----------------------------------------------------------------------------

def _die_with_parent() -> None:
    """A worker of a collector that was SIGKILLed would otherwise wait forever (Linux: PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pin(cores: list[int] | None) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError:
            pass


def build_worker_init(threads: int, cores: list[int] | None) -> None:
    from cdmpp.program import tvm_env

    _die_with_parent()
    _pin(cores)
    tvm_env.setup(threads)



def prepare_task(task_key: str, mod_json: str, target_json: str, out_dir: str, traces: list | None = None,
                 n: int = 0, seed: int = 0, skip: frozenset = frozenset()) -> tuple[list[Built], float, int]:
    """In a build worker: the task's programs (``traces`` replayed, else ``n`` sampled with ``seed``),
    minus the program hashes in ``skip``, built into one shared library. Returns the programs (each with
    its share of the job's CPU seconds, the linker's included), the seconds spent sampling and how many
    were skipped."""
    cpu0 = _cpu_s()
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    from cdmpp.program.features import program_hash
    from cdmpp.program.inputs import apply_trace, to_json_value

    t0 = time.perf_counter()
    target = tvm.target.Target(json.loads(target_json))  # str(target) is its JSON form
    if target.kind.name == "cuda":  # its sketches use the CUDA tensor intrinsics
        tvm_env.load_cuda_intrinsics()
    mod = tvm.ir.load_json(mod_json)
    progs: list[tuple[Built, object]] = []
    seen: set[str] = set()
    skipped = 0
    if traces is not None:
        for tr in traces:
            try:
                smod = apply_trace(mod, tr)
            except Exception as e:  # a trace that no longer applies: record it, go on
                progs.append((Built(task_key, "", tr, error="trace: " + error_message(e, lines=3, limit=600)), None))
                continue
            h = program_hash(smod)
            skipped += h in skip
            if h not in skip and h not in seen:
                seen.add(h)
                progs.append((Built(task_key, h, tr), smod))
    else:
        from cdmpp.measure.schedules import sample_schedules

        for sch in sample_schedules(mod, target, n, seed=seed):
            h = program_hash(sch.mod)
            skipped += h in skip
            if h not in skip and h not in seen:
                seen.add(h)
                progs.append((Built(task_key, h, to_json_value(sch.trace.as_json())), sch.mod))
    sample_s = time.perf_counter() - t0
    todo = [(b, m) for b, m in progs if m is not None]
    if todo:
        _build(tvm, todo, target, out_dir)
    cpu = (_cpu_s() - cpu0) / max(1, len(progs))
    for b, _ in progs:
        b.cpu_s = cpu
    return [b for b, _ in progs], sample_s, skipped


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the linker)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _build(tvm, todo: list, target, out_dir: str) -> None:
    """All programs in one module; if that fails, each on its own so one bad program costs only itself."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    funcs = {}
    for i, (b, smod) in enumerate(todo):
        b.fname = f"cdmpp_p{i}"
        func = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(smod)["main"]
        b.args = [(str(a.dtype), [int(x) for x in a.shape]) for a in ArgInfo.from_prim_func(func)]
        funcs[b.fname] = func.with_attr("global_symbol", b.fname)
    t0 = time.perf_counter()
    try:
        so = _compile(tvm, funcs, target, out_dir)
        per = (time.perf_counter() - t0) / len(todo)
        for b, _ in todo:
            b.so, b.build_s = so, per
        return
    except Exception:
        pass
    for b, _ in todo:
        t1 = time.perf_counter()
        try:
            b.so = _compile(tvm, {b.fname: funcs[b.fname]}, target, out_dir)
        except Exception as e:
            b.error = "build: " + error_message(e, lines=3, limit=600)
        b.build_s = time.perf_counter() - t1


def _compile(tvm, funcs: dict, target, out_dir: str) -> str:
    rt = tvm.tirx.build(tvm.IRModule(funcs), target=target)
    fd, path = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    rt.export_library(path)
    return path


# ---- runner process side --------------------------------------------------------------------------

def runner_main(conn, threads: int, cores: list[int] | None, device_type: str = "cpu") -> None:
    """Serve ``(so, fname, args, cfg)`` requests: answer ``("ok", seconds)`` or ``("error", message)``."""
    _die_with_parent()
    _pin(cores)
    from cdmpp.program import tvm_env

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


class Runner:
    """The parent's handle on the runner process: one request at a time, a hard timeout, restart on
    a crash or a timeout (the program in flight is recorded with the error, the next one runs)."""

    def __init__(self, threads: int, cores: list[int] | None, timeout_s: float, device_type: str = "cpu"):
        self.threads, self.cores, self.timeout_s, self.device_type = threads, cores, timeout_s, device_type
        self.proc = self.conn = None
        self.ready = False

    def start(self) -> None:
        """Start the process (it imports TVM meanwhile); ``run`` waits until it is ready."""
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=runner_main, args=(child, self.threads, self.cores, self.device_type),
                                daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def _start(self) -> None:
        if self.proc is None or not self.proc.is_alive():
            self.start()
        if self.ready:
            return
        if not self.conn.poll(STARTUP_S) or self.conn.recv()[0] != "ready":  # TVM's import, not a run
            self.close(kill=True)
            raise RuntimeError(f"the runner process did not start within {STARTUP_S} s")
        self.ready = True

    def run(self, b: Built, cfg: dict) -> tuple[list[float] | None, str | None]:
        if self.proc is None or not self.proc.is_alive() or not self.ready:
            self._start()
        self.conn.send((b.so, b.fname, b.args, cfg))
        if not self.conn.poll(self.timeout_s):
            self.close(kill=True)
            return None, f"Timeout: runner killed after {self.timeout_s:g} s"
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            code = self.proc.exitcode if self.proc else None
            self.close(kill=True)
            return None, f"runner process died (exit code {code})"
        if kind != "ok" and self.device_type != "cpu":  # the runner exits after a GPU error: start afresh
            self.close(kill=True)
        return (value, None) if kind == "ok" else (None, "run: " + value)

    def close(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        try:
            if kill:
                self.proc.kill()
            else:
                self.conn.send(None)
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        except (OSError, ValueError):
            pass
        self.proc = self.conn = None
        self.ready = False


def runner_cfg(cfg) -> dict:
    return {"repeat": cfg.repeat, "min_repeat_ms": cfg.min_repeat_ms, "run_budget_s": cfg.run_budget_s,
            "min_repeats": cfg.min_repeats, "stable_tol": cfg.stable_tol, "stable_patience": cfg.stable_patience,
            "min_repeats_long": cfg.min_repeats_long}


def wait_stoppable(futures, timeout: float | None = None) -> bool:
    """Wait for all ``futures`` in one-second slices, so a stop signal never waits on a long build (it
    raises KeyboardInterrupt); False if ``timeout`` seconds passed first."""
    from cdmpp.measure.stop import STOP

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
        if not cf.wait(futures, timeout=left).not_done:
            return True
        if STOP.is_set():
            raise KeyboardInterrupt
        if deadline is not None and time.monotonic() >= deadline:
            return False


def build_budget(job: dict) -> float:
    """Seconds a task's build job may be waited on before it counts as hung."""
    return BUILD_SECONDS_PER_PROGRAM * max(1, len(job.get("traces") or ()) or job.get("n", 1)) + 60


def next_ready(queue, budget: float):
    """Remove and return the first ``(job, future, pool)`` of ``queue`` whose build is done, waiting until
    one is; the head, done or not, once ``budget`` seconds pass. Taking builds as they finish, not in the
    order submitted, a task slow to sample or build holds up only its own worker, not all those behind it."""
    from cdmpp.measure.stop import STOP

    deadline = time.monotonic() + budget
    while True:
        for i, item in enumerate(queue):
            if item[1].done():
                del queue[i]
                return item
        if STOP.is_set():
            raise KeyboardInterrupt
        left = deadline - time.monotonic()
        if left <= 0:
            return queue.popleft()
        cf.wait([f for _, f, _ in queue], timeout=min(1.0, left), return_when=cf.FIRST_COMPLETED)


class Builders:
    """A process pool that prepares tasks (``prepare_task``); a crashed or hung pool is replaced."""

    def __init__(self, workers: int, threads: int, cores: list[int] | None, out_dir: str):
        self.workers, self.threads, self.cores, self.out_dir = workers, threads, cores, out_dir
        self.pool = None

    def submit(self, **job) -> cf.Future:
        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                               initializer=build_worker_init, initargs=(self.threads, self.cores))
        return self.pool.submit(prepare_task, out_dir=self.out_dir, **job)

    def result(self, fut: cf.Future) -> tuple[list[Built] | None, float, int, str | None]:
        """The job's outcome. The caller has waited the job's budget: a job not done by now has hung, and
        the pool is replaced."""
        if not fut.done():
            self.close(kill=True)
            return None, 0.0, 0, "build: timed out"
        try:
            return (*fut.result(), None)
        except cf.process.BrokenProcessPool:
            self.close(kill=True)
            return None, 0.0, 0, "build: worker process crashed"
        except Exception as e:
            return None, 0.0, 0, "build: " + error_message(e, lines=3, limit=600)

    def close(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        if kill:
            for p in list((getattr(self.pool, "_processes", None) or {}).values()):
                try:
                    p.kill()
                except OSError:
                    pass
        self.pool.shutdown(wait=not kill, cancel_futures=True)
        self.pool = None


def _signal(pid: int, sig) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Processes below ``pid`` (Linux /proc), parents before children."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(0), []):
            out.append(c)
            todo.append(c)
    return out


def default_overlap(threads: int, device_type: str = "cpu") -> bool:
    """Overlap unless told otherwise: 1-thread CPU programs on a machine with more cores (on this 2-core
    VM it kept the labels as good as without it, datasets/README.md "The fast measurer"), and GPU programs
    (the host's other cores build while the GPU runs; without overlap only ``--builders`` workers build)."""
    spare = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1
    return spare and (device_type != "cpu" or threads == 1)


def cores_for(threads: int, overlap: bool) -> tuple[list[int] | None, list[int] | None]:
    """(runner cores, builder cores): with overlap the runner gets the first ``threads`` cores alone."""
    if not overlap or not hasattr(os, "sched_getaffinity"):
        return None, None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= threads:
        raise ValueError(f"--overlap needs more than {threads} core(s); this process may use {len(cores)}")
    return cores[:threads], cores[threads:]


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class FastMeasurer(Measurer):
    """Prepares tasks in build workers and runs their programs in the runner process, guarded like
    ``cdmpp.measure.metaschedule.MetaScheduleMeasurer``: no program runs while another process is busy (``CpuGuard``), a task
    whose run phase others disturbed is run again, ``PAUSE`` files pause it, a stop signal ends it
    after the program in flight (KeyboardInterrupt)."""

    kind = "fast"

    def __init__(self, target, cfg, threads: int, pause_dir: str | None = None, overlap: bool | None = None):
        from cdmpp.measure.guard import CpuGuard
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
        self.builders = Builders(workers, threads, build_cores, self.tmp_root)
        # overlap: one more build worker on the runner's cores, stopped (SIGSTOP) while a task runs, so
        # that those cores build whenever the runner waits for a build
        self.helper = (Builders(1, threads, run_cores, self.tmp_root)
                       if overlap and getattr(cfg, "idle_builder", False) and hasattr(signal, "SIGSTOP") else None)
        self.runner = Runner(threads, run_cores, cfg.run_timeout_s + cfg.kill_grace_s, self.device_type)
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
        if not stop:
            pids, self._held = self._held, []
            for pid in pids:
                _signal(pid, signal.SIGCONT)
            return
        pool = self.helper.pool if self.helper else None
        for p in list((getattr(pool, "_processes", None) or {}).values()):
            if _signal(p.pid, signal.SIGSTOP):  # first the worker, so that it starts no new child
                self._held.append(p.pid)
                for child in _descendants(p.pid):
                    if _signal(child, signal.SIGSTOP):
                        self._held.append(child)

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
                progs, sample_s, skipped, err = pool.result(fut)
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
                secs, err = self.runner.run(b, rcfg)
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
