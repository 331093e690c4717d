"""``MetaScheduleMeasurer``: MetaSchedule's builder and runner, built in parallel and run serially on a
quiet machine.

Programs are built in parallel with MetaSchedule's ``LocalBuilder`` and then run *serially, with the
builders idle* by its ``LocalRunner`` (or ``RPCRunner`` for a remote device), so that no build disturbs
a measurement. Every repeat's seconds are stored; the label is the fastest repeat.

Measurement settings (``MeasureConfig``) aim at low run-to-run noise: each repeat runs the kernel enough
times to last ``min_repeat_ms`` (timer noise becomes negligible) and the label is the *minimum* of
``repeat`` repeats: on a shared VM disturbances only ever add time, so the fastest repeat is the most
reproducible statistic (``experiments/noise_ab.py`` compares the choices). TVM's thread pool pins its
threads to cores. Caches are warm (TVM's default runner); pass ``--cache-flush`` to flush them before each
repeat. Integer inputs (gather indices of ``take`` and the like) are zero-filled: random integers index
out of bounds and crash the runner."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import deque

from cdmpp.errors import error_message
from cdmpp.devices.guard import CpuGuard
from cdmpp.measure.measurer import SKIP_AFTER_TIMEOUTS, Built, MeasureConfig, Measurer, Result
from cdmpp.measure.stop import ROOT_PREFIX, STOP, _measuring, _remove_stale_roots, pause_files
from cdmpp.program import tvm_env


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


def export_into(root: str, mod) -> str:
    """``f_export`` of the builder: TVM's default export, but into a folder under ``root``, so that the
    artifacts of a run that is stopped midway go when ``root`` goes (``MetaScheduleMeasurer.close``)."""
    from tvm.support.tar import tar

    path = os.path.join(tempfile.mkdtemp(dir=root), "tvm_tmp_mod." + tar.output_format)
    mod.export_library(path, fcompile=tar)
    return path


@functools.cache
def _local_builder_class(ms):
    """MetaSchedule's ``LocalBuilder`` without its start-up check: the check starts a pool of its own (a
    worker importing TVM, ~4 s) only to look ``f_build``/``f_export`` up by name, and each ``build`` starts
    another pool anyway; a function that is missing there fails that build, with its message, per program.
    Declared once per process."""
    from tvm.ir.utils import derived_object

    @derived_object
    class LocalBuilder(ms.builder.LocalBuilder._cls):  # how TVM asks a derived builder to be declared
        def _sanity_check(self) -> None:
            pass

    return LocalBuilder


class MetaScheduleMeasurer(Measurer):
    """Builds a batch in parallel, then runs it serially, one program at a time, on a quiet machine.

    ``measure_jobs`` (the ``Measurer`` interface) samples or replays a job's programs here and measures
    them in batches of ``batch_size`` programs, a batch running on into the next job; ``measure`` measures
    one batch of modules (``cdmpp remeasure``). Everything it builds lives in a temporary folder of its
    own, removed by ``close`` (or ``with``)."""

    kind = "metaschedule"

    def __init__(self, target, cfg: MeasureConfig, rpc: tuple[str, int, str] | None = None,
                 pause_flag: str | None = None, artifact_dir: str | None = None, device_id: str | None = None,
                 batch_size: int = 32):
        tvm = tvm_env.setup()
        from tvm.s_tir import meta_schedule as ms

        self.ms, self.target, self.cfg = ms, target, cfg
        _remove_stale_roots()
        self.tmp_root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-")
        self.builder = _local_builder_class(ms)(max_workers=cfg.builders, timeout_sec=cfg.build_timeout_s,
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
        if rpc:  # this machine's load says nothing of the remote's, and a server on this machine would count
            self.guard.enabled = False  # as another process: every batch re-run max_tries times
        self.pause_flag = pause_flag  # while this file exists, nothing is built or run
        self.artifact_dir = artifact_dir  # built programs kept for later passes (``measure``'s ``keys``)
        self._artifact_salt = f"{tvm.__version__}|{target}"  # another TVM or target: another build
        self.device_id, self.batch_size = device_id, batch_size  # measure_jobs: artifact keys (record ids), batches
        self.on_wait = None  # callback(seconds waited, what for) while waiting for a quiet machine
        self.times: dict[str, float] = {}
        self.skipped = 0

    def close(self) -> None:
        pool = getattr(self.runner, "pool", None)  # TVM asks for an explicit shutdown: its __del__ can fail
        if pool is not None:
            pool.shutdown()
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def measure_jobs(self, jobs):
        """``Measurer.measure_jobs``: each job's programs sampled (or replayed) here, then measured in
        batches of ``batch_size`` that run on from one job into the next; a job is yielded once all its
        programs are measured, in the order given."""
        open_jobs: deque = deque()  # [job, results or error, programs not measured yet]
        pending: list = []  # (entry, index in its results, Built, module)

        def flush():
            keys = None
            if self.device_id is not None:
                from cdmpp.records.store import record_id

                keys = [record_id(self.device_id, b.task, b.program_hash) for _, _, b, _ in pending]
            measured = self.measure([m for *_, m in pending], [b.task for _, _, b, _ in pending], keys)
            for (entry, i, b, _), (secs, err, build_s, others) in zip(pending, measured):
                b.build_s = build_s
                entry[1][i] = Result(b, secs, err, others)
                entry[2] -= 1
            pending.clear()

        def finished():
            while open_jobs and open_jobs[0][2] == 0:
                entry = open_jobs.popleft()
                yield entry[0], entry[1]

        for job in jobs:
            try:
                progs = self._programs(job)
            except Exception as e:  # the workload does not load, or sampling failed
                open_jobs.append([job, "build: " + error_message(e, lines=3, limit=600), 0])
                yield from finished()
                continue
            entry = [job, [None] * len(progs), sum(mod is not None for _, mod in progs)]  # counted up front:
            open_jobs.append(entry)  # a batch that ends inside this job must not find it finished
            for i, (b, mod) in enumerate(progs):
                if mod is None:  # a trace that no longer applies
                    entry[1][i] = Result(b, [], b.error, 0.0)
                    continue
                pending.append((entry, i, b, mod))
                if len(pending) >= self.batch_size:
                    flush()
                    yield from finished()
            if STOP.is_set():  # sampling does not look at the stop flag
                raise KeyboardInterrupt
            yield from finished()
        if pending:
            flush()
        yield from finished()

    def _programs(self, job: dict) -> list[tuple[Built, object]]:
        """The job's programs (``traces`` replayed, else ``n`` sampled with ``seed``) but those in ``skip``,
        each with its module (None for a trace that no longer applies)."""
        from cdmpp.program.features import program_hash
        from cdmpp.program.inputs import apply_trace, to_json_value

        tvm = tvm_env.setup()
        mod = tvm.ir.load_json(job["mod_json"])
        skip, seen, out = job.get("skip", frozenset()), set(), []
        if job.get("traces") is not None:
            cands = []
            for tr in job["traces"]:
                try:
                    cands.append((apply_trace(mod, tr), tr))
                except Exception as e:  # a trace that no longer applies: record it, go on
                    out.append((Built(job["task_key"], "", tr, error="trace: " + error_message(e, lines=3, limit=600)),
                                None))
        else:
            from cdmpp.measure.schedules import sample_schedules

            cands = [(sch.mod, sch) for sch in sample_schedules(mod, self.target, job["n"], seed=job["seed"])]
        for smod, tr in cands:
            h = program_hash(smod)
            if h in skip:
                self.skipped += 1
            elif h not in seen:
                seen.add(h)
                trace = tr if job.get("traces") is not None else to_json_value(tr.trace.as_json())
                out.append((Built(job["task_key"], h, trace), smod))
        return out

    def measure(self, mods: list, groups: list | None = None,
                keys: list | None = None) -> list[tuple[list[float], str | None, float, float]]:
        """Per program: (seconds of each repeat, error, build seconds, CPU share others used meanwhile).

        ``groups`` (the programs' task keys): once ``SKIP_AFTER_TIMEOUTS`` programs of a group time out,
        its other programs in the batch are not run (failed, with the reason): each timeout costs the
        whole run timeout, and a task whose random schedules run for minutes would stall the collection.
        ``keys`` (the programs' record ids): with an ``artifact_dir``, a program is built once and its later
        passes run the kept artifact (build seconds 0): 1.85 instead of 1.20 programs/s here
        (``experiments/kept_artifacts.py``).
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
                out[i] = ([], "build: " + error_message(b.error_msg, lines=3, limit=600), build_s[i])
            else:
                inputs.append(ms.runner.RunnerInput(b.artifact_path, self.device_type,
                                                    ms.arg_info.ArgInfo.from_prim_func(m["main"])))
                where.append(i)
        tries = 0
        while True:
            self._wait_while_paused()
            self.guard.wait_quiet(self.cfg.quiet_share, self.cfg.max_wait_s,
                                  lambda w: self.on_wait and self.on_wait(w, "waiting for a quiet machine"), stop=STOP)
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
                out[i] = ([], "run: " + error_message(err, lines=3, limit=600), build_s[i], others)
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
            # a kill in flight must end before the next program is sent: until it has, the worker's pipe
            # is closed but the worker not yet marked dead ("write to closed file" for the next program)
            timer.join()
        if fired.is_set():
            return None, f"Timeout: runner worker killed after {limit:g} s"
        return r.run_secs, r.error_msg

