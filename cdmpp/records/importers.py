"""Bring records measured elsewhere (another machine's dataset folder) into a dataset, with provenance.

A lent machine writes the same store format (``cdmpp.records.store``); its records and run entries are appended
here unchanged, except for an ``imported`` note on each run entry (from where, when). Records already
present (same id) are skipped, so importing the same folder twice adds nothing.

``python -m cdmpp.records.importers SRC_DIR [--dataset datasets/measurements]``
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time

from cdmpp import defaults
from cdmpp.records.store import LoadReport, RecordStore, read_records, slug


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
    for name in ("PROVENANCE.md",):
        if os.path.exists(os.path.join(src, name)):
            for dev in devices:
                shutil.copyfile(os.path.join(src, name), os.path.join(dataset_dir, f"provenance-{slug(dev)}.md"))
    return {"records": sum(map(len, new.values())), "devices": sorted(devices), "runs": runs_added,
            "already_present": report.duplicates, "problems": report.problems}


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
