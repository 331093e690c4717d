"""``cdmpp collect --from-search``: record every candidate a real search measures, as Tenset recorded Ansor's.

Random schedules rarely reach the fast path a tuner explores (DESIGN.md §4, the search distribution). Here
MetaSchedule's evolutionary search runs per task, steered by a cost model (cdmpp's own, MetaSchedule's
XGBoost or random; one for every task, as ``ms.tune_tir`` shares it, or one per task),
and each batch of candidates it asks for is measured by the collector's own fast
measurer: the same label protocol, quiet-machine guard, pauses and stop as ``cdmpp collect``. Every
candidate becomes a record tagged ``"search"`` (strategy, cost model, the task's trial index), and its
label goes back to the search as a ``RunnerResult``.

Resumable: a task's searched records already stored are given to a restarted search as its database (its
initial population draws on them) and count towards its trials; a candidate already stored on the device
(a twin, a random schedule) is not measured again, its stored label is the search's answer. Such a candidate
leaves no searched record, so a task whose search ran to the end is listed in ``searched-<device>.jsonl``
beside the records: a restart skips it instead of searching it again for the trials its records lack.
"""

from __future__ import annotations

import json
import os
import sys
import time

from cdmpp.measure.campaigns import built_record, task_seed
from cdmpp.measure.results import run_provenance
from cdmpp.records.labels import label
from cdmpp.records.record import Record
from cdmpp.records.store import RecordStore, slug

COST_MODELS = ("cdmpp", "xgb", "random")
POPULATION = 512  # candidates the evolutionary search scores per generation: MetaSchedule's own default


def _cost_model(kind: str, device_id: str, seed: int, threads: int):
    from tvm.s_tir import meta_schedule as ms

    if kind == "cdmpp":  # the shipped model, with its per-task correction from the search's own measurements
        from cdmpp.predict.cost_model import CDMPPCostModel

        return CDMPPCostModel(device=device_id)
    if kind == "xgb":  # what tune_tir(cost_model="xgb") builds
        return ms.cost_model.XGBModel(num_tuning_cores=threads)
    if kind == "random":
        return ms.cost_model.RandomModel(seed=seed)
    raise ValueError(f"unknown search cost model {kind!r}: expected one of {', '.join(COST_MODELS)}")


def _stored(store: RecordStore, device_id: str, keys: set) -> dict[str, dict[str, Record]]:
    """Per task key of ``keys``: program hash -> the device's stored record (with its trace)."""
    out: dict[str, dict[str, Record]] = {}
    for r in store.records(device_id):
        if r.task in keys and r.program_hash:
            out.setdefault(r.task, {})[r.program_hash] = r
    return out


def searched_tasks_path(dataset_dir: str, device_id: str) -> str:
    """Where the tasks whose search ran to the end on a device are listed (one JSON line each, with its trials)."""
    return os.path.join(dataset_dir, f"searched-{slug(device_id)}.jsonl")


def _searched_tasks(path: str) -> dict[str, int]:
    """Task key -> the most trials a search of it ran to the end with, from ``path``."""
    if not os.path.exists(path):
        return {}
    out: dict[str, int] = {}
    with open(path) as f:
        for j in map(json.loads, filter(str.strip, f)):
            out[j["task"]] = max(out.get(j["task"], 0), int(j["trials"]))
    return out


def _schedule(mod, trace_json):
    """A Schedule of ``mod`` with a stored trace (JSON form) replayed: its ``trace`` is what a database holds."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    sch = Schedule(mod)
    Trace.apply_json_to_schedule(trace_json, sch)
    return sch


def collect_from_search(tasks, dataset_dir: str, device, target, trials: int, cfg, per_iter: int = 64,
                        cost_model: str = "cdmpp", seed: int = 0, deadline: float | None = None,
                        progress: bool = True, population: int = POPULATION, shared_model: bool = True) -> dict:
    """Run a ``trials``-trial evolutionary search per task of ``tasks``, measuring and storing every candidate
    as a record of ``device``; returns a summary like ``collect``'s. The defaults are ``ms.tune_tir``'s: 64
    candidates per batch, and one cost model learning from every task's measurements (``shared_model``), so
    even a task's first batch is steered; each batch costs one evolutionary search of the whole population
    (at 16 per batch and a model per task, the search took ~55 % of the collector's time)."""
    from tqdm import tqdm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from cdmpp.measure.measurer import Measurer
    from cdmpp.measure.stop import stop_at
    from cdmpp.program.features import program_hash
    from cdmpp.program.inputs import to_json_value
    from cdmpp.zoo.tasks import load_task_mod

    if cost_model not in COST_MODELS:
        raise ValueError(f"unknown search cost model {cost_model!r}: expected one of {', '.join(COST_MODELS)}")
    if trials < 1 or per_iter < 1:
        raise ValueError(f"--per-task (trials per task) and the trials per iteration must be >= 1, got {trials}, {per_iter}")
    store = RecordStore(dataset_dir)
    task_list = sorted(tasks, key=lambda t: t.key)
    stored = _stored(store, device.id, {t.key for t in task_list})
    finished_path = searched_tasks_path(dataset_dir, device.id)
    finished = _searched_tasks(finished_path)
    tag = {"strategy": "evolutionary", "cost_model": cost_model, "trials": trials, "per_iter": per_iter, "seed": seed,
           "shared_model": shared_model}
    run_id = store.add_run(run_provenance(device, target, cfg, None, per_task=trials, seed=seed,
                                          measurer="fast", overlap=False, search=tag))
    stats = {"measured": 0, "failed": 0, "skipped_done": 0, "tasks": len(task_list), "tasks_searched": 0,
             "stopped_by_budget": False}
    bar = tqdm(total=len(task_list) * trials, unit="prog", disable=not progress, dynamic_ncols=True)
    t_start = time.time()
    shared = _cost_model(cost_model, device.id, seed, device.threads) if shared_model else None
    with stop_at(deadline) as spent, Measurer.create("fast", target, cfg, device.threads, pause_dir=dataset_dir,
                                                     overlap=False) as measurer:
        measurer.on_wait = lambda waited, what: bar.set_postfix_str(f"{what} {waited:.0f}s")
        try:
            for task in task_list:
                have = stored.get(task.key, {})
                searched = [r for r in have.values() if r.extra.get("search") and label(r) is not None]
                left = 0 if finished.get(task.key, 0) >= trials else \
                    trials - sum(1 for r in have.values() if r.extra.get("search"))
                bar.update(trials - max(left, 0))
                if left <= 0:
                    continue
                mod = load_task_mod(task)
                args_info = ArgInfo.from_prim_func(mod["main"])
                db = ms.database.MemoryDatabase()
                workload = db.commit_workload(mod)
                for r in searched:  # a resumed search starts from what it measured before
                    db.commit_tuning_record(ms.database.TuningRecord(
                        _schedule(mod, r.trace).trace, workload, [label(r)], target, args_info))
                ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply",
                                     search_strategy=ms.search_strategy.EvolutionarySearch(population_size=population),
                                     task_name=task.name, rand_state=task_seed(task.key, seed), num_threads=device.threads)
                model = shared or _cost_model(cost_model, device.id, seed, device.threads)
                ctx.pre_tuning(max_trials=left, num_trials_per_iter=min(per_iter, left),
                               design_spaces=ctx.space_generator.generate_design_space(mod), database=db,
                               cost_model=model)
                trial = trials - left
                stats["tasks_searched"] += 1
                while (cands := ctx.generate_measure_candidates()):
                    hashes = [program_hash(c.sch.mod) for c in cands]
                    traces = [to_json_value(c.sch.trace.as_json()) for c in cands]
                    todo = list({h: tr for h, tr in zip(hashes, traces) if h not in have}.values())  # one per program
                    if todo:  # one build job per build worker: they build side by side (a batch's order means nothing)
                        size = -(-len(todo) // max(1, cfg.builders))
                        jobs = [{"task_key": task.key, "mod_json": task.mod_json, "traces": todo[i:i + size],
                                 "skip": frozenset(have)} for i in range(0, len(todo), size)]
                        recs = []
                        for _, results in measurer.measure_jobs(jobs):
                            if isinstance(results, str):  # the build job failed as a whole
                                print(f"\n{task.name} ({task.key}): {results}", file=sys.stderr)
                                continue
                            for b, secs, err, others in results:
                                if not b.program_hash:
                                    stats["failed"] += 1
                                    continue
                                rec = built_record(device, task, b, secs, err, others, cfg, run_id,
                                                   search=dict(tag, trial=trial + len(recs)))
                                recs.append(rec)
                                have[b.program_hash] = rec
                                stats["failed" if err else "measured"] += 1
                        store.append(device.id, recs)
                    stats["skipped_done"] += len(cands) - len(todo)
                    runner_results = []
                    for c, h in zip(cands, hashes):  # what tune_tir's callbacks do: database, search, model
                        r = have.get(h)
                        secs = label(r) if r is not None else None
                        runner_results.append(ms.runner.RunnerResult([secs], None) if secs else
                                              ms.runner.RunnerResult(None, (r.error if r is not None else None) or "not measured"))
                        if secs:
                            db.commit_tuning_record(ms.database.TuningRecord(c.sch.trace, workload, [secs], target,
                                                                             args_info))
                    ctx.notify_runner_results(cands, runner_results)
                    model.update(ctx, cands, runner_results)
                    trial += len(cands)
                    bar.update(len(cands))
                    bar.set_postfix(ok=stats["measured"], failed=stats["failed"], task=task.name[:24])
                    if spent.is_set():
                        raise KeyboardInterrupt
                ctx.post_tuning()
                with open(finished_path, "a") as f:  # ran to the end: a restart leaves this task alone
                    f.write(json.dumps({"task": task.key, "trials": trials, "run": run_id}) + "\n")
        except KeyboardInterrupt:
            if not spent.is_set():
                raise
            stats["stopped_by_budget"] = True
        finally:
            bar.close()
    stats["seconds"] = round(time.time() - t_start, 1)
    stats["programs_per_s"] = round(stats["measured"] / max(1e-9, stats["seconds"]), 3)
    stats["times"] = {k: round(v, 1) for k, v in measurer.times.items()}
    stats["run"] = run_id
    return stats
