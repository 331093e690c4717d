"""Does a checkpoint's transformer lose the fastest program of a task (what a tuned network runs) by
ranking it wrong or by its level? On the validation tasks `cdmpp train` held out (tasks it never trained on)
and on a sample of its training programs: MAPE on all programs and on each task's fastest one, where
that fastest program sits in the task's predicted order, and for the worst tasks the features that set
the fastest program apart from the task's median one (reports/study-issue19.md, round 22).

``.venv/bin/python benchmarks/fastest_per_task.py MODEL [WORST] [--exclude-networks A,B]``: MODEL trained
by `cdmpp train` with the same ``--exclude-networks`` (and the default seed and validation share), so the
split is the one it was selected on; about a minute."""

import argparse
import random
from collections import defaultdict

import numpy as np

from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned
from cdmpp.predict.predictor import Predictor
from cdmpp.program.features import FEATURE_NAMES
from cdmpp.workflows import training_split

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("worst", nargs="?", type=int, default=8, help="tasks to show in detail")
parser.add_argument("--exclude-networks", default="", help="as the model was trained")
parser.add_argument("--train-sample", type=int, default=20000)
args = parser.parse_args()

split = training_split(load_pinned(ProtocolOptions()), exclude_networks=[n for n in args.exclude_networks.split(",") if n])
model = Predictor.load(args.model).model


def table(programs, name: str, worst: int = 0) -> None:
    y = np.array([p.seconds for p in programs])
    pred = model.predict_parts([p.features for p in programs], [p.device for p in programs])[0]
    by_task = defaultdict(list)
    for i, p in enumerate(programs):
        by_task[f"{p.device}|{p.task}"].append(i)
    rows = []
    for task, ids in by_task.items():
        ordered = sorted(ids, key=lambda i: y[i])
        fast, median = ordered[0], ordered[len(ordered) // 2]
        rank = sum(pred[i] < pred[fast] for i in ids) / max(1, len(ids) - 1)  # 0: predicted fastest
        rows.append((abs(pred[fast] - y[fast]) / y[fast], rank, fast, median, len(ids), task))
    ape = np.array([r[0] for r in rows])
    rank = np.array([r[1] for r in rows])
    print(f"{name}: {len(y)} programs, {len(by_task)} tasks; MAPE all {100 * np.mean(np.abs(pred - y) / y):.1f} %, "
          f"fastest of each task {100 * ape.mean():.1f} %; its predicted rank, median {np.median(rank):.2f}; "
          f"in the predicted top 10 %: {100 * np.mean(rank <= 0.1):.0f} %")
    for err, r, fast, median, n, task in sorted(rows, key=lambda r: -r[0])[:worst]:
        f, m = programs[fast].features, programs[median].features
        print(f"\n{100 * err:5.0f} %  rank {r:.2f}  {n} programs  {task}")
        for label, i, feats in (("fastest", fast, f), ("median ", median, m)):
            print(f"  {label} {1e6 * y[i]:10.1f} us, predicted {1e6 * pred[i]:10.1f}; {feats.n_leaves} leaves")
        if f.n_leaves == m.n_leaves:
            diff = f.leaf_features - m.leaf_features
            for leaf in range(diff.shape[0]):
                top = [j for j in np.argsort(-np.abs(diff[leaf]))[:8] if abs(diff[leaf, j]) > 0.05]
                print(f"   leaf {leaf}: " + ", ".join(
                    f"{FEATURE_NAMES[j]} {f.leaf_features[leaf, j]:.1f}/{m.leaf_features[leaf, j]:.1f}" for j in top))


random.seed(0)
table(random.sample(split.train, min(args.train_sample, len(split.train))), "training sample")
table(split.val, "validation tasks", args.worst)
