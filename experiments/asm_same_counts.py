"""Do two CPUs of one ISA level get the same assembly counts? (issue 52/55: the counts are the largest lever
measured, and a build per program and target costs ~0.35 s: 96,000 programs of the other chips wait to be built.)

    .venv/bin/python experiments/asm_same_counts.py --n 200 --seed 0 --mcpu rocketlake,emeraldrapids,znver5
    .venv/bin/python experiments/asm_same_counts.py --n 200 --seed 0 --mcpu znver3,x86-64-v3,core-avx2
    .venv/bin/python experiments/asm_same_counts.py --table

Builds ``--n`` labelled programs of the 2-thread Zen 4 device (drawn with ``--seed``; the core set, which every CPU
device of the project holds twins of) with ``tvm.compile`` for each ``--mcpu`` (``mcpu=znver4``'s counts are read
from ``datasets/assembly/llvm-znver4``), and writes each program's counts to
``build/asm-same-counts/<mcpu>.npz``. ``--table`` says, for each pair of CPUs, the share of programs whose 21 counts
are equal and the mean |log1p difference| of the classes that differ.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os

import numpy as np

from cdmpp import defaults

DEVICE = "amd-epyc-znver4-2t/llvm-avx512"
OUT = "build/asm-same-counts"


def sample(n: int, seed: int) -> list:
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore

    recs = {}
    for r in RecordStore(defaults.DATASET).records(DEVICE):
        if label(r) is not None and "search" not in r.extra:
            recs.setdefault(r.program_hash, r)
    keys = sorted(recs)
    return [recs[keys[i]] for i in np.random.default_rng(seed).choice(len(keys), n, replace=False)]


def build(n: int, seed: int, mcpus: list[str]) -> None:
    import tvm

    from cdmpp.program.assembly import build_counts
    from cdmpp.records.dataset import scheduled_module
    from cdmpp.records.importers import with_imported_workloads
    from cdmpp.zoo.tasks import TaskTable

    recs = sample(n, seed)
    table, mods = with_imported_workloads(TaskTable.load(defaults.TASK_TABLE), defaults.DATASET), {}
    os.makedirs(OUT, exist_ok=True)
    for mcpu in mcpus:
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
        hashes, rows = [], []
        for rec in recs:
            try:
                rows.append(build_counts(scheduled_module(rec, table, mods), target)[0])
                hashes.append(rec.program_hash)
            except Exception as e:  # noqa: BLE001
                print(f"{mcpu} {rec.program_hash}: not built: {str(e).splitlines()[-1][:120]}")
        np.savez(f"{OUT}/{mcpu}.npz", hashes=np.array(hashes), counts=np.array(rows))
        print(f"{mcpu}: {len(hashes)} built", flush=True)


def table() -> None:
    from cdmpp.program.assembly import COUNT_NAMES, AssemblyCounts

    builds = {"znver4": AssemblyCounts("datasets/assembly").table("llvm-znver4")}
    for path in sorted(glob.glob(f"{OUT}/*.npz")):
        with np.load(path) as z:
            builds[os.path.basename(path)[:-4]] = dict(zip(z["hashes"].tolist(), z["counts"]))
    print("| CPU a | CPU b | programs | counts all equal | classes that differ (mean abs log1p diff) |")
    print("|---|---|---:|---:|---|")
    for a, b in itertools.combinations(builds, 2):
        common = sorted(set(builds[a]) & set(builds[b]))
        if not common:
            continue
        x = np.array([builds[a][h] for h in common])
        y = np.array([builds[b][h] for h in common])
        equal = (x == y).all(axis=1).mean()
        d = np.abs(np.log1p(x) - np.log1p(y)).mean(0)
        differ = ", ".join(f"{COUNT_NAMES[i]} {d[i]:.2f}" for i in np.argsort(-d) if d[i] > 0.005)
        print(f"| {a} | {b} | {len(common)} | {equal:.1%} | {differ or '-'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mcpu", default="")
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    if a.table:
        table()
    else:
        build(a.n, a.seed, [m for m in a.mcpu.split(",") if m])


if __name__ == "__main__":
    main()
