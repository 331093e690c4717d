"""Issue 55 item 5: was a schedule's vectorized loop really vectorized after lowering?

TVM's per-store rows say a loop is vectorized when the schedule says so; lowering (``VectorizeLoop``) turns such a
loop into vector loads and stores where it can and scalarizes it where it cannot (a condition it cannot
predicate, a non-unit stride in a concatenate, ...), and the row still says "vectorized". This rebuilds each
program of the pinned devices from its record (trace replayed), runs TVM's default lowering passes up to and
including ``VectorizeLoop`` (``tvm.s_tir.pipeline``'s list, without the target-dependent ones after it), and
counts, per program hash: vectorized loops in the schedule, stores after lowering, and those of them that store
a vector. ``experiments/fast_path_features.py --lowered`` reads the result.

``.venv/bin/python experiments/lowered_vectorization.py --part 0 --parts 2 &
  .venv/bin/python experiments/lowered_vectorization.py --part 1 --parts 2``: ~18 ms a program on the 2-core VM
(trace replay included); writes ``runs/lowered-vectorization-K-of-N.npz`` (hashes, counts). Then
``--describe amd-epyc-znver4-2t/llvm-avx512``: each task's fastest tenth against the rest.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import numpy as np

from cdmpp.evaluation.protocol import ProtocolOptions
from cdmpp.program import tvm_env
from cdmpp.records.dataset import _scheduled, _workload_of
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore
from cdmpp.zoo.tasks import TaskTable

COLUMNS = ("scheduled_vector_loops", "stores", "vector_stores")
_VECTOR = re.compile(r"x\d+$")  # a vector type's name: float32x16


def lowering():
    """TVM 0.27's default TIR pipeline (tvm/s_tir/pipeline.py) up to and including VectorizeLoop, the passes
    that need neither a target nor a GPU."""
    tvm = tvm_env.setup(1)
    from tvm import s_tir, tirx

    st, tt = s_tir.transform, tirx.transform
    return tvm.transform.Sequential([
        st.CanonicalizeLoop(), st.LowerCrossThreadReduction(), st.LowerInitBlock(),
        st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(), st.CompactBufferAllocation(),
        st.LowerMatchBuffer(), st.StmtSimplify(), st.LowerOpaqueBlock(), tt.FlattenBuffer(), tt.NarrowDataType(32),
        st.LoopPartition(), tt.VectorizeLoop(True)])


def _visit(stmt, fn) -> None:
    """Every statement under ``stmt`` (sequences, loop and block bodies, both branches), ``fn`` on each."""
    fn(stmt)
    seq = getattr(stmt, "seq", None)
    if seq is not None:
        for s in seq:
            _visit(s, fn)
        return
    for name in ("block", "init", "body", "then_case", "else_case"):
        child = getattr(stmt, name, None)
        if child is not None:
            _visit(child, fn)


def vector_facts(mod, passes) -> tuple[int, int, int]:
    """(vectorized loops in the schedule, stores after lowering, vector stores after lowering) of one module."""
    from tvm import tirx

    loops = stores = vector = 0

    def scheduled(n):
        nonlocal loops
        loops += isinstance(n, tirx.For) and n.kind == tirx.ForKind.VECTORIZED

    def lowered(n):
        nonlocal stores, vector
        if isinstance(n, tirx.BufferStore):
            stores += 1
            vector += bool(_VECTOR.search(str(n.value.ty)))

    for f in mod.functions.values():
        _visit(f.body, scheduled)
    for f in passes(mod).functions.values():
        _visit(f.body, lowered)
    return loops, stores, vector


def describe(device: str, dataset: str) -> None:
    """Each task's fastest tenth of ``device``'s programs against the rest: how often vectorization was asked
    for, how often lowering scalarized all or some of it, and the vector share of stores."""
    import glob
    from collections import defaultdict

    counts = {}
    for path in sorted(glob.glob("runs/lowered-vectorization-*.npz")):
        with np.load(path) as z:
            counts.update(zip(map(str, z["hashes"]), z["counts"]))
    by_task = defaultdict(list)
    for r in RecordStore(dataset).iter_records(device, traces=False):
        y = label(r)
        if y is not None and r["program_hash"] in counts:
            by_task[r["task"]].append((y, counts[r["program_hash"]]))
    groups = {"fastest tenth": [], "the rest": []}
    for programs in by_task.values():
        if len(programs) >= 10:
            programs.sort(key=lambda p: p[0])
            k = max(1, round(0.1 * len(programs)))
            for i, (_, c) in enumerate(programs):
                groups["fastest tenth" if i < k else "the rest"].append(c)
    for name, cs in groups.items():
        loops, stores, vector = np.array(cs).T
        asked = loops > 0
        print(f"{device}, each task's {name}: {len(cs):,} programs; vectorization asked {asked.mean():.3f}; of those "
              f"all scalarized {np.sum(asked & (vector == 0)) / asked.sum():.3f}, some "
              f"{np.sum(asked & (vector < loops)) / asked.sum():.3f}; vector share of stores "
              f"{np.mean(vector / np.maximum(stores, 1)):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--describe", metavar="DEVICE", help="print the fastest tenth against the rest, from the files written")
    args = ap.parse_args()
    opts = ProtocolOptions()
    if args.describe:
        return describe(args.describe, opts.dataset)
    table = TaskTable.load(opts.task_table)
    devices = set(opts.device_ids)
    recs = {}
    for device in devices:
        for r in RecordStore(opts.dataset).records(device):
            if r.has_trace and label(r) is not None:
                recs.setdefault(r.program_hash, r)
    hashes = sorted(recs)[args.part::args.parts]
    passes, mods, out, failed = lowering(), {}, [], 0
    start = last = time.time()
    for i, h in enumerate(hashes):
        rec = recs[h]
        try:
            workload = _workload_of(rec, table, mods)
            out.append((h, *vector_facts(_scheduled(rec, workload), passes)))
        except Exception as e:  # noqa: BLE001 - a program that does not rebuild or lower is counted and skipped
            failed += 1
            print(f"{rec.id}: {type(e).__name__}: {str(e).splitlines()[-1][:160]}", file=sys.stderr)
        if time.time() - last > 30 or i + 1 == len(hashes):
            rate = (i + 1) / (time.time() - start)
            print(f"{i + 1:,}/{len(hashes):,} programs, {rate:.0f}/s, ETA {(len(hashes) - i - 1) / rate:.0f} s",
                  file=sys.stderr, flush=True)
            last = time.time()
    os.makedirs("runs", exist_ok=True)
    path = f"runs/lowered-vectorization-{args.part}-of-{args.parts}.npz"
    np.savez(path, hashes=np.array([o[0] for o in out]), counts=np.array([o[1:] for o in out], dtype=np.int64))
    print(f"{path}: {len(out):,} programs, {failed} failed")


if __name__ == "__main__":
    main()
