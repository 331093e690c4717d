"""Recipe knobs asked on cross-model's development split at 20 epochs, against the shipped recipe (issue 55;
reports/cross-model-tail.md). Development seeds and networks only (resnet18, mobilenet_v2, bert_tiny).

Arms: ``base`` (the shipped recipe: the 20-epoch `copies` models of experiments/counts_dropout.py, reused from
build/counts-dropout/ when their split is unchanged); ``da``: CMD towards the held-out networks' unlabeled pool (30 %
of their programs by hash, never tested; ``da_known_devices``), the question round 12 (reports/study-issue19.md) left
open when budgets were minutes and its target batches halved the epochs; ``rank``: a RankNet term over a batch's
pairs of one task and device (``rank_weight`` 0.1), round 3's question asked again of the recipe with counts (issue 55
item 6: the transformer ranks a task's programs below the latency GBT on random-new); ``dropout`` 0.1 (round 16 tried it
under a budget in minutes, before the counts); ``wide``: twice the width (round 3 found capacity did not limit, at
2-minute budgets); ``search``: + the pinned devices' search candidates (`cdmpp collect --from-search`, and their
1-thread twins) of tasks in no held-out network and not in validation (``splits.with_other_devices``), the fast
path a tuner explores, which the protocol's splits leave out; ``inner``: the build's innermost loops' counts as
inputs beside the module's (``assembly_inner``; reports/assembly-counts.md found them worth a GBT's while). Each scored
on validation (tasks of the training networks) and on the development test (the held-out networks): the transformer, the GBT and
their blend at the weight chosen on validation. Rows in reports/cross-model-arms-runs.jsonl.

    .venv/bin/python experiments/cross_model_arms.py --seed S --arm base|da|rank|dropout|wide|search|inner   # S = 0, 1, 2
    .venv/bin/python experiments/cross_model_arms.py --table
"""

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
from cdmpp.model.training import fit
from study_table import cell, grouped, scored, study_args

ROWS = Path("reports/cross-model-arms-runs.jsonl")
MODELS = {"base": Path("build/counts-dropout"), "da": Path("build/da-new-networks"), "rank": Path("build/rank-loss"),
          "dropout": Path("build/cross-model-arms"), "wide": Path("build/cross-model-arms"),
          "search": Path("build/cross-model-arms"), "inner": Path("build/cross-model-arms")}
KNOBS = {"base": {}, "da": {"da_known_devices": True}, "rank": {"rank_weight": 0.1}, "dropout": {"dropout": 0.1},
         "wide": {"d_model": 256, "d_ff": 512}, "search": {}, "inner": {"assembly_inner": True}}


def with_search_candidates(split, opts, pinned_ds):
    """``split`` trained also on the pinned devices' search candidates and their twins (what ``load_pinned`` leaves
    out), those of a validation or test task or a held-out network kept out."""
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    pinned = {(p.device, p.features.program_hash) for p in pinned_ds.programs}
    every = load_dataset(opts.dataset, TaskTable.load(opts.task_table), devices=list(opts.device_ids), progress=False)
    found = [p for p in every.programs if (p.device, p.features.program_hash) not in pinned]
    out = splits.with_other_devices(split, found, splits.HELD_OUT_NETWORKS)
    print(f"search: +{out.info['other_device_programs']} of {len(found)} candidates and twins", file=sys.stderr, flush=True)
    return out


def run(seed: int, arm: str, epochs: int) -> None:
    opts = ProtocolOptions()
    ds = load_pinned(opts, innermost=arm == "inner")
    split = splits.cross_model_split(ds, splits.HELD_OUT_NETWORKS, seed=seed)
    if arm == "search":
        split = with_search_candidates(split, opts, ds)
    name = f"cross-model-copies0.25-e{epochs}-seed{seed}" if arm == "base" else f"cross-model-{arm}-e{epochs}-seed{seed}"
    where = MODELS[arm] / name
    print(f"{name}: {len(split.train)} train, {len(split.val)} val, {len(split.test)} test, "
          f"{len(split.target_pool)} unlabeled", file=sys.stderr, flush=True)
    model = TrainedModel.load(where) if (where / "predictor.json").exists() else None
    if model is not None and (model.summary["n_train"], model.summary["n_val"]) != (len(split.train), len(split.val)):
        # records dropped since: validation and test are cut by task, so the same tasks on each side but for those few
        gone = model.summary["n_train"] - len(split.train), model.summary["n_val"] - len(split.val)
        if min(gone) < 0 or sum(gone) > 0.001 * len(split.train):
            sys.exit(f"{where}: trained on {model.summary['n_train']} programs, the split now has {len(split.train)}")
        print(f"{where}: {gone[0]} training and {gone[1]} validation programs no longer in the data", file=sys.stderr)
    if model is None:
        where.parent.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(1)
        config = recipe_config("assembly", seed=seed, progress=True, epochs=epochs, assembly_withheld=0.25,
                               assembly_unbuilt_copies=True, **KNOBS[arm])
        model = fit(config, split.train, split.val, target_pool=split.target_pool or None,
                    device_table=DeviceTable(opts.devices).spec_table(), resume=str(where) + ".state.pt")
        model.save(where)
    w, w_order = model.calibration["gbt_weight"], model.calibration["gbt_order_weight"]
    for part, programs in (("val", split.val), ("test", split.test)):
        t, g = model.predict_parts([p.features for p in programs], [p.device for p in programs])
        row = dict(seed=seed, arm=arm, epochs=epochs, part=part, weight=w, n_target=model.summary["n_target"],
                   da_collapsed=model.summary.get("da_collapsed"), transformer=scored(programs, t, t),
                   gbt=scored(programs, g, g), blend=scored(programs, blend(t, g, w), blend(t, g, w_order)),
                   when=time.strftime("%Y-%m-%dT%H:%M:%S"))
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        b = row["blend"]
        print(f"{name} {part}: blend {100 * b['mape']:.1f} % (capped {100 * b['mape_capped']:.1f}, fast-10 "
              f"{100 * b['fast10']:.1f}, rho {b['spearman']:.3f}); transformer {100 * row['transformer']['mape']:.1f} %",
              flush=True)


def table() -> None:
    groups = grouped(ROWS, lambda r: (r["epochs"], r["part"], r["arm"], r["seed"]),
                     lambda r: (r["epochs"], r["part"], r["arm"]))
    print("| epochs | programs | arm | seeds | MAPE | capped | fast-10 % | Spearman | transformer | its fast-10 % | its Spearman "
          "| GBT |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (epochs, part, arm), rs in sorted(groups.items()):
        def f(p, key):
            return cell([r[p][key] for r in rs], key, spread=key == "mape" and p != "gbt")
        label = {"base": "the shipped recipe", "da": "+ CMD towards the held-out networks' pool",
                 "rank": "+ a within-task ranking loss (0.1)", "dropout": "dropout 0.1",
                 "wide": "twice the width (d_model 256, d_ff 512)",
                 "search": "+ the pinned devices' search candidates of training tasks",
                 "inner": "+ the innermost loops' counts"}[arm]
        where = {"val": "validation (training networks' tasks)", "test": "held-out networks (development)"}[part]
        print(f"| {epochs} | {where} | {label} | {len(rs)} | {f('blend', 'mape')} | {f('blend', 'mape_capped')} | "
              f"{f('blend', 'fast10')} | {f('blend', 'spearman')} | {f('transformer', 'mape')} | "
              f"{f('transformer', 'fast10')} | {f('transformer', 'spearman')} | {f('gbt', 'mape')} |")


if __name__ == "__main__":
    a = study_args(__doc__, MODELS, "da", lambda ap: ap.add_argument("--epochs", type=int, default=20))
    table() if a.table else run(a.seed, a.arm, a.epochs)
