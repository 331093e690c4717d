"""``cdmpp collect``: measure random valid schedules of real network tasks on a real device.

For each task (from a ``TaskTable``), ``per_task`` distinct schedules are drawn from MetaSchedule's
design space with a seed derived from the task key, so a restarted collection draws the same programs
and skips those already stored (records are keyed by device, task and program hash). Programs are
built in parallel with MetaSchedule's ``LocalBuilder`` and then run *serially, with the builders idle*
by its ``LocalRunner`` (or ``RPCRunner`` for a remote device), so that no build disturbs a
measurement. Every repeat's seconds are stored; the label is the fastest repeat.

Measurement settings (``MeasureConfig``) aim at run-to-run noise ≤ 3 % median: each repeat runs the
kernel enough times to last ``min_repeat_ms`` (timer noise becomes negligible) and the label is the
*minimum* of ``repeat`` repeats: on a shared VM disturbances only ever add time, so the fastest repeat
is the most reproducible statistic. Measured back to back on the same built programs here
(``benchmarks/noise_ab.py``, 2 threads): median of 5×40 ms 3.9 % median / 16.6 % p90 difference, min of
5×40 ms 2.2 % / 9.1 %, min of 15×15 ms 0.8 % / 7.0 % (the default). TVM's thread pool pins its threads
to cores. Caches are warm (TVM's default runner); pass ``--cache-flush`` to flush them before each repeat.
Integer inputs (gather indices of ``take`` and the like) are zero-filled: random integers index out of
bounds and crash the runner.
Create the file ``PAUSE`` in the dataset folder to pause (delete it to go on): builds in flight finish,
no further program runs, and a run phase it interrupted is run again in full once resumed. To stop,
send SIGTERM or press Ctrl-C (``cdmpp.cli``): the run ends after the program in flight, keeps every
finished batch and removes what it built; ``collect`` or ``remeasure`` run again resumes it.

Other processes are the main source of noise on a small machine: a 2-thread kernel whose second
thread is descheduled waits a whole time slice at its barrier (a 10 µs kernel measured 100x slower
while another process was busy). So every run phase is guarded by ``CpuGuard``: it waits until the
CPU time used by processes outside the collector stays under ``quiet_share`` for a second, measures,
and re-measures the batch (up to ``max_tries``) if others used more than ``quiet_share`` meanwhile.
Records keep the share of CPU that others used during their run (``others_cpu``).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from cdmpp import tvm_env
from cdmpp.store import RecordStore, is_disturbed, record_id


@dataclass
class MeasureConfig:
    repeat: int = 15
    min_repeat_ms: int = 15
    number: int = 1
    cache_flush: bool = False
    build_timeout_s: float = 60.0
    run_timeout_s: float = 30.0
    kill_grace_s: float = 10.0  # past run_timeout_s, the collector kills a runner worker that did not stop
    run_budget_s: float = 2.0  # seconds of repeats per program: slower programs get fewer (run_within_budget)
    builders: int = 2
    quiet_share: float = 0.05  # max CPU share (of all cores) other processes may use while we measure
    max_tries: int = 10
    max_wait_s: float = 1800.0
    # adaptive repeats (the fast measurer, ``cdmpp.fastmeasure``): stop once the fastest repeat has not
    # improved by more than ``stable_tol`` for ``stable_patience`` repeats, after at least ``min_repeats``
    min_repeats: int = 5
    stable_tol: float = 0.01
    stable_patience: int = 3
    # kernels that fill a repeat with one call (>= min_repeat_ms): at least this many repeats, the probe
    # included, and a patience of at most one fewer (their repeats vary little; each costs a whole call)
    min_repeats_long: int = 3
    # fast measurer with overlap: one more build worker on the runner's cores, stopped while programs run
    idle_builder: bool = True


def task_seed(key: str, seed: int) -> int:
    return int(hashlib.sha256(f"{key}:{seed}".encode()).hexdigest()[:8], 16)


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class CpuGuard:
    """CPU time used by processes outside this process tree, from /proc (Linux); inert elsewhere."""

    def __init__(self):
        self.enabled = os.path.exists("/proc/stat")
        self.ncpu = os.cpu_count() or 1

    @staticmethod
    def _busy_total() -> float:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4]  # all but idle and iowait

    @staticmethod
    def _tree() -> float:
        """CPU time of this process and all its descendants, including descendants that already exited
        (cutime + cstime): a runner worker killed after a timeout must not count as another process."""
        me = os.getpid()
        parent, times = {}, {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(fields[1])
            times[int(d)] = sum(float(x) for x in fields[11:15])
        total, ours = 0.0, {me}
        changed = True
        while changed:
            changed = False
            for pid, pp in parent.items():
                if pp in ours and pid not in ours:
                    ours.add(pid)
                    changed = True
        for pid in ours:
            total += times.get(pid, 0.0)
        return total

    def start(self):
        return (time.monotonic(), self._busy_total(), self._tree()) if self.enabled else None

    def others_share(self, mark) -> float:
        """Share of all cores' time used by other processes since ``mark``."""
        if not mark:
            return 0.0
        t0, busy0, ours0 = mark
        dt = time.monotonic() - t0
        ticks = os.sysconf("SC_CLK_TCK") * dt * self.ncpu
        other = (self._busy_total() - busy0) - (self._tree() - ours0)
        return max(0.0, other / ticks) if ticks > 0 else 0.0

    def wait_quiet(self, share: float, max_wait_s: float, on_wait=None, stop: threading.Event | None = None) -> float:
        """Block until others use < ``share`` of the CPU over one second (at most ``max_wait_s``, then go
        on: the run is marked disturbed if others stay busy); returns seconds waited. ``stop`` set:
        KeyboardInterrupt, so a stop signal is honoured while waiting."""
        if not self.enabled:
            return 0.0
        t0 = time.monotonic()
        while time.monotonic() - t0 < max_wait_s:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            mark = self.start()
            time.sleep(1.0)
            if self.others_share(mark) < share:
                break
            if on_wait:
                on_wait(time.monotonic() - t0)
        return time.monotonic() - t0


def _fill_for_measure(fill):
    """Random floats (TVM's measure fill) but zeros for integer tensors, which are indices more often
    than not: random ones read out of bounds and kill the runner."""
    def f(arr):
        if str(arr.dtype).startswith(("int", "uint", "bool")):
            import numpy as np

            arr.copyfrom(np.zeros(tuple(arr.shape), dtype=str(arr.dtype)))
        else:
            fill(arr)
    return f


def alloc_local_arguments(device, args_info, alloc_repeat):
    """``f_alloc_argument`` of the local runner (runs in its worker process)."""
    import tvm
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

    fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")
    return alloc_argument_common(_fill_for_measure(fill), device, args_info, alloc_repeat)


def alloc_rpc_arguments(session, device, args_info, alloc_repeat):
    """``f_alloc_argument`` of the RPC runner: the same fill, through the remote session."""
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

    fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
    return alloc_argument_common(_fill_for_measure(fill), device, args_info, alloc_repeat)


def run_within_budget(rt_mod, device, evaluator_config, repeated_args, budget_s: float = 2.0):
    """``f_run_evaluator`` of the runners: TVM's evaluator, but a slow program gets fewer repeats.

    A probe run (also the warm-up) gives the program's time ``t``; then it is timed
    ``budget_s / max(t, min_repeat_ms)`` times, at most ``cfg.repeat``; a program too slow for two
    repeats keeps its probe time alone (seconds-long runs vary little). Without this a random schedule
    that runs 2 s needed 15 x 2 s, hit the 30 s run timeout and was lost, and a task full of such
    schedules (a 40-GFLOP matmul of gpt2_small at batch 8) stalled the collection for a quarter of an
    hour per batch.
    """
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    probe = rt_mod.time_evaluator(rt_mod.entry_name, dev=device, number=1, repeat=1)
    device.sync()
    t = float(probe(*repeated_args[0]).results[0])
    repeat = min(evaluator_config.repeat, int(budget_s / max(t, evaluator_config.min_repeat_ms / 1e3)))
    if repeat < 2:
        return [t]
    return run_evaluator_common(rt_mod, device, evaluator_config._replace(repeat=repeat), repeated_args)


def run_within_budget_rpc(session, rt_mod, device, evaluator_config, repeated_args, budget_s: float = 2.0):
    """The same for the RPC runner (its evaluator takes the session first)."""
    return run_within_budget(rt_mod, device, evaluator_config, repeated_args, budget_s)


def pause_files(dataset_dir: str) -> list[str]:
    """Files named ``PAUSE`` or ``PAUSE.<anything>`` in the dataset folder or its parent
    (``datasets/PAUSE.accuracy`` pauses a collection into ``datasets/measurements``): whoever trains or
    tests creates one of their own and removes it after, without touching anyone else's."""
    out = []
    for d in {os.path.abspath(dataset_dir), os.path.dirname(os.path.abspath(dataset_dir))}:
        try:
            out += [os.path.join(d, n) for n in os.listdir(d) if n == "PAUSE" or n.startswith("PAUSE.")]
        except OSError:
            pass
    return sorted(out)


ROOT_PREFIX = "cdmpp-measure-"  # + pid: the Measurer's temporary folder
STOP = threading.Event()  # a stop signal came (``request_stop``): Measurers stop before their next build or run
_measuring = threading.Event()  # a Measurer is inside ``measure``


def request_stop() -> bool:
    """For a signal handler. True if a Measurer is measuring: it stops before its next build or run, and
    the handler should raise nothing (a KeyboardInterrupt raised inside TVM's callbacks was swallowed by
    TVM, or left a lock of its worker pool held). False: the handler should raise KeyboardInterrupt."""
    STOP.set()
    return _measuring.is_set()


def _remove_stale_roots() -> None:
    """Temporary folders of Measurers whose process is gone (killed with SIGKILL, or the machine rebooted
    with /tmp kept): each holds at most the one batch that was being built and run."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), ROOT_PREFIX + "*-*")):
        pid = os.path.basename(path)[len(ROOT_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: another user's process, alive
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def export_into(root: str, mod) -> str:
    """``f_export`` of the builder: TVM's default export, but into a folder under ``root``, so that the
    artifacts of a run that is stopped midway go when ``root`` goes (``Measurer.close``)."""
    from tvm.support.tar import tar

    path = os.path.join(tempfile.mkdtemp(dir=root), "tvm_tmp_mod." + tar.output_format)
    mod.export_library(path, fcompile=tar)
    return path


class Measurer:
    """Builds a batch in parallel, then runs it serially, one program at a time, on a quiet machine.

    Everything it builds lives in a temporary folder of its own, removed by ``close`` (or ``with``)."""

    def __init__(self, target, cfg: MeasureConfig, rpc: tuple[str, int, str] | None = None,
                 pause_flag: str | None = None, artifact_dir: str | None = None):
        tvm = tvm_env.setup()
        from tvm.s_tir import meta_schedule as ms

        self.ms, self.target, self.cfg = ms, target, cfg
        _remove_stale_roots()
        self.tmp_root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-")
        self.builder = ms.builder.LocalBuilder(max_workers=cfg.builders, timeout_sec=cfg.build_timeout_s,
                                               initializer=tvm_env.worker_initializer,
                                               f_export=functools.partial(export_into, self.tmp_root))
        evaluator = ms.runner.EvaluatorConfig(number=cfg.number, repeat=cfg.repeat,
                                              min_repeat_ms=cfg.min_repeat_ms,
                                              enable_cpu_cache_flush=cfg.cache_flush)
        if rpc:
            host, port, key = rpc
            self.runner = ms.runner.RPCRunner(
                rpc_config=ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                               session_timeout_sec=int(cfg.run_timeout_s)),
                evaluator_config=evaluator, max_workers=1, initializer=tvm_env.worker_initializer,
                f_alloc_argument=alloc_rpc_arguments,
                f_run_evaluator=functools.partial(run_within_budget_rpc, budget_s=cfg.run_budget_s))
        else:
            self.runner = ms.runner.LocalRunner(timeout_sec=cfg.run_timeout_s, evaluator_config=evaluator,
                                                initializer=tvm_env.worker_initializer,
                                                f_alloc_argument=alloc_local_arguments,
                                                f_run_evaluator=functools.partial(run_within_budget,
                                                                                  budget_s=cfg.run_budget_s))
        self.device_type = "cuda" if "gpu" in [str(k) for k in target.keys] else "cpu"
        self.guard = CpuGuard()
        self.pause_flag = pause_flag  # while this file exists, nothing is built or run
        self.artifact_dir = artifact_dir  # built programs kept for later passes (``measure``'s ``keys``)
        self._artifact_salt = f"{tvm.__version__}|{target}"  # another TVM or target: another build
        self.on_wait = None  # callback(seconds waited) while waiting for a quiet machine

    def close(self) -> None:
        pool = getattr(self.runner, "pool", None)  # TVM asks for an explicit shutdown: its __del__ can fail
        if pool is not None:
            pool.shutdown()
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def measure(self, mods: list, groups: list | None = None,
                keys: list | None = None) -> list[tuple[list[float], str | None, float, float]]:
        """Per program: (seconds of each repeat, error, build seconds, CPU share others used meanwhile).

        ``groups`` (the programs' task keys): once ``SKIP_AFTER_TIMEOUTS`` programs of a group time out,
        its other programs in the batch are not run (failed, with the reason): each timeout costs the
        whole run timeout, and a task whose random schedules run for minutes would stall the collection.
        ``keys`` (the programs' record ids): with an ``artifact_dir``, a program is built once and its later
        passes run the kept artifact (build seconds 0): 1.85 instead of 1.20 programs/s here
        (``benchmarks/kept_artifacts.py``).
        """
        ms = self.ms
        self._wait_while_paused()
        keys = keys if keys and self.artifact_dir else [None] * len(mods)
        builds, build_s = [None] * len(mods), [0.0] * len(mods)
        _measuring.set()
        try:
            for i, key in enumerate(keys):
                builds[i] = self._kept_artifact(key)
            todo = [i for i, b in enumerate(builds) if b is None]
            t0 = time.perf_counter()
            fresh = self.builder.build([ms.builder.BuilderInput(mods[i], self.target) for i in todo]) if todo else []
            per_build = (time.perf_counter() - t0) / max(1, len(todo))
            for i, b in zip(todo, fresh):
                builds[i], build_s[i] = b, per_build
                if keys[i] is not None and not b.error_msg:
                    self._keep_artifact(keys[i], b.artifact_path)
            return self._run_built(mods, groups, builds, build_s)
        finally:  # each artifact has a folder of its own; a long run would otherwise fill tmp_root
            _measuring.clear()
            for b in builds:
                if b is not None and b.artifact_path:
                    shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)

    def _run_built(self, mods, groups, builds, build_s: list) -> list:
        """``measure`` once the batch is built."""
        ms = self.ms
        out: list = [None] * len(mods)
        inputs, where = [], []
        for i, (m, b) in enumerate(zip(mods, builds)):
            if b.error_msg:
                out[i] = ([], "build: " + _short(b.error_msg), build_s[i])
            else:
                inputs.append(ms.runner.RunnerInput(b.artifact_path, self.device_type,
                                                    ms.arg_info.ArgInfo.from_prim_func(m["main"])))
                where.append(i)
        tries = 0
        while True:
            self._wait_while_paused()
            self.guard.wait_quiet(self.cfg.quiet_share, self.cfg.max_wait_s, self.on_wait, stop=STOP)
            mark = self.guard.start()
            results = self._run(inputs, [groups[i] for i in where] if groups else [None] * len(inputs))
            if results is None:  # paused midway: whatever ran since (tests, builds) disturbed this phase
                continue
            others = self.guard.others_share(mark)
            tries += 1
            if others < self.cfg.quiet_share or tries >= self.cfg.max_tries:
                break
        for i, (secs, err) in zip(where, results):
            if err:
                out[i] = ([], "run: " + _short(err), build_s[i], others)
            else:
                out[i] = ([float(s) for s in secs], None, build_s[i], others)
        for i, b in enumerate(out):
            if len(b) == 3:
                out[i] = (*b, 0.0)
        return out

    def _artifact_path(self, key: str) -> str:
        name = hashlib.sha256(f"{self._artifact_salt}|{key}".encode()).hexdigest()[:32]
        return os.path.join(self.artifact_dir, name + ".tar")

    def _kept_artifact(self, key: str | None):
        """A copy of the kept artifact in a folder of its own (the runner writes its .so beside it, and the
        folder is removed after the run, like the builder's), or None."""
        path = key and self._artifact_path(key)
        if not path or not os.path.exists(path):
            return None
        copy = os.path.join(tempfile.mkdtemp(dir=self.tmp_root), "tvm_tmp_mod.tar")
        shutil.copyfile(path, copy)
        return self.ms.builder.BuilderResult(copy, None)

    def _keep_artifact(self, key: str, artifact_path: str) -> None:
        path = self._artifact_path(key)
        os.makedirs(self.artifact_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"  # a kill mid-copy leaves no truncated artifact
        shutil.copyfile(artifact_path, tmp)
        os.replace(tmp, path)

    def _pause_requested(self) -> bool:
        return self.pause_flag is not None and bool(pause_files(os.path.dirname(self.pause_flag)))

    def _wait_while_paused(self) -> None:
        """Also where a stop signal ends the measuring."""
        if STOP.is_set():
            raise KeyboardInterrupt
        announced = False
        while self._pause_requested():
            if not announced:
                print(f"\npaused: {', '.join(pause_files(os.path.dirname(self.pause_flag)))} exists", file=sys.stderr)
                announced = True
            if STOP.is_set():
                raise KeyboardInterrupt
            time.sleep(2)

    def _run(self, inputs: list, groups: list) -> list[tuple[list | None, str | None]] | None:
        """Runs the programs one by one; None if a pause was requested before the last one ran."""
        timeouts: dict = {}
        out = []
        for inp, g in zip(inputs, groups):
            if self._pause_requested() or STOP.is_set():
                return None
            if g is not None and timeouts.get(g, 0) >= SKIP_AFTER_TIMEOUTS:
                out.append((None, f"skipped: {SKIP_AFTER_TIMEOUTS} programs of this task timed out in this batch"))
                continue
            secs, err = self._run_one(inp)
            if err and "Timeout" in err:
                timeouts[g] = timeouts.get(g, 0) + 1
            out.append((secs, err))
        return out

    def _run_one(self, inp) -> tuple[list | None, str | None]:
        """One program, with a timeout that holds: TVM's runner worker times itself out with a Python
        timer thread, which cannot run while a kernel holds the GIL (a 2-thread kernel ran 80 s past its
        30 s timeout). So the collector kills the runner's worker from outside after a grace period."""
        fired = threading.Event()
        limit = self.cfg.run_timeout_s + self.cfg.kill_grace_s

        def kill_worker():
            fired.set()
            for worker in list(getattr(getattr(self.runner, "pool", None), "_worker_map", {}).values()):
                worker.kill()

        timer = threading.Timer(limit, kill_worker)
        timer.daemon = True
        timer.start()
        try:
            r = self.runner.run([inp])[0].result()
        finally:
            timer.cancel()
        if fired.is_set():
            return None, f"Timeout: runner worker killed after {limit:g} s"
        return r.run_secs, r.error_msg


SKIP_AFTER_TIMEOUTS = 2


def _short(msg: str) -> str:
    lines = [ln for ln in str(msg).strip().splitlines() if ln.strip()]
    return (" | ".join(lines[-3:]) if lines else "unknown error")[:600]


def usable(measurement: dict) -> bool:
    """A pass that counts towards a label: it has seconds, no error, and nobody else was busy meanwhile."""
    return bool(measurement.get("seconds")) and not measurement.get("error") and not is_disturbed(measurement)


def label(record: dict, passes: int | None = None) -> float | None:
    """The latency label of a record: its fastest repeat over its first ``passes`` valid passes (all by
    default; ``cdmpp remeasure`` adds passes); None for failed records and for records measured while
    other processes were busy (kept, not used; ``cdmpp.store.is_disturbed``)."""
    if not usable(record):
        return None
    valid = [record] + [p for p in record.get("remeasures", []) if usable(p)]
    return min(min(p["seconds"]) for p in valid[:passes])


def _measurement(secs: list, err: str | None, build_s: float, others: float, cfg: MeasureConfig, run_id: str) -> dict:
    """The fields every measurement record has, first pass or later one."""
    return {"seconds": secs, "error": err, "build_s": round(build_s, 3), "others_cpu": round(others, 3),
            "disturbed": others >= cfg.quiet_share, "run": run_id, "measured_at": round(time.time())}


def _provenance(device, target, cfg: MeasureConfig, rpc, **extra) -> dict:
    """What a run entry in ``runs.jsonl`` says about the machine, the software and the settings."""
    tvm = tvm_env.setup()
    return {
        "device": device.id, "cpu_model": cpu_model(), "cores": os.cpu_count(), "threads": device.threads,
        "target": str(target), "tvm_version": tvm.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(), "measure": dataclasses.asdict(cfg),
        "rpc": f"{rpc[0]}:{rpc[1]}/{rpc[2]}" if rpc else None, "command": " ".join(sys.argv), **extra,
    }


def collect(tasks, dataset_dir: str, device, target, per_task: int = 32, budget_minutes: float | None = None,
            cfg: MeasureConfig | None = None, batch_size: int = 32, seed: int = 0, rpc=None,
            artifact_dir: str | None = None, progress: bool = True, programs_from: str | None = None,
            fast: bool | None = None, overlap: bool | None = None) -> dict:
    """Measure ``per_task`` schedules of every task in ``tasks``; resumable; returns a summary.

    ``programs_from``: another device's id; its stored (labelled) programs of these tasks are measured
    first, so both devices share them (twins), then new ones. ``fast`` (default: unless ``rpc`` or
    ``cache_flush``): the fast local measurer (``cdmpp.fastmeasure``); else MetaSchedule's builder and
    runner (``Measurer``), which can keep built programs in ``artifact_dir`` for later passes.
    ``overlap``: fast path only; build the next tasks while one runs (runner alone on its cores); None:
    ``cdmpp.fastmeasure.default_overlap`` (on for 1-thread CPU programs on a machine with more cores)."""
    cfg = cfg or MeasureConfig()
    if fast is None:
        fast = rpc is None and not cfg.cache_flush
    if fast and (rpc or cfg.cache_flush):
        raise ValueError("the fast measurer runs locally without cache flushing: drop --rpc-tracker/--cache-flush "
                         "or use the MetaSchedule measurer")
    if fast or programs_from:
        return _collect_fast(tasks, dataset_dir, device, target, per_task, budget_minutes, cfg, seed,
                             programs_from, fast, overlap, progress)
    from tqdm import tqdm

    from cdmpp.features import program_hash
    from cdmpp.program import to_json_value
    from cdmpp.schedules import sample_schedules
    from cdmpp.zoo.tasks import load_task_mod

    cfg = cfg or MeasureConfig()
    store = RecordStore(dataset_dir)
    done = store.done_ids(device.id)
    run_id = store.add_run(_provenance(device, target, cfg, rpc, per_task=per_task, seed=seed))
    measurer = Measurer(target, cfg, rpc, pause_flag=os.path.join(dataset_dir, "PAUSE"), artifact_dir=artifact_dir)
    measurer.on_wait = lambda waited: bar.set_postfix_str(f"waiting {waited:.0f}s for a quiet machine")
    deadline = time.time() + budget_minutes * 60 if budget_minutes else None
    task_list = sorted(tasks, key=lambda t: t.key)
    stats = {"measured": 0, "failed": 0, "skipped_done": 0, "tasks": len(task_list), "stopped_by_budget": False}
    t_start = time.time()
    bar = tqdm(total=len(task_list) * per_task, unit="prog", disable=not progress, dynamic_ncols=True)
    pending: list[tuple] = []

    def flush():
        if not pending:
            return
        results = measurer.measure([p[1].mod for p in pending], [p[0].key for p in pending],
                                   [record_id(device.id, p[0].key, p[2]) for p in pending])
        recs = []
        for (task, sch, phash), (secs, err, build_s, others) in zip(pending, results):
            recs.append({
                "id": record_id(device.id, task.key, phash), "device": device.id, "task": task.key,
                "task_name": task.name, "networks": sorted(task.occurrences), "program_hash": phash,
                "trace": to_json_value(sch.trace.as_json()), **_measurement(secs, err, build_s, others, cfg, run_id),
            })
            stats["failed" if err else "measured"] += 1
        store.append(device.id, recs)
        bar.update(len(pending))
        bar.set_postfix(ok=stats["measured"], failed=stats["failed"])
        pending.clear()

    try:
        for task in task_list:
            if deadline and time.time() > deadline:
                stats["stopped_by_budget"] = True
                break
            mod = load_task_mod(task)
            schs = sample_schedules(mod, target, per_task, seed=task_seed(task.key, seed))
            bar.total -= per_task - len(schs)  # tasks with fewer distinct schedules
            for sch in schs:
                phash = program_hash(sch.mod)
                if record_id(device.id, task.key, phash) in done:
                    stats["skipped_done"] += 1
                    bar.update(1)
                    continue
                pending.append((task, sch, phash))
                if len(pending) >= batch_size:
                    flush()
                    if deadline and time.time() > deadline:
                        break
        flush()
    finally:
        bar.close()
        measurer.close()
    stats["seconds"] = round(time.time() - t_start, 1)
    stats["run"] = run_id
    return stats


def twin_traces(store: RecordStore, source: str, tasks: dict) -> dict[str, list]:
    """Per task key (of ``tasks``, a dict by key), the traces of ``source``'s labelled programs."""
    if not store.files(source):
        raise ValueError(f"--programs-from {source}: no records of that device in {store.root}")
    out: dict[str, list] = {}
    for r in store.iter_records(source):
        if label(r) is not None and r["task"] in tasks and r.get("trace") is not None:
            out.setdefault(r["task"], []).append(r["trace"])
    return out


def _collect_fast(tasks, dataset_dir, device, target, per_task, budget_minutes, cfg, seed, programs_from,
                  fast, overlap, progress) -> dict:
    """``collect`` with the fast measurer: jobs of one task each, twins first."""
    from tqdm import tqdm

    from cdmpp.fastmeasure import FastMeasurer, default_overlap

    if not fast:
        raise ValueError("--programs-from needs the fast measurer")
    if overlap is None:
        overlap = default_overlap(device.threads, "cuda" if target.kind.name == "cuda" else "cpu")
    store = RecordStore(dataset_dir)
    done: dict[str, set] = {}
    for rid in store.done_ids(device.id):
        _, task, phash = rid.rsplit("|", 2)
        done.setdefault(task, set()).add(phash)
    task_list = sorted(tasks, key=lambda t: t.key)
    by_key = {t.key: t for t in task_list}
    twins = twin_traces(store, programs_from, by_key) if programs_from else {}
    run_id = store.add_run(_provenance(device, target, cfg, None, per_task=per_task, seed=seed,
                                       measurer="fast", overlap=overlap, programs_from=programs_from))
    twin_tasks = [t for t in task_list if twins.get(t.key)]
    n_jobs = len(twin_tasks) + (len(task_list) if per_task > 0 else 0)

    def jobs():  # made when the builders need them, so ``skip`` includes what this run stored already
        for t in twin_tasks:  # the twin set first: every twin is worth more than a new program
            yield {"task_key": t.key, "mod_json": t.mod_json, "traces": twins[t.key],
                   "skip": frozenset(done.get(t.key, ()))}
        for t in task_list if per_task > 0 else ():
            yield {"task_key": t.key, "mod_json": t.mod_json, "n": per_task, "seed": task_seed(t.key, seed),
                   "skip": frozenset(done.get(t.key, ()))}
    stats = {"measured": 0, "failed": 0, "skipped_done": 0, "tasks": len(task_list), "jobs": n_jobs,
             "twins_measured": 0, "stopped_by_budget": False, "overlap": overlap}
    deadline = time.time() + budget_minutes * 60 if budget_minutes else None
    bar = tqdm(total=n_jobs, unit="task", disable=not progress, dynamic_ncols=True, smoothing=0.05)
    t_start = time.time()
    measurer = FastMeasurer(target, cfg, device.threads, pause_dir=dataset_dir, overlap=overlap)
    measurer.on_wait = lambda waited, what: bar.set_postfix_str(f"{what} {waited:.0f}s")
    results_of = measurer.measure_jobs(jobs())
    try:
        for job, results in results_of:
            task = by_key[job["task_key"]]
            if isinstance(results, str):  # the build job failed as a whole (crash, timeout): nothing to store
                stats["failed_jobs"] = stats.get("failed_jobs", 0) + 1
                print(f"\n{task.name} ({task.key}): {results}", file=sys.stderr)
            else:
                recs = []
                for b, secs, err, others in results:
                    if not b.program_hash:  # a trace that no longer applies: nothing to key a record by
                        stats["failed"] += 1
                        continue
                    recs.append({
                        "id": record_id(device.id, task.key, b.program_hash), "device": device.id,
                        "task": task.key, "task_name": task.name, "networks": sorted(task.occurrences),
                        "program_hash": b.program_hash, "trace": b.trace,
                        **_measurement(secs, err, b.build_s, others, cfg, run_id),
                        "stable": is_stable(secs, cfg) if secs else None})
                    stats["failed" if err else "measured"] += 1
                    stats["twins_measured"] += bool("traces" in job and not err)
                    done.setdefault(task.key, set()).add(b.program_hash)
                store.append(device.id, recs)
            bar.update(1)
            waited = measurer.times["paused"] + measurer.times["wait_quiet"]
            rate = stats["measured"] / max(1e-9, time.time() - t_start - waited)
            bar.set_postfix(ok=stats["measured"], failed=stats["failed"], waited=f"{waited:.0f}s",
                            rate=f"{rate:.2f}/s not waiting")
            if deadline and time.time() > deadline:
                stats["stopped_by_budget"] = True
                break
    finally:
        results_of.close()
        bar.close()
        measurer.close()
    stats["skipped_done"] = measurer.skipped
    stats["seconds"] = round(time.time() - t_start, 1)
    stats["programs_per_s"] = round(stats["measured"] / max(1e-9, stats["seconds"]), 3)
    stats["times"] = {k: round(v, 1) for k, v in measurer.times.items()}
    stats["run"] = run_id
    return stats


def remeasure(tasks, dataset_dir: str, device, target, passes: int = 2, min_gap_minutes: float = 30.0,
              budget_minutes: float | None = None, cfg: MeasureConfig | None = None, batch_size: int = 32,
              probe_only: bool = False, runs: set[str] | None = None, rpc=None, artifact_dir: str | None = None,
              progress: bool = True, unstable_only: bool = False, random_share: float = 0.0, seed: int = 0) -> dict:
    """Measure stored programs again until each label has ``passes`` valid passes, each one at least
    ``min_gap_minutes`` after the one before; a label is the fastest repeat over all its passes.
    ``runs``: only programs first measured by these collection runs (one that hit a slow spell).

    Why: on a shared VM a slow spell (a neighbour, the host) lasts minutes and slows every repeat of a
    pass, so one pass's fastest repeat is not enough. On the 2-thread probe set (09:27), 23 % of the
    collection's labels were > 10 % slower than two re-measurements hours apart that agreed with each
    other (1.9 % median apart); against those, the fastest of the label and one of them had half the noise
    (median 2.5 -> 1.5 %, p90 24 -> 12 %). A pass is a record of its own (``<id>|pass<N>``, ``of`` = the
    record's id) appended like any other, so a killed run resumes. ``probe_only``: just the device's
    fixed probe set (``cdmpp noise``), to see what a pass does to the noise before paying for all.
    """
    import json

    from tqdm import tqdm

    from cdmpp.program import apply_trace
    from cdmpp.store import slug
    from cdmpp.zoo.tasks import load_task_mod

    cfg = cfg or MeasureConfig()
    store = RecordStore(dataset_dir)
    provenance = store.runs()
    unknown = sorted(set(runs or ()) - set(provenance))
    if unknown:
        raise ValueError(f"unknown collection run(s) {', '.join(unknown)}: see {dataset_dir}/runs.jsonl")
    only = None
    if probe_only:
        probe_path = os.path.join(dataset_dir, f"probe-{slug(device.id)}.json")
        if not os.path.exists(probe_path):
            raise ValueError(f"{device.id} has no probe set yet ({probe_path}): run `cdmpp noise` first")
        only = set(json.load(open(probe_path))["ids"])
    now, todo, waiting = time.time(), [], 0
    for r in store.iter_records(device.id):
        if label(r) is None or r["task"] not in tasks.tasks or (only is not None and r["id"] not in only):
            continue
        if runs is not None and r.get("run") not in runs:
            continue
        if unstable_only and r.get("stable") is not False and not _drawn(r["id"], random_share, seed):
            continue
        valid = [r] + [p for p in r.get("remeasures", []) if usable(p)]
        if len(valid) >= passes:
            continue
        if now - max(_measured_at(p, provenance) for p in valid) < 60 * min_gap_minutes:
            waiting += 1
            continue
        todo.append((r, len(r.get("remeasures", [])) + 2))  # a pass number no earlier pass of r used
    todo.sort(key=lambda t: t[0]["task"])
    run_id = store.add_run(_provenance(device, target, cfg, rpc, mode="remeasure", passes=passes))
    measurer = Measurer(target, cfg, rpc, pause_flag=os.path.join(dataset_dir, "PAUSE"), artifact_dir=artifact_dir)
    bar = tqdm(total=len(todo), unit="prog", desc="remeasure", disable=not progress, dynamic_ncols=True)
    measurer.on_wait = lambda waited: bar.set_postfix_str(f"waiting {waited:.0f}s for a quiet machine")
    deadline = time.time() + budget_minutes * 60 if budget_minutes else None
    stats = {"measured": 0, "failed": 0, "todo": len(todo), "too_recent": waiting, "stopped_by_budget": False}
    t_start, task_mod = time.time(), (None, None)
    try:
        for i in range(0, len(todo), batch_size):
            if deadline and time.time() > deadline:
                stats["stopped_by_budget"] = True
                break
            batch, mods = todo[i:i + batch_size], []
            for r, _ in batch:
                if task_mod[0] != r["task"]:
                    task_mod = (r["task"], load_task_mod(tasks[r["task"]]))
                mods.append(apply_trace(task_mod[1], r["trace"]))
            results = measurer.measure(mods, [r["task"] for r, _ in batch], [r["id"] for r, _ in batch])
            recs = []
            for (r, n), (secs, err, build_s, others) in zip(batch, results):
                recs.append({"id": f"{r['id']}|pass{n}", "of": r["id"], "device": device.id, "task": r["task"],
                             **_measurement(secs, err, build_s, others, cfg, run_id)})
                stats["failed" if err else "measured"] += 1
            store.append(device.id, recs)
            bar.update(len(batch))
            bar.set_postfix(ok=stats["measured"], failed=stats["failed"])
    finally:
        bar.close()
        measurer.close()
    stats["seconds"] = round(time.time() - t_start, 1)
    stats["run"] = run_id
    return stats


def _drawn(record_id: str, share: float, seed: int) -> bool:
    """A fixed pseudo-random ``share`` of the records (the same ones on every call)."""
    return share > 0 and int(hashlib.sha256(f"{seed}:{record_id}".encode()).hexdigest()[:8], 16) < share * 2**32


def is_stable(secs: list[float], cfg: MeasureConfig) -> bool | None:
    """Whether a pass's fastest repeat was stable (the fast measurer's stopping rule held): it came before
    the last ``stable_patience`` repeats, or they beat it by no more than ``stable_tol``. None when the
    pass has too few repeats to tell (slow programs: their few long repeats vary little). Kernels of one
    call per repeat follow ``min_repeats_long`` (``cdmpp.fastmeasure.adaptive_repeats``)."""
    need, patience = cfg.min_repeats, cfg.stable_patience
    if min(secs) >= cfg.min_repeat_ms / 1e3:
        need = cfg.min_repeats_long
        patience = max(1, min(patience, need - 1))
    if len(secs) < max(need, patience + 1):
        return None
    head = min(secs[:-patience])
    return min(secs) >= head * (1 - cfg.stable_tol)


def _measured_at(measurement: dict, runs: dict) -> float:
    """When a pass was measured; records older than the ``measured_at`` field fall back to their
    run's start (earlier than the truth, so a gap can only look longer than it was)."""
    if "measured_at" in measurement:
        return float(measurement["measured_at"])
    date = (runs.get(measurement.get("run")) or {}).get("date")
    return _parse_date(date) if date else 0.0


def remeasure_noise(dataset_dir: str, tasks, device, target, n: int = 100, seed: int = 0,
                    cfg: MeasureConfig | None = None, min_gap_minutes: float = 30.0, artifact_dir: str | None = None,
                    progress: bool = True, probe_runs: set[str] | None = None) -> dict:
    """Re-measure the device's fixed probe set now and compare with the stored labels.

    ``probe_runs``: a probe set of its own, drawn among the records of these collection runs only (its files
    are named after them): how labels made one way (the fast measurer's single pass) agree with a later
    check made the usual way.

    The probe set is chosen once: ``n`` random labeled records measured with the same repeat settings as
    ``cfg`` (older settings give other labels), kept in ``probe-<device>.json``; every later check
    re-measures the same programs. Run-to-run noise is |new - old| / old per program (old: the label,
    the fastest repeat over all its passes; also reported against the first pass alone, the label
    before ``cdmpp remeasure``); median and 90th percentile go to ``noise-<device>.json``, appended.

    A label of P passes is also compared with a check of P passes, like for like (``same_passes_*``):
    this check's measurement combined with the P - 1 latest earlier checks of the program taken with the
    same settings, each at least ``min_gap_minutes`` before the next, fastest wins. Why: a single check
    pass that lands in a slow spell shows the check's noise, not the label's; two applications of the
    same procedure disagreeing is the procedure's noise.
    """
    import json
    import random

    from tqdm import tqdm

    from cdmpp.program import apply_trace
    from cdmpp.store import slug
    from cdmpp.zoo.tasks import load_task_mod

    cfg = cfg or MeasureConfig()
    store = RecordStore(dataset_dir)
    runs = store.runs()
    same = {rid for rid, r in runs.items()
            if (r.get("measure") or {}).get("repeat") == cfg.repeat
            and (r.get("measure") or {}).get("min_repeat_ms") == cfg.min_repeat_ms}
    unknown = sorted(set(probe_runs or ()) - set(runs))
    if unknown:
        raise ValueError(f"unknown collection run(s) {', '.join(unknown)}: see {dataset_dir}/runs.jsonl")
    if probe_runs:
        same = set(probe_runs)
    by_id = {r["id"]: r for r in store.iter_records(device.id)
             if label(r) is not None and r["task"] in tasks.tasks and r.get("run") in same}
    name = slug(device.id) + ("-runs-" + hashlib.sha256(",".join(sorted(probe_runs)).encode()).hexdigest()[:8]
                              if probe_runs else "")
    probe_path = os.path.join(dataset_dir, f"probe-{name}.json")
    if os.path.exists(probe_path):
        ids = [i for i in json.load(open(probe_path))["ids"] if i in by_id]
    else:
        ids = sorted(by_id)
        random.Random(seed).shuffle(ids)
        ids = ids[:n]
        _write_json(probe_path, {"device": device.id, "measure": dataclasses.asdict(cfg), "ids": ids,
                                 **({"runs": sorted(probe_runs)} if probe_runs else {})})
    recs = [by_id[i] for i in ids]
    if not recs:
        raise ValueError(f"no labeled records of {device.id} measured with repeat={cfg.repeat}, "
                         f"min_repeat_ms={cfg.min_repeat_ms} in {dataset_dir}: nothing to re-measure")
    rows = []
    with Measurer(target, cfg, pause_flag=os.path.join(dataset_dir, "PAUSE"), artifact_dir=artifact_dir) as measurer:
        for i in tqdm(range(0, len(recs), 24), desc="re-measure", unit="batch", disable=not progress):
            batch = recs[i:i + 24]
            mods = [apply_trace(load_task_mod(tasks[r["task"]]), r["trace"]) for r in batch]
            for r, (secs, err, _, others) in zip(batch, measurer.measure(mods, keys=[r["id"] for r in batch])):
                if err or not secs or others >= cfg.quiet_share:
                    continue
                old, first, new = label(r), label(r, passes=1), min(secs)
                rows.append({"id": r["id"], "old": old, "new": new, "first_pass": first,
                             "passes": 1 + sum(usable(p) for p in r.get("remeasures", []))})
    import numpy as np

    def noise(new: str, old: str) -> tuple[float | None, float | None]:
        rel = [abs(p[new] - p[old]) / p[old] for p in rows if p[new] is not None]
        return (float(np.median(rel)), float(np.percentile(rel, 90))) if rel else (None, None)

    path = os.path.join(dataset_dir, f"noise-{name}.json")
    history = json.load(open(path)) if os.path.exists(path) else []
    now = time.time()
    earlier = [(_parse_date(h["date"]), {p["id"]: p["new"] for p in h.get("pairs", [])}) for h in reversed(history)
               if (h.get("measure") or {}).get("repeat") == cfg.repeat
               and (h.get("measure") or {}).get("min_repeat_ms") == cfg.min_repeat_ms]
    for row in rows:
        passes, last = [row["new"]], now
        for when, news in earlier:
            if len(passes) == row["passes"]:
                break
            if row["id"] in news and when <= last - 60 * min_gap_minutes:
                passes.append(news[row["id"]])
                last = when
        row["check_passes"] = len(passes)
        row["new_same_passes"] = min(passes) if len(passes) == row["passes"] else None
    (med, p90), (med1, p90_1) = noise("new", "old"), noise("new", "first_pass")
    med_same, p90_same = noise("new_same_passes", "old")
    result = {"device": device.id, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
              "programs": len(rows), "median_rel_diff": med, "p90_rel_diff": p90,
              "first_pass_median_rel_diff": med1, "first_pass_p90_rel_diff": p90_1,
              "same_passes_programs": sum(p["new_same_passes"] is not None for p in rows),
              "same_passes_median_rel_diff": med_same, "same_passes_p90_rel_diff": p90_same,
              "label_passes": {str(k): sum(p["passes"] == k for p in rows) for k in sorted({p["passes"] for p in rows})},
              "measure": dataclasses.asdict(cfg), "pairs": rows, **({"runs": sorted(probe_runs)} if probe_runs else {})}
    history.append(result)
    _write_json(path, history)
    return result


def _parse_date(text: str) -> float:
    """Seconds since the epoch of a run's or a noise check's ``%Y-%m-%dT%H:%M:%S%z`` date."""
    from datetime import datetime

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def _write_json(path: str, obj) -> None:
    """Whole or not at all: a temporary file renamed over the old one."""
    import json

    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
