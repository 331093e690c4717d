"""Issue 19's one-change-at-a-time study of the cdmpp predictor on the random-new setting.

Each (variant, seed) job is what ``cdmpp protocol --settings random-new --methods cdmpp --seeds S
--minutes M --label NAME --runs reports/study-runs.jsonl --set KEY=VALUE ...`` runs (the baseline job
also trains the pooled GBT); two jobs run at a time, one thread each, on the 2-core machine.

    .venv/bin/python benchmarks/study_issue19.py 2.0                 # every variant
    .venv/bin/python benchmarks/study_issue19.py 2.0 "H ...;L ..."   # some of them (names below)
    .venv/bin/python benchmarks/study_issue19.py --table             # reports/study-issue19.md

The 2026-11-24 run loaded the pinned programs once into a pickle for speed; this file loads them
through ``cdmpp.evaluation.protocol.load_pinned`` (the same 25,157 programs, from the feature cache).
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


def job(args):
    name, overrides, seed, minutes, methods = args
    import torch

    from cdmpp.evaluation import protocol as P

    torch.set_num_threads(1)
    opts = P.ProtocolOptions(settings=["random-new"], methods=methods, overrides={**BEFORE, **overrides},
                             label=name, minutes=minutes, runs=RUNS, ks=("0",))
    P.run_seed(opts, seed, P.load_pinned(opts))


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


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table())
        sys.exit(0)
    minutes = float(sys.argv[1])
    names = sys.argv[2].split(";") if len(sys.argv) > 2 else list(VARIANTS)
    jobs = [(n, VARIANTS[n], seed, minutes, ["cdmpp", "pooled-gbt"] if n.startswith("A ") else ["cdmpp"])
            for seed in (0, 1, 2) for n in names]
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as ex:
        for f in [ex.submit(job, j) for j in jobs]:
            f.result()
