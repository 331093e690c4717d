"""Why is cross-device-new's fast-10 % MAPE ~2x random-new's? Is it the source prediction or the Amdahl transfer?

cdmpp predicts a 1-thread program it never trained on at 2 threads (the anchor) and moves it with Amdahl's law
(``cdmpp.model.physics.amdahl_seconds``). Moving the *measured* 2-thread twin the same way (twin-Amdahl) is at
8.4 % on the fastest tenth, so the law holds; this splits cdmpp's error on each task's fastest tenth of the
test programs into the 2-thread prediction's error (the 1-thread prediction moved back) and the transfer's, by
how much of the 2-thread latency is fork/join overhead (parallel leaves x the anchor's fork/join cost).

    .venv/bin/python experiments/cross_device_fast.py runs/shot-choice/cd-*.pkl

The pickles are ``experiments/shot_choice_seen.py train SEED``'s (development seeds; cdmpp's predictions of every
target program, kept).
"""

import pickle
import sys

import numpy as np


def main(paths) -> None:
    from cdmpp.evaluation import splits
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned
    from cdmpp.model.physics import amdahl_seconds, fork_join_seconds, parallel_share

    opts = ProtocolOptions()
    ds = load_pinned(opts)
    target = opts.target_device
    for path in paths:
        with open(path, "rb") as f:
            kept = pickle.load(f)
        seed = kept["seed"]
        sp = splits.cross_device_split(ds, target, 0, seed=seed, programs="new")
        source = sp.info["source_devices"]
        twin = {p.features.program_hash: p.seconds for p in splits._programs(ds) if p.device in source}
        o = fork_join_seconds([p.seconds for p in sp.train], [p.features for p in sp.train])
        test = [p for p in sp.test if p.features.program_hash in twin]
        feats = [p.features for p in test]
        y1 = np.array([p.seconds for p in test])
        y2 = np.array([twin[p.features.program_hash] for p in test])
        p1 = np.array([kept["seen"][(p.device, p.features.program_hash)][0] for p in test])
        p2 = amdahl_seconds(p1, feats, 1, 2, o)  # the anchor's prediction, moved back
        oracle = amdahl_seconds(y2, feats, 2, 1, o)  # the measured twin moved by the same law
        overhead = o * parallel_share(feats)[:, 1] / y2
        groups: dict = {}
        for i, p in enumerate(test):
            groups.setdefault(p.task, []).append(i)
        fast = np.array([i for idx in groups.values() for i in sorted(idx, key=lambda j: y1[j])[:max(1, round(0.1 * len(idx)))]])
        ape = lambda pred, y, idx: 100 * float(np.mean(np.abs(pred[idx] / y[idx] - 1)))  # noqa: E731
        bias = lambda pred, y, idx: float(np.median(np.log(pred[idx] / y[idx])))  # noqa: E731
        print(f"seed {seed}: fork/join {1e6 * o:.2f} us; {len(test)} test programs with a twin, {len(fast)} fast-10")
        print("| programs | n | 1-thread APE (cdmpp) | log bias | 2-thread APE (moved back) | log bias | twin-Amdahl APE |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        every = np.arange(len(test))
        for name, idx in [("all", every), ("fast-10 %", fast)] + [
                (f"fast-10 %, overhead {lo:g}-{hi:g} of the 2-thread time", fast[(overhead[fast] >= lo) & (overhead[fast] < hi)])
                for lo, hi in ((0, 1e-9), (1e-9, 0.25), (0.25, 0.5), (0.5, 1.01))]:
            if len(idx):
                print(f"| {name} | {len(idx)} | {ape(p1, y1, idx):.1f} % | {bias(p1, y1, idx):+.2f} | {ape(p2, y2, idx):.1f} % | "
                      f"{bias(p2, y2, idx):+.2f} | {ape(oracle, y1, idx):.1f} % |")
        spread(sp.test, kept["seen"])


def spread(test, seen) -> None:
    """Is the fastest tenth missed because the predictions are shrunk toward their task's level (then the measured
    log latency rises faster than the predicted one within a task, and stretching a task's predictions about their
    mean helps) or because the model cannot tell those programs apart?"""
    from cdmpp.evaluation.metrics import fast_share_mape

    y = np.log([p.seconds for p in test])
    pred = np.log([seen[(p.device, p.features.program_hash)][0] for p in test])
    groups: dict = {}
    for i, p in enumerate(test):
        groups.setdefault(p.task, []).append(i)
    groups = [np.array(idx) for idx in groups.values() if len(idx) >= 5]
    dy = np.concatenate([y[idx] - y[idx].mean() for idx in groups])
    dp = np.concatenate([pred[idx] - pred[idx].mean() for idx in groups])
    print(f"within a task (tasks of >= 5 test programs): sd of log latency {dy.std():.3f}, of log prediction "
          f"{dp.std():.3f}; slope of measured on predicted {dy @ dp / (dp @ dp):.3f}")
    tasks = [(p.device, p.task) for p in test]
    for alpha in (1.0, 1.1, 1.2, 1.3):  # each task's predictions stretched about their mean
        stretched = pred.copy()
        for idx in groups:
            stretched[idx] = pred[idx].mean() + alpha * (pred[idx] - pred[idx].mean())
        seconds, p = np.exp(y), np.exp(stretched)
        print(f"  stretched x{alpha:.1f}: MAPE {100 * np.mean(np.abs(p / seconds - 1)):.1f} %, "
              f"fast-10 % {100 * fast_share_mape(seconds, p, tasks):.1f} %")


if __name__ == "__main__":
    main(sys.argv[1:])
