"""How the shipped model fits GPU programs (reports/leave-one-chip-out.md, "The H200 held out"): asked on the
H200's programs, split into twins of H100 programs (which it trained on) and the rest, and on those twins' own H100
labels. Usage: .venv/bin/python experiments/gpu_fit.py [--trained nvidia-h100/cuda-sm90] [--asked nvidia-h200/cuda-sm90]
[--model DIR]"""

import argparse

import numpy as np

from cdmpp import Predictor
from cdmpp.records.dataset import load_dataset
from cdmpp.zoo.tasks import TaskTable


def program_hash(p) -> str:
    return p.record_id.rsplit("|", 1)[1]


def line(name: str, pred: np.ndarray, label: np.ndarray) -> str:
    ape = np.abs(pred - label) / label
    return (f"{name}: {len(label)} programs, MAPE {100 * ape.mean():.1f} %, median APE {100 * np.median(ape):.1f} %, "
            f"median log(prediction/label) {np.median(np.log(pred / label)):+.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trained", default="nvidia-h100/cuda-sm90", help="a GPU the shipped model trained on")
    ap.add_argument("--asked", default="nvidia-h200/cuda-sm90", help="the GPU whose programs are asked")
    ap.add_argument("--model", help="a checkpoint folder (default: the shipped model)")
    args = ap.parse_args()
    ds = load_dataset("datasets/measurements", TaskTable.load("datasets/tasks-llvm.json.gz"),
                      devices=[args.trained, args.asked], searched=False, progress=False)
    trained = {program_hash(p): p.seconds for p in ds.programs if p.device == args.trained}
    asked = [p for p in ds.programs if p.device == args.asked]
    model = Predictor.load(args.model)
    pred = np.array([q.seconds for q in model.predict_features([p.features for p in asked], args.asked)])
    label = np.array([p.seconds for p in asked])
    twin = np.array([program_hash(p) in trained for p in asked])
    print(line(f"{args.asked}, twins of {args.trained} programs", pred[twin], label[twin]))
    print(line(f"{args.asked}, the others", pred[~twin], label[~twin]))
    twins = [p for p, t in zip(asked, twin) if t]
    own = np.array([q.seconds for q in model.predict_features([p.features for p in twins], args.trained)])
    print(line(f"the same twins asked on {args.trained}, its own (training) labels", own,
               np.array([trained[program_hash(p)] for p in twins])))


if __name__ == "__main__":
    main()
