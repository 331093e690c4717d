"""Whole-network latency: the weighted sum of the network's kernels, for one choice of schedules.

A network compiled by TVM runs one kernel per ``call_tir``; its tasks (``cdmpp.zoo.tasks``) are the
distinct kernels with the number of calls as weight. So a network's time is predicted as
``sum(weight * predicted seconds)`` of each task's *scheduled* program. Which program that is depends
on the schedules the network is compiled with:

* ``best-measured``: per task, the fastest program stored for the device in a cdmpp dataset (what a
  tuned network would run); tasks without a stored program keep TVM's default (unscheduled) code;
* a MetaSchedule database folder (``database_*.json`` of ``ms.tune_tir`` / ``relax_integration.tune_relax``);
* ``default``: every task unscheduled, as ``tvm.compile`` builds it without tuning.

A sum that mixes default code into scheduled code is refused unless asked for (``check_schedules``).

``compile_network`` builds the network with exactly those programs (a ``MemoryDatabase`` applied with
``MetaScheduleApplyDatabase``), so ``cdmpp bench network`` compares the prediction with the real thing.
The interval adds the members' bounds task by task: errors of one model on one device move together
more than they cancel, so the sum of bounds is the honest width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULE_SOURCES = ("best-measured", "default")  # or a MetaSchedule database folder


@dataclass
class TaskProgram:
    name: str
    key: str
    weight: int
    workload: object  # the task's unscheduled IRModule
    mod: object  # the scheduled IRModule
    trace: object | None  # tvm Trace of the schedule (None: the task's default code)
    source: str  # "best-measured", "database" or "default"
    measured_s: float | None = None  # the stored label of that program, when it came from the dataset


@dataclass
class NetworkPrediction:
    network: str
    device: str
    seconds: float
    lo90: float
    hi90: float
    tasks: list[dict] = field(default_factory=list)


def _best_measured(dataset_dir: str, device: str) -> dict[str, tuple[object, float]]:
    """task key → (trace JSON, label) of the fastest stored program of each task on ``device``; none when
    there is no such folder (a store would create it)."""
    import os

    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore

    best: dict[str, tuple[object, float]] = {}
    if not os.path.isdir(dataset_dir):
        return best
    for rec in RecordStore(dataset_dir).iter_records(device):
        s = label(rec)
        if s is not None and (rec["task"] not in best or s < best[rec["task"]][1]):
            best[rec["task"]] = (rec["trace"], s)
    return best


def task_programs(network: str, table, schedules: str, device: str, dataset_dir: str, target) -> list[TaskProgram]:
    """The scheduled program of every task of ``network`` (``name@batch``) under ``schedules``."""
    from cdmpp.program import tvm_env

    tvm_env.setup()
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Trace

    from cdmpp.zoo.tasks import load_task_mod

    tasks = table.tasks_of(network)
    if not tasks:
        raise ValueError(f"no tasks of {network!r} in the task table (networks: {', '.join(table.occurrences())})")
    if schedules == "best-measured":
        stored = _best_measured(dataset_dir, device)
    elif schedules == "default":
        stored = {}
    else:
        db = ms.database.JSONDatabase(work_dir=schedules, allow_missing=False)
    out = []
    for task, weight in sorted(tasks, key=lambda tw: tw[0].name):
        workload = mod = load_task_mod(task)
        trace, source, measured = None, "default", None
        if schedules == "best-measured" and task.key in stored:
            sch = Schedule(mod)
            Trace.apply_json_to_schedule(stored[task.key][0], sch)
            trace, source, measured = sch.trace, "best-measured", stored[task.key][1]
            mod = sch.mod
        elif schedules not in SCHEDULE_SOURCES:
            sch = db.query_schedule(mod, target, workload_name="main")
            if sch is not None:
                trace, source, mod = sch.trace, "database", sch.mod
        out.append(TaskProgram(task.name, task.key, int(weight), workload, mod, trace, source, measured))
    return out


SOURCE_WORDS = {"best-measured": "measured", "database": "tuned", "default": "default"}


def schedule_counts(programs) -> dict[str, int]:
    """How many tasks run a measured program (the dataset's fastest), a tuned one (a MetaSchedule database)
    or TVM's default, untuned code: {"measured": n, "tuned": n, "default": n}. Takes ``TaskProgram``s or
    ``NetworkPrediction.tasks`` rows."""
    out = dict.fromkeys(SOURCE_WORDS.values(), 0)
    for p in programs:
        out[SOURCE_WORDS[p["source"] if isinstance(p, dict) else p.source]] += 1
    return out


def check_schedules(network: str, device: str, programs: list[TaskProgram], schedules: str, where: str = "",
                    allow_default: bool = False) -> None:
    """Refuse (ValueError) a total that sums TVM's default, untuned code of some tasks with scheduled code of
    others, unless ``allow_default``: default code can be 10x slower than a tuned kernel, so such a sum
    (the 16-core Xeon's 388 ms against 38 ms with 18 of 22 tasks default) answers no one's question.
    ``schedules="default"`` asks for untuned code everywhere and passes; ``where``: the dataset or database
    the schedules were looked for in, for the message."""
    if allow_default or schedules == "default":
        return
    n = schedule_counts(programs)["default"]
    if n:
        names = [p.name for p in programs if p.source == "default"]
        kind = "measured" if schedules == "best-measured" else "tuned"
        where = f" in {where}" if where else ""
        raise ValueError(f"{n} of {len(programs)} tasks of {network} have no {kind} program for {device}{where} "
                         f"({', '.join(names[:3])}{', ...' if n > 3 else ''}): their untuned default code would be summed with scheduled "
                         "code. Measure them (cdmpp collect), or pass --allow-default to sum it anyway, or "
                         "--schedules default for untuned code throughout")


def predict_network(predictor, network: str, device: str, programs: list[TaskProgram]) -> NetworkPrediction:
    """Sum of weight x predicted latency over the network's tasks, with summed interval bounds."""
    preds = predictor.predict([p.mod for p in programs], device)
    rows = [{"task": p.name, "weight": p.weight, "source": p.source, "seconds": q.seconds, "lo90": q.lo90,
             "hi90": q.hi90, "measured_s": p.measured_s} for p, q in zip(programs, preds)]
    total = {k: sum(r["weight"] * r[k] for r in rows) for k in ("seconds", "lo90", "hi90")}
    return NetworkPrediction(network, device, total["seconds"], total["lo90"], total["hi90"], rows)


def compile_network(network: str, programs: list[TaskProgram], target):
    """The network built by TVM with the tasks' programs (tasks without a trace keep default code)."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    from tvm import relax

    from cdmpp.zoo.tasks import network_to_relax, split_occurrence

    name, batch = split_occurrence(network)
    mod = network_to_relax(name, batch)
    with target, _database(programs, target), tvm.transform.PassContext(opt_level=3):
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    return tvm.compile(mod, target=target)


def _database(programs: list[TaskProgram], target):
    """A MetaSchedule database holding the chosen program of every task that has one."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    db = ms.database.MemoryDatabase()
    for p in programs:
        if p.trace is not None:
            db.commit_tuning_record(ms.database.TuningRecord(p.trace, db.commit_workload(p.workload), run_secs=[1.0],
                                                             target=target, args_info=ArgInfo.from_prim_func(p.mod["main"])))
    return db


def measure_network(executable, network: str, device_spec, repeat: int = 15, min_repeat_ms: int = 50,
                    max_wait_s: float = 600.0, rounds: int = 3, pause_s: float = 2.0) -> dict:
    """Fastest of ``rounds`` x ``repeat`` end-to-end runs (zero inputs) on this machine with the device's
    threads, each round after waiting up to ``max_wait_s`` for a quiet machine like the collector
    (``cdmpp.devices.guard.CpuGuard``) and ``pause_s`` apart: a VM can stay slow for the whole of one
    round's second, so one round alone can miss the machine's normal speed. ``others_cpu`` says how
    busy other processes were meanwhile. A device of another chip is refused
    (``cdmpp.devices.probe.check_runs_here``)."""
    import time

    import numpy as np

    from cdmpp.devices.probe import check_runs_here
    from cdmpp.program import tvm_env

    check_runs_here(device_spec)
    tvm = tvm_env.setup(device_spec.threads)
    from tvm import relax

    from cdmpp.devices.guard import CpuGuard
    from cdmpp.zoo.networks import get_network
    from cdmpp.zoo.tasks import split_occurrence

    name, batch = split_occurrence(network)
    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    inputs = [tvm.runtime.tensor(np.zeros(tuple(a.shape), dtype=str(a.dtype).replace("torch.", "")), dev)
              for a in get_network(name).example_inputs(batch)]
    timer = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
    guard = CpuGuard()
    secs, busy = [], []
    for r in range(rounds):
        if r:
            time.sleep(pause_s)
        guard.wait_quiet(0.05, max_wait_s)
        mark = guard.start()
        secs += list(timer(*inputs).results)
        busy.append(guard.others_share(mark))
    return {"seconds": float(min(secs)), "median_s": float(np.median(secs)), "rounds": rounds,
            "others_cpu": round(float(np.mean(busy)), 3)}
