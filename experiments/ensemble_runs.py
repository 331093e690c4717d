"""Three independent runs or one run's snapshots? (issue 55, item 2; reports/ensemble-runs.md.)

The shipped recipe's three members are the best states of the three 20-epoch LR cycles of one 60-epoch run
(snapshots). Issue 55 asks for independent runs averaged instead, at the same budget: three runs of 20 epochs, seeded
apart, a member the best state of each (``ensemble_of = "runs"``). Both arms on the same split, development seeds
and cross-model's development networks only, scored on validation (every program built, and none built: a tuner's
candidates):

- ``snapshots``: the shipped recipe, 60 epochs. Its first 20 epochs are the 20-epoch run of
  experiments/counts_dropout.py's ``copies`` arm (the same seed, data and LR cycle; nothing in them reads the
  epoch count), so that run's saved state is taken as them and 40 epochs are trained.
- ``runs``: three 20-epoch runs seeded S, S + 1, S + 2; run S is that same saved run, read back.
- ``runs60``: three 60-epoch runs, a member the best state of each (three times the budget); run S is the
  ``snapshots`` arm's run, read back.

    .venv/bin/python experiments/ensemble_runs.py --seed S --arm snapshots|runs   # S = 0, 1, 2
    .venv/bin/python experiments/ensemble_runs.py --table

Models under build/ensemble-runs/ (resumable), rows in reports/ensemble-runs-runs.jsonl.
"""

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import splits
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, recipe_config
from cdmpp.model import training
from cdmpp.model.blend import blend
from cdmpp.model.checkpoint import TrainedModel
from study_table import cell, grouped, scored, study_args

ROWS = Path("reports/ensemble-runs-runs.jsonl")
MODELS = Path("build/ensemble-runs")
FIRST_20 = "build/counts-dropout/cross-model-copies0.25-e20-seed{seed}.state.pt"  # counts_dropout.py --arm copies
ARMS = {"snapshots": dict(epochs=60), "runs": dict(epochs=20, ensemble_of="runs"),
        "runs60": dict(epochs=60, ensemble_of="runs")}
FIRST_RUN = {"snapshots": FIRST_20, "runs": FIRST_20, "runs60": str(MODELS / "cross-model-snapshots-seed{seed}.state.pt")}


def continue_the_20_epoch_run(path: str) -> None:
    """Let the 60-epoch run resume from the finished 20-epoch run copied to ``path``: its file names the 20-epoch
    run (the epoch count is part of a run's name) and says it ended, so it is renamed to the run asking for it and
    reopened, once."""
    load = training.RunState.load

    def as_first_epochs(self):
        if self.path == path:
            saved = torch.load(path, map_location="cpu", weights_only=False)
            if saved["stopped"] == "epochs" and len(saved["history"]) == 20:
                saved.update(run=self.run, stopped=None)
                torch.save(saved, path)
        return load(self)

    training.RunState.load = as_first_epochs


def run(seed: int, arm: str) -> None:
    opts = ProtocolOptions()
    ds = load_pinned(opts)
    table = DeviceTable(opts.devices).spec_table()
    split = splits.cross_model_split(ds, splits.HELD_OUT_NETWORKS, seed=seed)
    name = f"cross-model-{arm}-seed{seed}"
    where = MODELS / name
    print(f"{name}: {len(split.train)} train, {len(split.val)} val", file=sys.stderr, flush=True)
    if (where / "predictor.json").exists():
        model = TrainedModel.load(where)
    else:
        MODELS.mkdir(parents=True, exist_ok=True)
        state = f"{where}.state.pt"
        if not Path(state).exists():
            shutil.copyfile(FIRST_RUN[arm].format(seed=seed), state)
        if arm == "snapshots":
            continue_the_20_epoch_run(state)
        torch.set_num_threads(1)
        config = recipe_config("default", seed=seed, progress=True, **ARMS[arm])
        model = fit(config, split, table, state)
        model.save(where)
    w = model.calibration["gbt_weight"]
    w_order = model.calibration.get("gbt_order_weight", w)
    programs = split.val
    for counts in ("built", "none"):
        feats = [p.features if counts == "built" else dataclasses.replace(p.features, asm=None) for p in programs]
        t, g = model.predict_parts(feats, [p.device for p in programs])
        row = dict(seed=seed, setting="cross-model", arm=arm, counts=counts, weight=w,
                   members=[m["members_from_epochs"] for m in model.summary["members"]],
                   transformer=scored(programs, t, t), gbt=scored(programs, g, g),
                   blend=scored(programs, blend(t, g, w), blend(t, g, w_order)), when=time.strftime("%Y-%m-%dT%H:%M:%S"))
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        b = row["blend"]
        print(f"{name} val, counts {counts}: blend {100 * b['mape']:.1f} % (capped {100 * b['mape_capped']:.1f}, "
              f"fast-10 {100 * b['fast10']:.1f}, rho {b['spearman']:.3f}); transformer {100 * row['transformer']['mape']:.1f} %",
              flush=True)


def fit(config, split, table, state):
    return training.fit(config, split.train, split.val, target_pool=split.target_pool or None, device_table=table,
                        resume=state)


def table() -> None:
    groups = grouped(ROWS, lambda r: (r["arm"], r["counts"], r["seed"]), lambda r: (r["arm"], r["counts"]))
    print("| members | programs asked | seeds | MAPE | capped | fast-10 % | Spearman | transformer | its fast-10 % | GBT |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (arm, counts), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], list(ARMS).index(kv[0][0]))):
        def f(part, key):
            return cell([r[part][key] for r in rs], key, spread=part == "blend" and key == "mape")
        label = {"snapshots": "3 snapshots of one 60-epoch run (shipped)", "runs": "3 independent 20-epoch runs",
                 "runs60": "3 independent 60-epoch runs (3x the budget)"}[arm]
        print(f"| {label} | {'built' if counts == 'built' else 'not built'} | {len(rs)} | {f('blend', 'mape')} | "
              f"{f('blend', 'mape_capped')} | {f('blend', 'fast10')} | {f('blend', 'spearman')} | "
              f"{f('transformer', 'mape')} | {f('transformer', 'fast10')} | {f('gbt', 'mape')} |")


if __name__ == "__main__":
    a = study_args(__doc__, ARMS, "runs")
    table() if a.table else run(a.seed, a.arm)
