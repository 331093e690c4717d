"""How should a GPU the model never trained on be reached? (issue 52; reports/leave-one-chip-out.md, "A new GPU
through more than one GPU"). Leave-one-chip-out on the GPUs (the GPU part alone, as ``--chip-train same-kind``
trains it), development seeds: one model per held-out GPU and seed, then its zero-shot prediction of the chip's
test programs through each transfer below, so every variant is scored on the same trained model:

* ``nearest, peaks``: the trained GPU closest in peak FLOP/s, moved by the peaks' ratio (the route of 4 Dec);
* ``nearest, levels``: the same GPU, moved by the ratio of the two GPUs' measured levels (``level_gflops``, the
  FLOP/s their tuned programs reach) where both have one, else of the peaks (the route since 5 Dec);
* ``nearest, roofline``: the same GPU, moved per program by the ratio of the two roofline bounds
  (max(FLOPs / peak, unique bytes / bandwidth): ``pooled_gbt.roofline_seconds``);
* ``nearest, roofline at levels``: the roofline ratio with each GPU's measured level as its compute roof where
  both have one (a compute-bound program moves by the levels, a memory-bound one by the bandwidths);
* ``every GPU, peaks`` / ``every GPU, roofline``: the geometric mean over every trained GPU of its prediction
  moved by the same ratio, so no one GPU's view of foreign schedules decides the level;
* ``direct``: the network asked with the new GPU's specs (no transfer);
* ``nearest, levels, tensor cores``: what ``TrainedModel.predict`` does since 5 Dec: the levels' route, with the
  tensor-core share of each program's work sped up by each GPU's tensor cores (``physics.tensor_time_share``).

The chip's test programs leave out its level programs where its spec has a level (as the protocol's do).
Usage: .venv/bin/python experiments/gpu_transfer.py [--epochs 20] [--seeds 0,1,2] [--out FILE.jsonl]
(each model's predictions also go to FILE.jsonl.<device>.<seed>.npz, for experiments/gpu_levels.py)"""

import argparse
import copy
import dataclasses
import json
import statistics
import time

import numpy as np
import torch

from cdmpp.devices.spec import target_kind_of_id
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import metrics as ev
from cdmpp.evaluation import splits
from cdmpp.evaluation.methods.cdmpp_model import CDMPP
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, recipe_config
from cdmpp.model import physics
from cdmpp.model.pooled_gbt import program_work, roofline_seconds

GPUS = ("nvidia-v100/cuda-sm70", "nvidia-k80/cuda-sm37", "nvidia-h200/cuda-sm90")


def variants(model, test, device: str, table: dict) -> dict[str, np.ndarray]:
    """Seconds of ``test`` on ``device`` through each transfer, from one trained ``TrainedModel``."""
    features = [p.features for p in test]
    work = program_work(features)
    trained = [d for d in model.anchors if target_kind_of_id(d) == "cuda"]
    fp32 = [dataclasses.replace(f, tensor_flops=0.0) for f in features]  # the routes below move FP32 time
    on = {g: model.predict(fp32, g)[0] for g in trained}

    def roof(d):
        return roofline_seconds(features, table[d]["peak_gflops"], table[d]["mem_bw_gbs"], work)

    peaks = {g: on[g] * physics.chip_ratio(g, device, table, reference=False) for g in trained}
    levels = {g: on[g] * physics.chip_ratio(g, device, table) for g in trained}  # measured levels where both have one
    roofs = {g: on[g] * roof(device) / roof(g) for g in trained}

    def roof_at_levels(g):  # the compute roof at the two GPUs' measured levels where both have one
        both = table[g].get("level_gflops") and table[device].get("level_gflops")
        level = (lambda d: table[d]["level_gflops"]) if both else (lambda d: table[d]["peak_gflops"])
        return on[g] * (roofline_seconds(features, level(device), table[device]["mem_bw_gbs"], work)
                        / roofline_seconds(features, level(g), table[g]["mem_bw_gbs"], work))

    near = physics.anchor_device(device, trained, table)
    direct = copy.copy(model)
    direct.anchors = None  # the network asked from the new GPU's specs

    def geo(d):
        return np.exp(np.mean([np.log(v) for v in d.values()], axis=0))

    return {"nearest, peaks": peaks[near], "nearest, levels": levels[near], "nearest, roofline": roofs[near],
            "nearest, roofline at levels": roof_at_levels(near),
            "every GPU, peaks": geo(peaks),
            "every GPU, roofline": geo(roofs), "direct": direct.predict(features, device)[0],
            "nearest, levels, tensor cores": model.predict(features, device)[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--chips", default=",".join(GPUS))
    ap.add_argument("--out", default="reports/gpu-transfer-runs.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(2)
    opts = ProtocolOptions()
    table = DeviceTable(opts.devices).spec_table()
    every = load_pinned(opts, every_device=True)
    gpus = [p for p in every.programs if target_kind_of_id(p.device) == "cuda"]
    rows = {}
    for seed in map(int, args.seeds.split(",")):
        for device in args.chips.split(","):
            chip = splits.chip_of(device, table)
            base = splits.leave_one_chip_out_split(gpus, chip, table, 0, seed=seed)
            t = time.monotonic()
            config = recipe_config("ablation-no-counts", seed=seed, epochs=args.epochs, progress=False)
            model = CDMPP(config, table, base.target_pool).fit(base.train, base.val).model_
            secs = round(time.monotonic() - t)
            preds = variants(model, base.test, device, table)
            np.savez_compressed(f"{args.out}.{device.replace('/', '_')}.{seed}.npz", task=[p.task for p in base.test],
                                seconds=[p.seconds for p in base.test], **{k.replace(' ', ''): v for k, v in preds.items()})
            for name, pred in preds.items():
                m = ev.score(base.test, pred)
                m["log_bias"] = float(np.median(np.log(pred / np.array([p.seconds for p in base.test]))))
                rows.setdefault((device, name), []).append(m)
                line = dict(seed=seed, device=device, variant=name, epochs=args.epochs, train_seconds=secs,
                            n_train=len(base.train), **{k: m[k] for k in ("n", "mape", "median_ape", "spearman", "log_bias")})
                with open(args.out, "a") as f:
                    f.write(json.dumps(line) + "\n")
                print(f"seed {seed} {device} {name}: MAPE {100 * m['mape']:.1f} % Spearman {m['spearman']:.3f} "
                      f"median log(pred/label) {m['log_bias']:+.2f} ({secs} s)", flush=True)
    print("\nmean over seeds")
    for (device, name), ms in rows.items():
        print(f"{device} {name}: MAPE {100 * statistics.mean(m['mape'] for m in ms):.1f} %, "
              f"Spearman {statistics.mean(m['spearman'] for m in ms):.3f}, "
              f"median log {statistics.mean(m['log_bias'] for m in ms):+.2f} ({len(ms)} seeds)")
    names = sorted({n for _, n in rows})
    for name in names:
        per = [statistics.mean(m["mape"] for m in rows[(d, name)]) for d in args.chips.split(",") if (d, name) in rows]
        print(f"over GPUs, {name}: MAPE {100 * statistics.mean(per):.1f} %")


if __name__ == "__main__":
    main()
