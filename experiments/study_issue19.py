"""Issue 19's one-change-at-a-time study of the cdmpp predictor on the random-new setting.

Each (variant, seed) job is what ``cdmpp protocol --settings random-new --methods cdmpp --seeds S
--minutes M --label NAME --runs reports/study-runs.jsonl --set KEY=VALUE ...`` runs (the baseline job
also trains the pooled GBT); two jobs run at a time, one thread each, on the 2-core machine.

    .venv/bin/python benchmarks/study_issue19.py 2.0                 # every variant
    .venv/bin/python benchmarks/study_issue19.py 2.0 "H ...;L ..."   # some of them (names below)
    .venv/bin/python benchmarks/study_issue19.py --table             # reports/study-issue19.md
    .venv/bin/python benchmarks/study_issue19.py --attach-loops      # fill runs/loops once (round 4)

The 2026-11-24 run loaded the pinned programs once into a pickle for speed; this file loads them
through ``cdmpp.evaluation.protocol.load_pinned`` (the same 25,157 programs, from the feature cache).

Most variants set options the study dropped and the library no longer has (issue 57; the table in
reports/study-issue19.md, "Options removed"): run them at commit e2a78fd.
"""

import json
import multiprocessing as mp
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

import numpy as np

RUNS = "reports/study-runs.jsonl"
VARIANTS = {
    "A baseline (default recipe)": {},
    "B log label + L1 loss": {"label": "log", "loss": "l1"},
    "C sum pooling": {"pooling": "sum"},
    "D program inputs (FLOPs, bytes)": {"program_inputs": True},
    "E roofline-relative (log, L1)": {"label": "log", "loss": "l1", "roofline": True},
    "G all (B+C+D+E+FiLM)": {"label": "log", "loss": "l1", "roofline": True, "pooling": "sum",
                             "program_inputs": True, "film": True},
    "N all (G) + val-chosen MAPE scale": {"label": "log", "loss": "l1", "roofline": True, "pooling": "sum",
                                          "program_inputs": True, "film": True, "mape_scale": True},
    "H program inputs + MAPE loss (log)": {"program_inputs": True, "label": "log", "loss": "mape"},
    "L program inputs + val-chosen MAPE scale": {"program_inputs": True, "mape_scale": True},
}
# the study's baseline is the recipe as it was before the study (train/default.toml then)
BEFORE = {"program_inputs": False, "label": "boxcox", "loss": "paper", "da_weight": 10.0}
# second round (block-counted FLOPs, featurizer 2): variants on top of the recipe H became, run with
# `study_issue19.py 3.0 --round2`; "pooled GBT (block FLOPs)" is the peer retrained on the new FLOPs
ROUND2 = {
    "P0 default recipe (H), block FLOPs": {},
    "P1 H + pooled leaf inputs": {"pooled_inputs": True},
    "P2 H + roofline offset": {"roofline": True},
    "P3 H + pooled inputs + roofline": {"pooled_inputs": True, "roofline": True},
}
GBT2 = "pooled GBT (block FLOPs)"
# third round: the optimization and size knobs of item 3 on top of the recipe (`study_issue19.py 2.0 --round3`)
ROUND3 = {
    "Q0 recipe (H), round 3": {},
    "Q1 attention pooling": {"pooling": "attention"},
    "Q2 weight decay 0.01": {"weight_decay": 0.01},
    "Q3 smaller model (d_model 64, d_ff 128)": {"d_model": 64, "d_ff": 128},
    "Q4 max_lr 3e-3": {"max_lr": 3e-3},
    "Q5 within-task ranking loss (rank_weight 0.2)": {"rank_weight": 0.2},
}
# fourth round: the compact AST's loops as tokens of the sequence (`study_issue19.py 2.0 --round4`); the
# cached features predate loop tokens, so the jobs attach them (runs/loops, filled by --attach-loops)
ROUND4 = {
    "R0 recipe (H), round 4": {},
    "R1 loops as tokens": {"loop_tokens": True},
}


def load(opts, loops: bool):
    """The pinned programs; with ``loops``, their loop tokens attached (rebuilt once, then cached)."""
    from cdmpp.evaluation import protocol as P

    ds = P.load_pinned(opts)
    if loops:
        from cdmpp.records.dataset import attach_loops
        from cdmpp.zoo.tasks import TaskTable

        left = attach_loops(ds, opts.dataset, TaskTable.load(opts.task_table))
        if left:
            raise SystemExit(f"{left} programs have no loop tokens (see the messages above)")
    return ds


def job(args):
    name, overrides, seed, minutes, methods = args
    import torch

    from cdmpp.evaluation import protocol as P

    torch.set_num_threads(1)
    base = {} if name in ROUND2 or name in ROUND3 or name in ROUND4 or name == GBT2 else BEFORE
    opts = P.ProtocolOptions(settings=["random-new"], methods=methods, overrides={**base, **overrides},
                             label=name, minutes=minutes, runs=RUNS, ks=("0",),
                             gbt_label=GBT2 if name == GBT2 else "pooled GBT")
    P.run_seed(opts, seed, load(opts, bool(overrides.get("loop_tokens"))))


def table() -> str:
    latest = {}  # (variant, seed) -> metrics; a rerun of the same seed replaces the earlier row
    with open(RUNS) as f:
        for line in f:
            r = json.loads(line)
            latest[(r["method"], r["seed"])] = r["metrics"]
    rows = defaultdict(list)
    for (name, _), m in latest.items():
        rows[name].append(m)
    out = ["| variant | MAPE | MAPE (APE ≤ 100 %) | median APE | Spearman | seeds |", "|---|---:|---:|---:|---:|---:|"]
    for name, ms in rows.items():
        cell = lambda k: f"{100 * np.mean([m[k] for m in ms]):.1f} ± {100 * np.std([m[k] for m in ms]):.1f} %"  # noqa: E731
        out.append(f"| {name} | {cell('mape')} | {cell('mape_capped')} | {cell('median_ape')} | "
                   f"{np.mean([m['spearman'] for m in ms]):.3f} ± {np.std([m['spearman'] for m in ms]):.3f} | {len(ms)} |")
    return "\n".join(out)


def pick(variants: dict = ROUND2, base: str = "P0 default recipe (H), block FLOPs") -> str:
    """Round 2's rule: a variant replaces ``base`` only if its mean MAPE is lower by more than the
    larger std of the two, or (MAPE within that) its Spearman is higher by more than the spread."""
    latest = {}
    with open(RUNS) as f:
        for line in f:
            r = json.loads(line)
            if r["method"] in variants:
                latest[(r["method"], r["seed"])] = r["metrics"]
    st = {}
    for name in variants:
        ms = [m for (n, _), m in latest.items() if n == name]
        if len(ms) >= 3:
            st[name] = {k: (np.mean([m[k] for m in ms]), np.std([m[k] for m in ms])) for k in ("mape", "spearman")}
    b = st[base]
    gap = lambda n, k, sign: sign * (b[k][0] - st[n][k][0]) > max(b[k][1], st[n][k][1])  # noqa: E731
    better = [n for n in st if n != base and gap(n, "mape", 1)]
    if better:
        return min(better, key=lambda n: st[n]["mape"][0])
    tied = [n for n in st if n != base and not gap(n, "mape", -1) and gap(n, "spearman", -1)]
    return max(tied, key=lambda n: st[n]["spearman"][0]) if tied else base


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table())
        sys.exit(0)
    if sys.argv[1:] == ["--pick"]:
        print(pick())
        sys.exit(0)
    if sys.argv[1:] == ["--pick3"]:
        print(pick(ROUND3, "Q0 recipe (H), round 3"))
        sys.exit(0)
    if sys.argv[1:] == ["--pick4"]:
        print(pick(ROUND4, "R0 recipe (H), round 4"))
        sys.exit(0)
    if sys.argv[1:] == ["--attach-loops"]:
        from cdmpp.evaluation import protocol as P

        ds = load(P.ProtocolOptions(), loops=True)
        n = np.array([len(p.features.loops) for p in ds.programs])
        print(f"{len(ds)} programs with loop tokens: {n.mean():.1f} loops (max {n.max()}) and "
              f"{np.mean([p.features.n_leaves for p in ds.programs]):.1f} leaves per program")
        sys.exit(0)
    minutes = float(sys.argv[1])
    if "--round4" in sys.argv:
        names = [a for a in sys.argv[2:] if a != "--round4"]
        names = names[0].split(";") if names else list(ROUND4)
        variants = ROUND4
    elif "--round3" in sys.argv:
        names = [a for a in sys.argv[2:] if a != "--round3"]
        names = names[0].split(";") if names else list(ROUND3)
        variants = ROUND3
    elif "--round2" in sys.argv:
        names = [a for a in sys.argv[2:] if a != "--round2"]
        names = names[0].split(";") if names else [*ROUND2, GBT2]
        variants = {**ROUND2, GBT2: {}}
    else:
        names = sys.argv[2].split(";") if len(sys.argv) > 2 else list(VARIANTS)
        variants = VARIANTS
    jobs = [(n, variants[n], seed, minutes, ["pooled-gbt"] if n == GBT2 else
             ["cdmpp", "pooled-gbt"] if n.startswith("A ") else ["cdmpp"])
            for n in names for seed in (0, 1, 2)]
    jobs.sort(key=lambda j: j[0] != GBT2)  # the GBT's long jobs first
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as ex:
        for f in [ex.submit(job, j) for j in jobs]:
            f.result()
