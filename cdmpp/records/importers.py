"""Bring records measured elsewhere into a dataset, with provenance: another machine's dataset folder
(``import_store``) or a MetaSchedule JSON database (``import_metaschedule``, ``cdmpp import metaschedule``).

A lent machine writes the same store format (``cdmpp.records.store``); its records and run entries are appended
here unchanged, except for an ``imported`` note on each run entry (from where, when). Records already
present (same id) are skipped, so importing the same folder twice adds nothing.

``python -m cdmpp.records.importers SRC_DIR [--dataset datasets/measurements]``

A MetaSchedule database (TVM 0.27's ``database_workload.json`` + ``database_tuning_record.json``) holds, per
tuning record, a trace, its workload's index, the measured ``run_secs`` and the target. Each trace is
replayed on its workload (so the record's program and hash are the collector's), and becomes a record of
the collector's shape. Workloads the project's task table lacks go to ``workloads.jsonl`` beside the
records (``WORKLOADS``), which ``load_dataset`` reads as an extension of the table. The same database in
SQLite form (mshr-h/metaschedule_sqlitedatabase's ``SQLiteDatabase``: tables ``workload`` and
``tuning_record`` whose columns hold the JSON lines' values) is read the same way (``_database_lines``);
workloads saved by TVM < 0.20 are read through the TVM 0.19 side environment and their traces renamed
(``_upgrade_trace``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import math
import os
import shutil
import sqlite3
import sys
import time

from cdmpp import defaults
from cdmpp.devices.spec import target_kind_of_id
from cdmpp.records.record import Record
from cdmpp.records.store import LoadReport, RecordStore, read_records, record_id, slug

WORKLOADS = "workloads.jsonl"  # a dataset's own workloads: {"key", "name", "mod_json", "source"} per line


def import_store(src: str, dataset_dir: str, seal: bool = True) -> dict:
    """Append ``src``'s records (parts and active files) and run entries to ``dataset_dir``."""
    files = sorted(glob.glob(os.path.join(src, "*.part-*.jsonl.gz"))) + sorted(glob.glob(os.path.join(src, "*.active.jsonl")))
    if not files:
        raise ValueError(f"{src}: no record files (*.part-NNNN.jsonl.gz, *.active.jsonl)")
    store = RecordStore(dataset_dir)
    have = set()
    for r in store.iter_records():
        have |= {r["id"]} | {p["id"] for p in r.get("remeasures", [])}
    report, new, devices = LoadReport(), {}, set()
    for path in files:
        for rec in read_records(path, report):
            rid, dev = rec["id"], rec.get("device")
            if not dev:
                report.problems.append(f"{path}: record {rid} has no device")
                continue
            if rid in have:
                report.duplicates += 1
                continue
            have.add(rid)
            new.setdefault(dev, []).append(rec)
            devices.add(dev)
    known_runs = store.runs()
    runs_added = 0
    src_runs = os.path.join(src, "runs.jsonl")
    if os.path.exists(src_runs):
        for line in open(src_runs):
            if line.strip():
                run = json.loads(line)
                if run.get("run") not in known_runs:
                    run["imported"] = {"from": os.path.abspath(src), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
                    store.add_run(run)
                    runs_added += 1
    for dev, recs in new.items():
        store.append(dev, recs)
        if seal:
            store.seal(dev)
    _merge_workloads(dataset_dir, imported_workloads(src).values(), None)
    for name in ("PROVENANCE.md",):
        if os.path.exists(os.path.join(src, name)):
            for dev in devices:
                shutil.copyfile(os.path.join(src, name), os.path.join(dataset_dir, f"provenance-{slug(dev)}.md"))
    return {"records": sum(map(len, new.values())), "devices": sorted(devices), "runs": runs_added,
            "already_present": report.duplicates, "problems": report.problems}


def imported_workloads(dataset_dir: str) -> dict:
    """Task key -> ``Task`` of the dataset's ``workloads.jsonl`` (empty without one; unreadable lines skipped)."""
    from cdmpp.zoo.tasks import Task

    path = os.path.join(dataset_dir, WORKLOADS)
    out = {}
    if os.path.exists(path):
        with open(path, "rb") as f:
            for line in f:
                try:
                    d = json.loads(line)
                    out.setdefault(d["key"], Task(d["key"], d["name"], d["mod_json"]))
                except (ValueError, KeyError, TypeError):
                    continue
    return out


def with_imported_workloads(task_table, dataset_dir: str):
    """``task_table`` plus the dataset's own workloads it lacks (a copy), so that records of tasks outside
    the project's table (imported tuning logs) still rebuild; the table itself when there are none."""
    have = task_table.tasks if task_table is not None else {}
    extra = {k: t for k, t in imported_workloads(dataset_dir).items() if k not in have}
    if not extra:
        return task_table
    from cdmpp.zoo.tasks import TaskTable

    return TaskTable(tasks={**have, **extra}, meta=dict(task_table.meta) if task_table is not None else {})


def _merge_workloads(dataset_dir: str, tasks, source: str | None) -> int:
    """Append the tasks whose key ``workloads.jsonl`` lacks (``source``: the file they came from); returns
    how many."""
    have = imported_workloads(dataset_dir)
    new = [t for t in tasks if t.key not in have]
    if new:
        path = os.path.join(dataset_dir, WORKLOADS)
        torn = os.path.exists(path) and os.path.getsize(path) and open(path, "rb").read()[-1:] != b"\n"
        with open(path, "a") as f:
            if torn:  # a write cut short: end its line, which is then skipped as unreadable
                f.write("\n")
            for t in new:
                f.write(json.dumps({"key": t.key, "name": t.name, "mod_json": t.mod_json,
                                    "source": source}) + "\n")
            f.flush()
            os.fsync(f.fileno())
    return len(new)


FAILED_RUN_S = 1e9  # MetaSchedule stores a failed build or run as run_secs [1e10]


def _ms_key(task: str, trace) -> str:
    """The dedupe key of a tuning record: its workload and its trace (replaying it is not needed to know
    that it was imported before)."""
    return hashlib.sha256(f"{task}|{json.dumps(trace, separators=(',', ':'))}".encode()).hexdigest()[:20]


def _task_name(mod) -> str:
    """A workload's name: its function's global symbol unless that is ``main`` (``tune_tir``), else the
    names of its top-level blocks."""
    func = next(iter(mod.functions.values()))
    name = str((func.attrs or {}).get("global_symbol", "main"))
    if name != "main":
        return name
    try:
        from tvm.s_tir import Schedule

        sch = Schedule(mod)
        return "+".join(sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))) or name
    except Exception:  # no root block: keep the symbol
        return name


def _database_lines(db: str):
    """(workload source, record source, workload lines, record lines, format) of the MetaSchedule database
    ``db``, each lines an iterator of (line number or SQLite rowid, one JSON text as the JSON database's line).

    Why one reader: TVM's JSON folder and the SQLite form (a folder with ``database_{workload,
    tuning_record}.sqlite`` or ``.db``, or one file holding both tables) store the same JSON values, so
    both feed the same per-record path; a row is joined as its JSON line would be (a bad column then reads
    as an unreadable line)."""
    json_paths = [os.path.join(db, f"database_{n}.json") for n in ("workload", "tuning_record")]
    if all(map(os.path.exists, json_paths)):
        def lines(path):
            with open(path, "rb") as f:
                yield from ((i, x) for i, x in enumerate(f, 1) if x.strip())
        return (*json_paths, lines(json_paths[0]), lines(json_paths[1]), "metaschedule-json")
    paths = [(db, db)] if os.path.isfile(db) else [
        [os.path.join(db, f"database_{n}.{ext}") for n in ("workload", "tuning_record")] for ext in ("sqlite", "db")]
    for wl, rec in paths:
        if os.path.exists(wl) and os.path.exists(rec):
            for path, table in ((wl, "workload"), (rec, "tuning_record")):
                try:
                    with contextlib.closing(_sqlite(path)) as con:
                        con.execute(f"SELECT rowid FROM {table} LIMIT 1").fetchall()
                except sqlite3.DatabaseError as e:
                    raise FileNotFoundError(f"{path}: not a MetaSchedule SQLite database ({e})") from None
            return (wl, rec,
                    _rows(wl, "SELECT rowid, shash, mod FROM workload ORDER BY rowid", lambda r: json.dumps(list(r))),
                    _rows(rec, "SELECT rowid, workload_index, trace, run_secs, target, args_info FROM tuning_record "
                          "ORDER BY rowid", lambda r: "[%s, [%s, %s, %s, %s]]" % r),
                    "metaschedule-sqlite")
    raise FileNotFoundError(f"{db}: no database_workload.json + database_tuning_record.json, nor a SQLite "
                            "database (database_workload.sqlite + database_tuning_record.sqlite, or one .sqlite/.db "
                            "file with both tables): not a MetaSchedule database")


def _sqlite(path: str):
    return sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True)  # read-only: never touch theirs


def _rows(path: str, query: str, join):
    with contextlib.closing(_sqlite(path)) as con:
        yield from ((r[0], join(tuple(r[1:]))) for r in con.execute(query))


def _legacy_workload(value, worker, first: Exception):
    """The IRModule of a workload that TVM < 0.20 saved (its JSON graph has ``root``/``nodes``, which 0.27
    no longer reads): loaded by the TVM 0.19 side environment, printed as TVMScript, parsed by 0.27."""
    import base64

    from cdmpp.records import side_env

    raw = base64.b64decode(value[1])
    text = raw[8:].decode() if raw[:1] != b"{" else raw.decode()  # dmlc's 8-byte length prefix
    if '"root"' not in text[:200]:
        raise first
    ans = worker().ask({"kind": "module", "json": text})
    if not ans.get("ok"):
        raise ValueError(f"TVM 0.19 does not load it: {ans.get('error')}")
    return side_env.parse(ans["script"])


def _upgrade_trace(trace):
    """A trace written by TVM <= 0.19 in 0.27's words: ``GetBlock`` is ``GetSBlock`` and ``Split`` has a
    second attribute (``disable_predication``, False before); 0.27's own traces come back unchanged."""
    try:
        insts, decisions = trace
        if not any(i[0] == "GetBlock" or (i[0] == "Split" and len(i[2]) == 1) for i in insts):
            return trace
        return [[["GetSBlock" if i[0] == "GetBlock" else i[0], i[1],
                  i[2] + [False] if i[0] == "Split" and len(i[2]) == 1 else i[2], *i[3:]] for i in insts], decisions]
    except (TypeError, ValueError, IndexError, KeyError):  # not a trace's shape: the replay reports it
        return trace


def stored_keys(store: RecordStore, device: str, key_field: str) -> tuple[set, dict]:
    """The ids of ``device``'s stored records, and its imported records' ids by their source key
    (``key_field``: "ms_key", "log_key"), so a second import of the same lines adds nothing."""
    ids, keys = set(), {}
    for r in store.iter_records(device, traces=False):
        ids.add(r["id"])
        if r.get(key_field):
            keys[r[key_field]] = r["id"]
    return ids, keys


def import_metaschedule(db_dir: str, dataset_dir: str, device: str, task_table=None, device_table=None,
                        ids_out: str | None = None, batch: int = 1000) -> dict:
    """Append the tuning records of the MetaSchedule database ``db_dir`` (a JSON folder, or SQLite:
    ``_database_lines``) to ``dataset_dir`` as records of ``device``; returns a summary (counts, per-line
    problems, the records' ids).

    A record whose line does not parse, whose workload is missing, whose run_secs are empty, non-finite
    or MetaSchedule's failure mark, or whose trace does not replay is counted and reported by line, never
    fatal. Idempotent: a tuning record already imported (same device, workload and trace) is skipped before
    its replay; a second tuning record of a program already stored adds nothing either. ``ids_out``:
    write the ids of every record of the database now in the dataset (new or not), one a line, for
    ``cdmpp finetune --ids``."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    if target_kind_of_id(device) == "cuda":  # tensor-core traces name the CUDA intrinsics
        tvm_env.load_cuda_intrinsics()
    from tvm.s_tir.meta_schedule.database import Workload

    from cdmpp.program.features import program_hash
    from cdmpp.program.inputs import apply_trace
    from cdmpp.zoo.tasks import Task, task_key

    t0 = time.perf_counter()
    wl_path, rec_path, wl_lines, rec_lines, fmt = _database_lines(db_dir)
    side = []  # the TVM 0.19 worker (or why there is none), started for the first workload of TVM < 0.20

    def worker():
        if not side:
            from cdmpp.records.side_env import SideEnvError, Worker
            try:
                side.append(Worker())
            except SideEnvError as e:
                side.append(e)
        if isinstance(side[0], Exception):
            raise side[0]
        return side[0]

    problems: list[str] = []
    counts = {"added": 0, "already_present": 0, "same_program": 0, "unreadable": 0, "workload_missing": 0,
              "no_run_secs": 0, "failed_run": 0, "does_not_replay": 0, "wrong_target_kind": 0}
    workloads: list = []  # by index: (task key, mod, name) or None
    new_tasks: list = []
    try:
        for lineno, line in wl_lines:
            try:
                value = json.loads(line)
                try:
                    mod = Workload.from_json(value).mod
                except Exception as e:  # saved by an older TVM?
                    mod = _legacy_workload(value, worker, e)
                key = task_key(mod)
            except Exception as e:  # a torn line, one no TVM here loads, or no side environment for it
                problems.append(f"{wl_path}:{lineno}: unreadable workload ({e.__class__.__name__}: {str(e)[:160]})")
                workloads.append(None)
                continue
            known = task_table.tasks.get(key) if task_table is not None else None
            workloads.append((key, mod, known.name if known else _task_name(mod)))
            if known is None:
                new_tasks.append(Task(key, workloads[-1][2], tvm.ir.save_json(mod)))
    finally:
        if side and not isinstance(side[0], Exception):
            side[0].close()
    store = RecordStore(dataset_dir)
    have_ids, have_keys = stored_keys(store, device, "ms_key")
    spec = device_table.get(device).to_dict() if device_table is not None and device in device_table else None
    run_id = None  # the run entry is written with the first new record: a re-import adds nothing
    new_workloads = _merge_workloads(dataset_dir, new_tasks, os.path.abspath(wl_path))
    ids: list[str] = []
    pending: list[dict] = []
    src = os.path.abspath(rec_path)
    for lineno, line in rec_lines:
        where = f"{rec_path}:{lineno}"
        try:
            widx, (trace, run_secs, target, _args) = json.loads(line)
            wl = workloads[widx] if isinstance(widx, int) and 0 <= widx < len(workloads) else None
        except (ValueError, TypeError) as e:
            counts["unreadable"] += 1
            problems.append(f"{where}: unreadable tuning record ({e.__class__.__name__})")
            continue
        if wl is None:
            counts["workload_missing"] += 1
            problems.append(f"{where}: workload {widx} is missing or unreadable")
            continue
        try:
            secs = [float(s) for s in run_secs or ()]
        except (TypeError, ValueError):
            secs = [math.nan]
        if not secs or not all(math.isfinite(s) and s > 0 for s in secs):
            counts["no_run_secs"] += 1
            problems.append(f"{where}: run_secs {run_secs!r} are empty or not finite positive numbers")
            continue
        if max(secs) >= FAILED_RUN_S:
            counts["failed_run"] += 1
            problems.append(f"{where}: a failed build or run (run_secs {run_secs!r})")
            continue
        kind = target.get("kind") if isinstance(target, dict) else None
        if kind != target_kind_of_id(device):
            counts["wrong_target_kind"] += 1
            problems.append(f"{where}: target kind {kind!r}, but {device} is featurized as "
                            f"{target_kind_of_id(device)} (a GPU device's id names cuda)")
            continue
        key, mod, name = wl
        trace = _upgrade_trace(trace)
        mkey = _ms_key(key, trace)
        if mkey in have_keys:
            counts["already_present"] += 1
            ids.append(have_keys[mkey])
            continue
        try:
            phash = program_hash(apply_trace(mod, trace))
        except Exception as e:  # ProgramError, or a trace of the wrong shape
            counts["does_not_replay"] += 1
            problems.append(f"{where}: trace does not replay on workload {widx}: {str(e).splitlines()[-1][:200]}")
            continue
        rid = record_id(device, key, phash)
        have_keys[mkey] = rid
        ids.append(rid)
        if rid in have_ids:
            counts["same_program"] += 1
            continue
        have_ids.add(rid)
        if run_id is None:
            run_id = store.add_run({
                "device": device, "spec": spec, "tvm_version": tvm.__version__,
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv),
                "imported": {"from": os.path.abspath(db_dir), "format": fmt}})
        known = task_table.tasks.get(key) if task_table is not None else None
        pending.append(Record(  # the collector's fields, where the database has them
            id=rid, device=device, task=key, task_name=name,
            networks=sorted(known.occurrences) if known else [], program_hash=phash,
            trace=trace, seconds=secs, error=None, run=run_id,
            extra={"source": f"{src}:{lineno}", "target": json.dumps(target, sort_keys=True), "ms_key": mkey}))
        counts["added"] += 1
        if len(pending) >= batch:
            store.append(device, pending)
            pending = []
    store.append(device, pending)
    ids = list(dict.fromkeys(ids))
    if ids_out:
        with open(ids_out, "w") as f:
            f.write("".join(i + "\n" for i in ids))
    seconds = time.perf_counter() - t0
    return {"device": device, "run": run_id, **counts, "errors": sum(v for k, v in counts.items() if k not in (
                "added", "already_present", "same_program")),
            "records_in_dataset": len(ids), "workloads": len(workloads), "new_workloads": new_workloads,
            "spec": spec is not None, "seconds": round(seconds, 2),
            "records_per_s": round((counts["added"] + counts["already_present"]) / max(seconds, 1e-9), 1),
            "ids_file": ids_out, "problems": problems}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cdmpp.records.importers", description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a dataset folder written by cdmpp on another machine")
    ap.add_argument("--dataset", default=defaults.DATASET)
    args = ap.parse_args(argv)
    try:
        r = import_store(args.src, args.dataset)
    except ValueError as e:
        print(f"import: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
