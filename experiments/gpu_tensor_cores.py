"""Where the V100 held out goes wrong (reports/gpu-transfer.md, "Tensor cores"): per task, the share of the
zero-shot MAPE over every V100 program outside its level programs, and what moving the tensor-core programs
(``dense_tensorcore.cuda``, wmma intrinsics) by the V100's tensor-core / FP32 peak ratio would do. No GPU it
trains beside (the K80, random-schedule H100/H200) ran a tensor-core program, so the model predicts them as FP32
code. (Until 5 Dec the featurizer counted no FLOPs in tensor-core intrinsics, ``tvm_mma_sync``; it now counts them,
``tensor_core_flops``: printed for three of them at the end beside the record's own count, which the dataset keeps.)
Reads the predictions
experiments/shot_choice_criterion.py kept (its --cache, development seeds).

Usage: .venv/bin/python experiments/gpu_tensor_cores.py [--cache build/shot-choice-criterion] [--epochs 20]"""

import argparse
import collections
import os
import pickle

import numpy as np

from cdmpp import defaults
from cdmpp.devices.reference import is_level_program
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore

V100 = "nvidia-v100/cuda-sm70"
TENSOR_OVER_FP32 = 112.0 / 14.13  # V100 PCIe datasheet: 112 TFLOP/s on tensor cores, 14.13 TFLOP/s FP32 (the table's peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default="build/shot-choice-criterion")
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args()
    labels, store = {}, RecordStore(defaults.DATASET)
    for r in store.iter_records(V100, traces=False):
        if (y := label(r)) is not None and not is_level_program(r["program_hash"]):
            labels[r["program_hash"]] = (y, r.get("task_name", "?"))
    for seed in (0, 1, 2):
        path = os.path.join(args.cache, f"{V100.replace('/', '_')}.{seed}.{args.epochs}.pkl")
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            seen = pickle.load(f)["seen"]
        rows = [(labels[h][0], labels[h][1], v[0]) for (d, h), v in seen.items() if d == V100 and h in labels]
        y, pred = np.array([r[0] for r in rows]), np.array([r[2] for r in rows])
        tensor = np.array(["tensorcore" in r[1] for r in rows])
        ape = np.abs(pred / y - 1)
        moved = np.abs(np.where(tensor, pred / TENSOR_OVER_FP32, pred) / y - 1)
        print(f"seed {seed}: {len(rows)} programs, MAPE {100 * ape.mean():.1f} %; the {tensor.sum()} tensor-core ones "
              f"({100 * tensor.mean():.1f} %) carry {ape[tensor].sum() / ape.sum():.2f} of it, median "
              f"log(pred/label) {np.median(np.log(pred[tensor] / y[tensor])):+.2f}; moved by {TENSOR_OVER_FP32:.2f}: "
              f"MAPE {100 * moved.mean():.1f} %")
        by = collections.defaultdict(list)
        for (_, name, _), e in zip(rows, ape):
            by[name].append(e)
        for name, e in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:5]:
            print(f"  {name[:40]:40s} {len(e):5d} programs, share {sum(e) / ape.sum():.2f}, MAPE {100 * np.mean(e):.0f} %")
    from cdmpp.program.features import Featurizer

    tensor = [r for r in store.iter_records(V100, traces=True) if "tensorcore" in r.get("task_name", "")][:3]
    for r, f in zip(tensor, Featurizer()([r["program"] for r in tensor], target=tensor[0]["target"])):
        print(f"{r['task_name']} {r['program_hash']}: the record's FLOPs {float(r['flops']):.4g}, "
              f"the featurizer's {f.flops:.4g}, {f.tensor_flops:.4g} of them on tensor cores")


if __name__ == "__main__":
    main()
