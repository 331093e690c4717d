"""``cdmpp remeasure`` and ``cdmpp noise``: measure stored programs again, for more passes per label or
for the run-to-run noise of a device."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time

from cdmpp.devices.probe import check_runs_here
from cdmpp.measure.measurer import MeasureConfig
from cdmpp.measure.metaschedule import MetaScheduleMeasurer
from cdmpp.measure.results import pass_record, run_provenance
from cdmpp.measure.stop import stop_at
from cdmpp.records.labels import label, usable
from cdmpp.records.record import MISSING, Record
from cdmpp.records.store import RecordStore


def remeasure(tasks, dataset_dir: str, device, target, passes: int = 2, min_gap_minutes: float = 30.0,
              budget_minutes: float | None = None, cfg: MeasureConfig | None = None, batch_size: int = 32,
              probe_only: bool = False, runs: set[str] | None = None, rpc=None, artifact_dir: str | None = None,
              progress: bool = True, unstable_only: bool = False, random_share: float = 0.0, seed: int = 0,
              hashes: set[str] | None = None) -> dict:
    """Measure stored programs again until each label has ``passes`` valid passes, each one at least
    ``min_gap_minutes`` after the one before; a label is the fastest repeat over all its passes.
    ``runs``: only programs first measured by these collection runs (one that hit a slow spell).

    Why: on a shared VM a slow spell (a neighbour, the host) lasts minutes and slows every repeat of a
    pass, so one pass's fastest repeat is not enough: the fastest over passes hours apart is
    (``datasets/README.md`` has the figures). A pass is a record of its own (``<id>|pass<N>``, ``of`` = the
    record's id) appended like any other, so a killed run resumes. ``probe_only``: just the device's
    fixed probe set (``cdmpp noise``), to see what a pass does to the noise before paying for all.
    ``hashes``: only these programs (e.g. ``implausible_twins``), each given one more pass whatever
    its count, so that a suspect label is checked even when it already has ``passes``.
    """
    import json

    from tqdm import tqdm

    from cdmpp.program.inputs import apply_trace
    from cdmpp.records.store import slug
    from cdmpp.zoo.tasks import load_task_mod

    if rpc is None:  # measured here: the device must be this machine's chip
        check_runs_here(device)
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
    for r in store.records(device.id):
        if label(r) is None or r.task not in tasks.tasks or (only is not None and r.id not in only):
            continue
        if runs is not None and r.run not in runs:
            continue
        if unstable_only and r.stable is not False and not _drawn(r.id, random_share, seed):
            continue
        if hashes is not None and r.program_hash not in hashes:
            continue
        valid = [r] + [p for p in r.remeasures if usable(p)]
        if hashes is None and len(valid) >= passes:
            continue
        if now - max(_measured_at(p, provenance) for p in valid) < 60 * min_gap_minutes:
            waiting += 1
            continue
        todo.append((r, len(r.remeasures) + 2))  # a pass number no earlier pass of r used
    todo.sort(key=lambda t: t[0].task)
    run_id = store.add_run(run_provenance(device, target, cfg, rpc, mode="remeasure", passes=passes))
    measurer = None  # its build and run workers take seconds to start: only when there is work
    if todo:
        measurer = MetaScheduleMeasurer(target, cfg, rpc, pause_flag=os.path.join(dataset_dir, "PAUSE"),
                                        artifact_dir=artifact_dir)
    bar = tqdm(total=len(todo), unit="prog", desc="remeasure", disable=not progress, dynamic_ncols=True)
    if measurer:
        measurer.on_wait = lambda waited, what: bar.set_postfix_str(f"{what} {waited:.0f}s")
    deadline = time.monotonic() + budget_minutes * 60 if budget_minutes else None
    stats = {"measured": 0, "failed": 0, "todo": len(todo), "too_recent": waiting, "stopped_by_budget": False}
    t_start, task_mod = time.time(), (None, None)
    try:
        with stop_at(deadline) as spent:  # the budget also ends a wait for a quiet machine
            try:
                for i in range(0, len(todo), batch_size):
                    batch, mods = todo[i:i + batch_size], []
                    for r, _ in batch:
                        if task_mod[0] != r.task:
                            task_mod = (r.task, load_task_mod(tasks[r.task]))
                        mods.append(apply_trace(task_mod[1], r.trace))
                    results = measurer.measure(mods, [r.task for r, _ in batch], [r.id for r, _ in batch])
                    recs = []
                    for (r, n), (secs, err, build_s, others) in zip(batch, results):
                        recs.append(pass_record(r, n, device.id, secs, err, build_s, others, cfg, run_id))
                        stats["failed" if err else "measured"] += 1
                    store.append(device.id, recs)
                    bar.update(len(batch))
                    bar.set_postfix(ok=stats["measured"], failed=stats["failed"])
            except KeyboardInterrupt:
                if not spent.is_set():  # a stop signal, not the budget
                    raise
                stats["stopped_by_budget"] = True
    finally:
        bar.close()
        if measurer:
            measurer.close()
    stats["seconds"] = round(time.time() - t_start, 1)
    stats["run"] = run_id
    return stats


def implausible_twins(dataset_dir: str, device, twin, min_seconds: float = 1e-4, slower: float = 1.5,
                      superlinear: float = 1.3) -> set[str]:
    """Hashes of the programs whose labels on ``device`` and ``twin`` (``DeviceSpec`` of one CPU at two
    thread counts) no thread-count physics explains: for a kernel of at least ``min_seconds``, the run
    with more threads more than ``slower`` times slower than the one with fewer, or faster by more than
    ``superlinear`` x the thread ratio. Such a pair is a measurement to check (a slow spell in every pass
    of one label), not a regime to learn; the check is one more pass on each device (``remeasure``)."""
    few, many = sorted((device, twin), key=lambda d: d.threads)
    if few.threads == many.threads:
        raise ValueError(f"{device.id} and {twin.id} run the same number of threads: no speedup to check")
    store = RecordStore(dataset_dir)
    labels = {d.id: {r.program_hash: label(r) for r in store.records(d.id) if label(r) is not None}
              for d in (few, many)}
    out = set()
    for h, t_few in labels[few.id].items():
        t_many = labels[many.id].get(h)
        if t_many is None or max(t_few, t_many) < min_seconds:
            continue
        if t_many > slower * t_few or t_few > superlinear * (many.threads / few.threads) * t_many:
            out.add(h)
    return out


def _drawn(record_id: str, share: float, seed: int) -> bool:
    """A fixed pseudo-random ``share`` of the records (the same ones on every call)."""
    return share > 0 and int(hashlib.sha256(f"{seed}:{record_id}".encode()).hexdigest()[:8], 16) < share * 2**32


def _measured_at(measurement: Record, runs: dict) -> float:
    """When a pass was measured; records older than the ``measured_at`` field fall back to their
    run's start (earlier than the truth, so a gap can only look longer than it was)."""
    if measurement.measured_at is not MISSING:
        return float(measurement.measured_at)
    date = (runs.get(measurement.run) or {}).get("date")
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

    from cdmpp.program.inputs import apply_trace
    from cdmpp.records.store import slug
    from cdmpp.zoo.tasks import load_task_mod

    check_runs_here(device)  # measured here: the device must be this machine's chip
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
    by_id = {r.id: r for r in store.records(device.id)
             if label(r) is not None and r.task in tasks.tasks and r.run in same}
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
    with MetaScheduleMeasurer(target, cfg, pause_flag=os.path.join(dataset_dir, "PAUSE"),
                              artifact_dir=artifact_dir) as measurer:
        for i in tqdm(range(0, len(recs), 24), desc="re-measure", unit="batch", disable=not progress):
            batch = recs[i:i + 24]
            mods = [apply_trace(load_task_mod(tasks[r.task]), r.trace) for r in batch]
            for r, (secs, err, _, others) in zip(batch, measurer.measure(mods, keys=[r.id for r in batch])):
                if err or not secs or others >= cfg.quiet_share:
                    continue
                old, first, new = label(r), label(r, passes=1), min(secs)
                rows.append({"id": r.id, "old": old, "new": new, "first_pass": first,
                             "passes": 1 + sum(usable(p) for p in r.remeasures)})
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
