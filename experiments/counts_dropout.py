"""Can one model serve programs with and without their builds? (issue 55; reports/assembly-counts.md.)

The recipe with the assembly's counts (`train/assembly.toml`) is 22.8 / 32.4 % on the locked random-new /
cross-model, but a prediction needs each program built, and a tuner's thousands of candidates per round are not:
asked without counts the same model is 313 % MAPE, within-task Spearman 0.54 (reports/cross-model-tail.md), below
the recipe that never saw counts. Shipping the counts needs a model that falls back. Tried here: train with the
counts removed from a share of the training programs (``--drop``: each program drawn once, with ``--seed``; the
"built" flag says which), so the model learns both regimes; then score each model on validation with every
program's counts and with none.

Arms, each trained on the same split (development seeds and held-out networks only; `--epochs` short: a relative
question): ``counts`` (every count, nothing unbuilt), ``drop`` (``--drop`` of the training programs without counts:
the recipe shipped 6 Dec), ``copies`` (every count, and ``--drop`` of the programs trained on again as unbuilt
copies: ``assembly_unbuilt_copies``, shipped 7 Dec), ``augment`` (the same copies appended to the training list: the
first try of it), ``plain`` (no counts). Models under build/counts-dropout/ (resumable), rows in
reports/counts-dropout-runs.jsonl.

    .venv/bin/python experiments/counts_dropout.py --seed S --arm counts|drop|copies|augment|plain [--setting random-new] [--epochs 20]
    .venv/bin/python experiments/counts_dropout.py --table
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import splits
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, recipe_config
from cdmpp.model.blend import blend
from cdmpp.model.checkpoint import TrainedModel
from cdmpp.model.training import fit, withhold_counts
from study_table import cell, grouped, scored, study_args

ROWS = Path("reports/counts-dropout-runs.jsonl")
MODELS = Path("build/counts-dropout")
RECIPES = {"counts": "assembly", "drop": "assembly", "augment": "assembly", "copies": "assembly",
           "plain": "ablation-no-counts"}
SHARED = ("drop", "augment", "copies")  # the arms that withhold a share


def run(seed: int, arm: str, setting: str, epochs: int, drop: float) -> None:
    opts = ProtocolOptions()
    ds = load_pinned(opts)
    table = DeviceTable(opts.devices).spec_table()
    split = (splits.random_split(ds, seed) if setting == "random-new"
             else splits.cross_model_split(ds, splits.HELD_OUT_NETWORKS, seed=seed))
    name = f"{setting}-{arm}{drop if arm in SHARED else ''}-e{epochs}-seed{seed}"
    where = MODELS / name
    print(f"{name}: {len(split.train)} train, {len(split.val)} val", file=sys.stderr, flush=True)
    if (where / "predictor.json").exists():
        model = TrainedModel.load(where)
    else:
        where.parent.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(1)
        train = split.train
        if arm == "augment":  # every program with its counts, and a copy of ``drop`` of them without, as a list
            unbuilt = withhold_counts(split.train, drop, seed)
            train = [*split.train, *(u for u, p in zip(unbuilt, split.train) if u is not p)]
        config = recipe_config(RECIPES[arm], seed=seed, progress=True, epochs=epochs,
                               assembly_withheld=drop if arm in ("drop", "copies") else 0.0,
                               assembly_unbuilt_copies=arm == "copies")
        model = fit(config, train, split.val, target_pool=split.target_pool or None, device_table=table,
                    resume=str(where) + ".state.pt")
        model.save(where)
    w = model.calibration["gbt_weight"]
    w_order = model.calibration.get("gbt_order_weight", w)
    programs = split.val
    for counts in ("built", "none"):
        feats = [p.features if counts == "built" else dataclasses.replace(p.features, asm=None) for p in programs]
        t, g = model.predict_parts(feats, [p.device for p in programs])
        row = dict(seed=seed, setting=setting, arm=arm, drop=drop if arm in SHARED else 0.0, epochs=epochs,
                   counts=counts, weight=w, transformer=scored(programs, t, t), gbt=scored(programs, g, g),
                   blend=scored(programs, blend(t, g, w), blend(t, g, w_order)), when=time.strftime("%Y-%m-%dT%H:%M:%S"))
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        b = row["blend"]
        print(f"{name} val, counts {counts}: blend {100 * b['mape']:.1f} % (capped {100 * b['mape_capped']:.1f}, "
              f"fast-10 {100 * b['fast10']:.1f}, rho {b['spearman']:.3f}); transformer {100 * row['transformer']['mape']:.1f} %, "
              f"GBT {100 * row['gbt']['mape']:.1f} %", flush=True)


def table() -> None:
    groups = grouped(ROWS, lambda r: (r["setting"], r["epochs"], r["arm"], r["drop"], r["counts"], r["seed"]),
                     lambda r: (r["setting"], r["epochs"], r["arm"], r["drop"], r["counts"]))
    print("| setting | epochs | arm | programs asked | seeds | MAPE | capped | fast-10 % | Spearman | transformer | GBT |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (setting, epochs, arm, drop, counts), rs in sorted(groups.items()):
        def f(part, key):
            return cell([r[part][key] for r in rs], key, spread=part == "blend" and key == "mape")
        label = {"counts": "counts", "plain": "no counts (recipe until 6 Dec)",
                 "augment": f"counts, and {drop:.0%} of training again without (a list)",
                 "copies": f"counts, and {drop:.0%} of training again without (`assembly_unbuilt_copies`)"}.get(
                     arm, f"counts, {drop:.0%} of training without")
        print(f"| {setting} | {epochs} | {label} | {'built' if counts == 'built' else 'not built'} | {len(rs)} | "
              f"{f('blend', 'mape')} | {f('blend', 'mape_capped')} | {f('blend', 'fast10')} | {f('blend', 'spearman')} | "
              f"{f('transformer', 'mape')} | {f('gbt', 'mape')} |")


def options(ap) -> None:
    ap.add_argument("--setting", choices=("cross-model", "random-new"), default="cross-model")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--drop", type=float, default=0.25)


if __name__ == "__main__":
    a = study_args(__doc__, RECIPES, "drop", options)
    table() if a.table else run(a.seed, a.arm, a.setting, a.epochs, a.drop)
