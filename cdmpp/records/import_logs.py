"""``cdmpp import ansor|autotvm``: Ansor (auto_scheduler, Tenset) and AutoTVM JSON logs as records of a device.

Each log line is read here (label, target, dedupe key), then replayed by the TVM 0.19 side environment
(``cdmpp.records.side_env``), which returns the scheduled program and its unscheduled workload as TVMScript;
both are read with TVM 0.27. A record is the MetaSchedule importer's shape (``importers.import_metaschedule``)
with the program's TVMScript in ``program`` instead of a trace (``trace`` is null), ``flops`` of its workload,
and ``log_key`` (a hash of the line's input: workload, schedule, target) for idempotence. The label is the
record's fastest cost (``records.labels.label``: the fastest repeat), as for run_secs. Problems are counted
and reported per line, never fatal.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time

from cdmpp.devices.spec import target_kind_of_id
from cdmpp.records.importers import FAILED_RUN_S, _merge_workloads, stored_keys
from cdmpp.records.record import Record
from cdmpp.records.store import RecordStore, record_id

FORMATS = ("ansor", "autotvm")


def parse_line(fmt: str, line: str) -> dict:
    """The fields of one log line cdmpp needs before replaying it: ``key`` (dedupe), ``target`` (string),
    ``workload_key``, ``seconds`` (the costs), ``error_no``. ValueError naming what is wrong."""
    try:
        d = json.loads(line)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    try:
        if fmt == "ansor":  # {"i": [[workload_key, target, hw_params, target_host, ...], [[], steps]], "r": [costs, err, ...]}
            inp, res = d["i"], d["r"]
            task, state = inp[0], inp[1]
            wkey, target = task[0], task[1]
            ident = [task, state]
        elif fmt == "autotvm":  # {"input": [target, template, args, kwargs], "config": {...}, "result": [costs, err, ...]}
            inp, res = d["input"], d["result"]
            target, wkey = inp[0], json.dumps([inp[1], inp[2]])
            ident = [inp, d["config"].get("entity", d["config"])]
        else:
            raise ValueError(f"unknown log format {fmt!r} (expected one of {FORMATS})")
        costs, error_no = res[0], res[1]
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise ValueError(f"not an {fmt} record (missing {e.__class__.__name__}: {e})") from None
    if not isinstance(target, str) or not isinstance(wkey, str):
        raise ValueError(f"not an {fmt} record (target {target!r}, workload {wkey!r})")
    try:
        secs = [float(c) for c in costs]
    except (TypeError, ValueError):
        secs = [math.nan]
    key = hashlib.sha256(f"{fmt}|{json.dumps(ident, sort_keys=True, separators=(',', ':'))}".encode()).hexdigest()[:20]
    return {"key": key, "target": target.strip(), "workload_key": wkey, "seconds": secs, "error_no": error_no}


def _kind_of(target: str) -> str:
    return target.split()[0] if target.split() else ""


def import_log(fmt: str, log: str, dataset_dir: str, device: str, task_table=None, device_table=None,
               workloads: str | None = None, side_path: str | None = None, ids_out: str | None = None,
               batch: int = 500, worker=None) -> dict:
    """Append the records of the ``fmt`` log ``log`` to ``dataset_dir`` as records of ``device``; returns a
    summary (counts, per-line problems). ``workloads``: an Ansor workload table for keys the worker cannot
    rebuild (``tvm019_worker.register_workloads``); ``side_path``: the side environment. ``worker``: a ``side_env.Worker`` to reuse."""
    from cdmpp.program import tvm_env
    from cdmpp.program.features import program_flops, program_hash
    from cdmpp.records import side_env
    from cdmpp.zoo.tasks import Task, task_key

    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r} (expected one of {FORMATS})")
    if not os.path.exists(log):
        raise FileNotFoundError(f"{log}: no such log")
    tvm = tvm_env.setup()
    t0 = time.perf_counter()
    counts = {"added": 0, "already_present": 0, "same_program": 0, "unreadable": 0, "no_run_secs": 0,
              "failed_run": 0, "wrong_target_kind": 0, "does_not_replay": 0, "does_not_translate": 0}
    problems: list[str] = []
    store = RecordStore(dataset_dir)
    have_ids, have_keys = stored_keys(store, device, "log_key")
    spec = device_table.get(device).to_dict() if device_table is not None and device in device_table else None
    tasks: dict[str, tuple | None] = {}  # workload_key -> (task key, name, flops) or None (did not translate)
    own = worker is None
    run_id, ids, pending = None, [], []
    src = os.path.abspath(log)
    try:
        with open(log, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.decode("utf-8", "replace").strip()
                if not line or line.startswith("#"):
                    continue
                where = f"{log}:{lineno}"
                try:
                    p = parse_line(fmt, line)
                except ValueError as e:
                    counts["unreadable"] += 1
                    problems.append(f"{where}: {e}")
                    continue
                secs = p["seconds"]
                if p["error_no"] != 0 or (secs and max(secs) >= FAILED_RUN_S):
                    counts["failed_run"] += 1
                    problems.append(f"{where}: a failed build or run (error_no {p['error_no']})")
                    continue
                if not secs or not all(math.isfinite(s) and s > 0 for s in secs):
                    counts["no_run_secs"] += 1
                    problems.append(f"{where}: costs {secs!r} are empty or not finite positive numbers")
                    continue
                if _kind_of(p["target"]) != target_kind_of_id(device):
                    counts["wrong_target_kind"] += 1
                    problems.append(f"{where}: target {p['target']!r}, but {device} is featurized as "
                                    f"{target_kind_of_id(device)} (a GPU device's id names cuda)")
                    continue
                if p["key"] in have_keys:
                    counts["already_present"] += 1
                    ids.append(have_keys[p["key"]])
                    continue
                if worker is None:
                    worker = side_env.Worker(side_path)
                    if workloads:
                        ans = worker.ask({"kind": "workloads", "path": os.path.abspath(workloads)})
                        if not ans["ok"]:
                            raise ValueError(f"{workloads}: not a workload table ({ans['error']})")
                ans = worker.ask({"kind": fmt, "line": line})
                if not ans["ok"]:
                    counts["does_not_replay"] += 1
                    problems.append(f"{where}: does not replay with TVM 0.19: {ans['error']}")
                    continue
                wk = ans["workload_key"]
                if wk not in tasks:
                    try:
                        wmod = side_env.parse(ans["workload"])
                        tkey = task_key(wmod)
                        known = task_table.tasks.get(tkey) if task_table is not None else None
                        tasks[wk] = (tkey, known.name if known else ans["name"], program_flops(wmod),
                                     sorted(known.occurrences) if known else [])
                        if known is None:
                            _merge_workloads(dataset_dir, [Task(tkey, ans["name"], tvm.ir.save_json(wmod))], src)
                    except ValueError as e:
                        tasks[wk] = None
                        problems.append(f"{where}: workload {wk} does not translate: {e}")
                if tasks[wk] is None:
                    counts["does_not_translate"] += 1
                    continue
                tkey, name, flops, networks = tasks[wk]
                try:
                    text = side_env.translate(ans["program"])
                    phash = program_hash(side_env.parse(ans["program"]))
                except ValueError as e:
                    counts["does_not_translate"] += 1
                    problems.append(f"{where}: program does not translate: {e}")
                    continue
                rid = record_id(device, tkey, phash)
                have_keys[p["key"]] = rid
                ids.append(rid)
                if rid in have_ids:
                    counts["same_program"] += 1
                    continue
                have_ids.add(rid)
                if run_id is None:
                    run_id = store.add_run({
                        "device": device, "spec": spec, "tvm_version": tvm.__version__, "side_tvm_version": "0.19",
                        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv),
                        "imported": {"from": src, "format": f"{fmt}-log", "workloads": workloads}})
                pending.append(Record(  # a TVMScript program and no trace
                    id=rid, device=device, task=tkey, task_name=name, networks=networks, program_hash=phash,
                    flops=flops, program=text, trace=None, seconds=secs, error=None, run=run_id,
                    extra={"source": f"{src}:{lineno}", "target": p["target"], "log_key": p["key"],
                           "log_target": ans["target"]}))
                counts["added"] += 1
                if len(pending) >= batch:
                    store.append(device, pending)
                    pending = []
    finally:
        store.append(device, pending)
        if own and worker is not None:
            worker.close()
    ids = list(dict.fromkeys(ids))
    if ids_out:
        with open(ids_out, "w") as f:
            f.write("".join(i + "\n" for i in ids))
    seconds = time.perf_counter() - t0
    return {"device": device, "format": fmt, "run": run_id, **counts,
            "errors": sum(v for k, v in counts.items() if k not in ("added", "already_present", "same_program")),
            "records_in_dataset": len(ids), "workloads": len(tasks), "spec": spec is not None,
            "seconds": round(seconds, 2), "ids_file": ids_out, "problems": problems}
