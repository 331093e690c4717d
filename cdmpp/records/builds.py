"""Build a dataset's labelled programs for their device's target and count their instructions (``cdmpp assembly``):
the counts ``cdmpp.program.assembly`` defines, written into the ``AssemblyCounts`` folder that ``load_dataset``
attaches to each program. Builds take hours for a device's tens of thousands of programs, so they are kept."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from cdmpp.devices.table import DeviceTable
from cdmpp.program.assembly import N_COUNTS, AssemblyCounts, build_counts, build_key
from cdmpp.records.dataset import scheduled_module
from cdmpp.records.importers import with_imported_workloads
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore
from cdmpp.zoo.tasks import TaskTable


def build_device(device: str, dataset_dir: str, root: str, task_table: str, part: int = 0, parts: int = 1,
                 progress: bool = True, innermost: bool = False) -> int:
    """Build every labelled program of ``device`` in ``dataset_dir`` not yet in ``root`` for the device's target and
    count its instructions (``root/<build_key>/build-<part>-of-<parts>.npz``; ``part`` of ``parts``: run the parts
    side by side, one core each). Resumable: written every 100 programs (whole, then renamed), and a program built
    before, in any file, is not built again. A build that fails is reported and skipped. Programs of random schedules
    first, a search's candidates last. Returns programs built.

    ``innermost``: build again, instead, the programs whose innermost loops' counts are missing (built before 6 Dec),
    into ``innermost-<part>-of-<parts>.npz`` (hashes and those counts only: the whole module's stay as first built)."""
    spec = DeviceTable().get(device)
    if spec.target.get("kind") != "llvm":
        raise ValueError(f"{device}: assembly counts are of x86 LLVM builds, not {spec.target.get('kind')!r} code")
    if not 0 <= part < parts:
        raise ValueError(f"part {part} of {parts}: expected 0 <= part < parts")
    key, target = build_key(spec.target), spec.make_target()
    path = Path(root) / key / f"{'innermost' if innermost else 'build'}-{part}-of-{parts}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    hashes, rows, inner = [], [], []  # inner: the innermost loops' counts, kept for the study that may use them
    if path.exists():
        with np.load(path, allow_pickle=False) as z:
            hashes = z["hashes"].tolist()
            rows = list(z["counts"]) if "counts" in z.files else []
            inner = list(z["inner"]) if "inner" in z.files else [np.full(N_COUNTS, np.nan)] * len(hashes)
    counts = AssemblyCounts(root)
    done = (set(counts.inner_table(key)) if innermost else set(counts.table(key))) | set(hashes)
    todo: dict[str, object] = {}
    store = RecordStore(dataset_dir)
    for rec in store.records(device):
        if label(rec) is not None and rec.program_hash not in done:
            todo.setdefault(rec.program_hash, rec)
    # a search's candidates (and their twins on other devices) last: the evaluation's splits leave them out
    # read without traces and untyped: the whole store typed with its traces held 7.5 GB per part
    searched = {r["program_hash"] for r in store.iter_records(traces=False) if r.get("search")} if todo else set()
    todo_list = [todo[h] for h in sorted(todo, key=lambda h: (h in searched, h))][part::parts]
    del todo
    table, mods, t0 = with_imported_workloads(TaskTable.load(task_table), dataset_dir), {}, time.time()

    def save() -> None:
        tmp = path.with_suffix(".tmp.npz")
        whole = {} if innermost else {"counts": np.array(rows).reshape(-1, N_COUNTS)}
        np.savez_compressed(tmp, hashes=np.array(hashes, dtype=str), inner=np.array(inner).reshape(-1, N_COUNTS), **whole)
        os.replace(tmp, path)

    built = 0
    for i, rec in enumerate(todo_list):
        try:
            module_counts, loop_counts = build_counts(scheduled_module(rec, table, mods), target)
            rows.append(module_counts)
            inner.append(loop_counts)
            hashes.append(rec.program_hash)
            built += 1
        except Exception as e:  # noqa: BLE001 - one program's build failing stops none of the others
            print(f"{rec.program_hash}: not built: {str(e).strip().splitlines()[-1][:160]}", file=sys.stderr)
        if i % 100 == 99 or i == len(todo_list) - 1:
            save()
            if progress:
                rate = (i + 1) / max(time.time() - t0, 1e-9)
                print(f"{key} part {part}/{parts}: {i + 1}/{len(todo_list)} programs, {rate:.2f}/s, "
                      f"ETA {(len(todo_list) - i - 1) / rate / 60:.1f} min", flush=True)
    return built
