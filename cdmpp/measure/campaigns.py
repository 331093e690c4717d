"""``cdmpp collect``: measure random valid schedules of real network tasks on a real device.

For each task (from a ``TaskTable``), ``per_task`` distinct schedules are drawn from MetaSchedule's
design space with a seed derived from the task key, so a restarted collection draws the same programs
and skips those already stored (records are keyed by device, task and program hash). Each task is a job
for a ``Measurer`` (``cdmpp.measure.measurer``): the fast one (``cdmpp.measure.fast``, the default) or
MetaSchedule's builder and runner (``cdmpp.measure.metaschedule``; remote devices, cache flushing); both
measure only on a quiet machine (``cdmpp.devices.guard``) and stop or pause cleanly
(``cdmpp.measure.stop``). The loop is the same whichever measures.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from cdmpp.measure.measurer import MeasureConfig, Measurer
from cdmpp.measure.results import program_record, run_provenance
from cdmpp.measure.stop import stop_at
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore, slug


def task_seed(key: str, seed: int) -> int:
    return int(hashlib.sha256(f"{key}:{seed}".encode()).hexdigest()[:8], 16)


def collect(tasks, dataset_dir: str, device, target, per_task: int = 32, budget_minutes: float | None = None,
            cfg: MeasureConfig | None = None, batch_size: int = 32, seed: int = 0, rpc=None,
            artifact_dir: str | None = None, progress: bool = True, programs_from: str | None = None,
            measurer: str | None = None, overlap: bool | None = None, deadline: float | None = None) -> dict:
    """Measure ``per_task`` schedules of every task in ``tasks``; resumable; returns a summary.

    One job per task (``cdmpp.measure.measurer``), twins first: ``programs_from``, another device's id,
    has its stored (labelled) programs of these tasks measured first, so both devices share them, then
    new ones. ``measurer``: ``"fast"`` (the default unless ``rpc`` or ``cache_flush``: the fast local
    measurer, ``cdmpp.measure.fast``) or ``"metaschedule"`` (MetaSchedule's builder and runner, batches of
    ``batch_size`` programs; it can keep built programs in ``artifact_dir`` for later passes).
    ``overlap``: fast measurer only; build the next tasks while one runs (runner alone on its cores); None:
    ``cdmpp.measure.processes.default_overlap`` (on for 1-thread CPU and GPU programs on a machine with more cores).
    ``budget_minutes`` bounds the whole call, waits for a quiet machine included (``stop_at``); ``deadline``
    (``time.monotonic()``), where given, instead: a command's budget counts from its start."""
    from tqdm import tqdm

    cfg = cfg or MeasureConfig()
    if deadline is None and budget_minutes:
        deadline = time.monotonic() + 60 * budget_minutes
    if measurer is None:
        measurer = "fast" if rpc is None and not cfg.cache_flush else "metaschedule"
    if measurer == "fast" and (rpc or cfg.cache_flush):
        raise ValueError("the fast measurer runs locally without cache flushing: drop --rpc-tracker/--cache-flush "
                         "or use the MetaSchedule measurer")
    if programs_from and measurer != "fast":
        raise ValueError("--programs-from needs the fast measurer")
    store = RecordStore(dataset_dir)
    done: dict[str, set] = {}
    for rid in store.done_ids(device.id):
        _, task, phash = rid.rsplit("|", 2)
        done.setdefault(task, set()).add(phash)
    task_list = sorted(tasks, key=lambda t: t.key)
    by_key = {t.key: t for t in task_list}
    twins, twins_done = twin_traces(store, programs_from, by_key, done) if programs_from else ({}, 0)
    failed_path = failed_jobs_path(dataset_dir, device.id)
    failed = _failed_jobs(failed_path)
    twin_tasks = [t for t in task_list if twins.get(t.key) and (t.key, "twins") not in failed]
    new_tasks = [t for t in task_list if (t.key, str(seed)) not in failed] if per_task > 0 else []
    n_jobs = len(twin_tasks) + len(new_tasks)

    def jobs():  # made when the builders need them, so ``skip`` includes what this run stored already
        for t in twin_tasks:  # the twin set first: every twin is worth more than a new program
            yield {"task_key": t.key, "mod_json": t.mod_json, "traces": twins[t.key],
                   "skip": frozenset(done.get(t.key, ()))}
        for t in new_tasks:
            yield {"task_key": t.key, "mod_json": t.mod_json, "n": per_task, "seed": task_seed(t.key, seed),
                   "skip": frozenset(done.get(t.key, ()))}
    stats = {"measured": 0, "failed": 0, "skipped_done": 0, "tasks": len(task_list), "jobs": n_jobs,
             "twins_measured": 0, "stopped_by_budget": False, "overlap": None,
             "skipped_failed_jobs": sum(bool(twins.get(t.key)) for t in task_list) - len(twin_tasks)
             + (len(task_list) - len(new_tasks) if per_task > 0 else 0)}
    bar = tqdm(total=n_jobs, unit="task", disable=not progress, dynamic_ncols=True, smoothing=0.05)
    t_start = time.time()
    with stop_at(deadline) as spent:  # the budget stops waits for builds and for a quiet machine too
        m = Measurer.create(measurer, target, cfg, device.threads, pause_dir=dataset_dir, overlap=overlap, rpc=rpc,
                            device_id=device.id, artifact_dir=artifact_dir, batch_size=batch_size)
        results_of = run_id = None
        try:
            about = m.provenance()  # which measurer, and how it runs (the fast one: overlap or not)
            stats["overlap"] = about.get("overlap")
            run_id = store.add_run(run_provenance(device, target, cfg, rpc, per_task=per_task, seed=seed, **about,
                                                  programs_from=programs_from))
            m.on_wait = lambda waited, what: bar.set_postfix_str(f"{what} {waited:.0f}s")
            results_of = m.measure_jobs(jobs())
            for job, results in results_of:
                task = by_key[job["task_key"]]
                if isinstance(results, str):  # the build job failed as a whole (crash, timeout): nothing to store
                    stats["failed_jobs"] = stats.get("failed_jobs", 0) + 1
                    print(f"\n{task.name} ({task.key}): {results}", file=sys.stderr)
                    with open(failed_path, "a") as f:  # so a resumed run does not wait on it again
                        f.write(json.dumps({"task": task.key, "seed": "twins" if "traces" in job else seed,
                                            "error": results, "run": run_id}) + "\n")
                else:
                    recs = []
                    for b, secs, err, others in results:
                        if not b.program_hash:  # a trace that no longer applies: nothing to key a record by
                            stats["failed"] += 1
                            continue
                        recs.append(built_record(device, task, b, secs, err, others, cfg, run_id))
                        stats["failed" if err else "measured"] += 1
                        stats["twins_measured"] += bool("traces" in job and not err)
                        done.setdefault(task.key, set()).add(b.program_hash)
                    store.append(device.id, recs)
                bar.update(1)
                waited = m.times.get("paused", 0.0) + m.times.get("wait_quiet", 0.0)
                rate = stats["measured"] / max(1e-9, time.time() - t_start - waited)
                bar.set_postfix(ok=stats["measured"], failed=stats["failed"], waited=f"{waited:.0f}s",
                                rate=f"{rate:.2f}/s not waiting")
                if spent.is_set():
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            if not spent.is_set():  # a stop signal, not the budget
                raise
            stats["stopped_by_budget"] = True
        finally:
            if results_of is not None:
                results_of.close()
            bar.close()
            m.close()
    stats["skipped_done"] = m.skipped + twins_done
    stats["seconds"] = round(time.time() - t_start, 1)
    stats["programs_per_s"] = round(stats["measured"] / max(1e-9, stats["seconds"]), 3)
    stats["times"] = {k: round(v, 1) for k, v in m.times.items()}
    stats["run"] = run_id
    return stats


def twin_traces(store: RecordStore, source: str, tasks: dict, done: dict | None = None) -> tuple[dict[str, list], int]:
    """Per task key (of ``tasks``, a dict by key), the traces of ``source``'s labelled programs but those in
    ``done`` (task key -> program hashes this device has already: replaying a trace only to skip it costs
    a build worker as much as a new program); and how many were left out so."""
    if not store.files(source):
        raise ValueError(f"--programs-from {source}: no records of that device in {store.root}")
    done = done or {}
    out: dict[str, list] = {}
    skipped = 0
    for r in store.records(source):
        if label(r) is not None and r.task in tasks and r.has_trace:
            if r.program_hash in done.get(r.task, ()):
                skipped += 1
            else:
                out.setdefault(r.task, []).append(r.trace)
    return out, skipped


def built_record(device, task, b, secs: list, err: str | None, others: float, cfg, run_id: str, **extra):
    """The record of one program a measurer built (``cdmpp.measure.measurer.Built``) and ran."""
    return program_record(device.id, task, b.program_hash, b.trace, secs, err, b.build_s, others, cfg, run_id, **extra)


def failed_jobs_path(dataset_dir: str, device_id: str) -> str:
    """Where a device's build jobs that failed as a whole (timed out, crashed a worker) are listed."""
    return os.path.join(dataset_dir, f"failed-jobs-{slug(device_id)}.jsonl")


def _failed_jobs(path: str) -> set[tuple[str, str]]:
    """(task key, seed or "twins") of the jobs listed in ``path``: the same job would fail again (its
    programs are drawn from the same seed), so a resumed collection skips it instead of waiting out its
    build timeout. Delete the file to retry them."""
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {(j["task"], str(j["seed"])) for j in map(json.loads, filter(str.strip, f))}
