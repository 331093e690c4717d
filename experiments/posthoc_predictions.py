"""Train the shipped recipe on one protocol split and keep its predictions, for post-hoc study of the
error's tail (what a calibration chosen on validation could remove) without retraining.

    .venv/bin/python benchmarks/posthoc_predictions.py train random-new 0 4   # → runs/posthoc/random-new-0.npz
    .venv/bin/python benchmarks/posthoc_predictions.py study runs/posthoc/*.npz
    .venv/bin/python benchmarks/posthoc_predictions.py weights runs/posthoc/*.npz
    .venv/bin/python benchmarks/posthoc_predictions.py tail runs/posthoc/random-new-*.npz

``train`` saves, for the validation and test programs: the measured seconds, task ids, the transformer's
prediction and 90 % interval, the latency-target GBT's prediction, two more of its seeds and the bag of
all three, and the blend weight chosen on validation. ``study`` scores calibrations chosen on validation
only (a global scale, a shrink by interval width) on test; ``weights`` the rule that chooses the blend
weight, and the bag; ``tail`` asks whether the test programs with APE > 100 % are mislabelled (their
twin on the other thread count is an independent measurement).
"""

import copy
import os
import sys

import numpy as np


def train(setting: str, seed: int, minutes: float) -> str:
    import torch

    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.harness import recipe_config
    from cdmpp.evaluation.methods.cdmpp_model import CDMPP
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, setting_splits
    from cdmpp.model.pooled_gbt import PooledGBT

    torch.set_num_threads(1)
    opts = ProtocolOptions()
    ds = load_pinned(opts)
    table = DeviceTable(opts.devices).spec_table()
    (_, split), = setting_splits(ds, setting, seed)
    model = CDMPP(recipe_config("ablation-no-counts", seed=seed, max_minutes=minutes, progress=False), table,
                  split.target_pool or None).fit(split.train, split.val)
    trained = model.model_
    members = copy.copy(trained)
    members.gbt = None
    # two more seeds of the blend's GBT, for a bag of three (geometric mean)
    bag = [PooledGBT(table, random_state=seed + k, target="latency").fit(split.train, split.val) for k in (1, 2)]
    out = {"weight": trained.calibration["gbt_weight"]}
    for part, progs in (("val", split.val), ("test", split.test)):
        feats, devs = [p.features for p in progs], [p.device for p in progs]
        mean, lo, hi = members.predict(feats, devs)
        out.update({f"{part}_seconds": np.array([p.seconds for p in progs]),
                    f"{part}_task": np.array([f"{p.device}|{p.task}" for p in progs]),
                    f"{part}_transformer": mean, f"{part}_lo": lo, f"{part}_hi": hi,
                    f"{part}_gbt": trained.gbt.predict(progs),
                    f"{part}_gbt_bag": np.exp(np.mean([np.log(g.predict(progs)) for g in [trained.gbt, *bag]], axis=0)),
                    **{f"{part}_gbt_{k}": g.predict(progs) for k, g in zip((1, 2), bag)},
                    f"{part}_shipped": trained.predict(feats, devs)[0]})
    os.makedirs("runs/posthoc", exist_ok=True)
    path = f"runs/posthoc/{setting}-{seed}.npz"
    np.savez_compressed(path, **out)
    return path


def _mape(p, y):
    return float(np.mean(np.abs(p - y) / y))


def _best(grid, score):
    return min(grid, key=score)


def study(paths: list[str]) -> None:
    for path in paths:
        d = np.load(path)
        yv, yt = d["val_seconds"], d["test_seconds"]
        w = float(d["weight"])
        base_v, base_t = d["val_shipped"], d["test_shipped"]
        rows = [("shipped (transformer ⊕ GBT)", _mape(base_t, yt))]
        c = _best(np.exp(np.linspace(-0.5, 0.3, 81)), lambda c: _mape(c * base_v, yv))
        rows.append((f"× global scale {c:.3f}", _mape(c * base_t, yt)))
        # shrink by the members' interval width: exp(-a · log(hi / lo))
        wv, wt = np.log(d["val_hi"] / d["val_lo"]), np.log(d["test_hi"] / d["test_lo"])
        a = _best(np.linspace(0, 0.5, 51), lambda a: _mape(base_v * np.exp(-a * wv), yv))
        rows.append((f"× exp(-{a:.2f} · interval width)", _mape(base_t * np.exp(-a * wt), yt)))
        # disagreement of the two parts as the uncertainty
        dv = np.abs(np.log(d["val_transformer"] / d["val_gbt"]))
        dt = np.abs(np.log(d["test_transformer"] / d["test_gbt"]))
        b = _best(np.linspace(0, 1.0, 51), lambda b: _mape(base_v * np.exp(-b * dv), yv))
        rows.append((f"× exp(-{b:.2f} · |log transformer/GBT|)", _mape(base_t * np.exp(-b * dt), yt)))
        ape = np.abs(base_t - yt) / yt
        print(f"{path} (blend weight {w:.1f}; test APE > 100 %: {np.mean(ape > 1):.1%} of programs, "
              f"{np.sum(ape[ape > 1]) / np.sum(ape):.1%} of the error; over-predictions among them "
              f"{np.mean(base_t[ape > 1] > yt[ape > 1]):.0%})")
        for name, m in rows:
            print(f"  {name:45s} {100 * m:5.1f} %")


def weights(paths: list[str], slacks=(0.0, 0.02, 0.03, 0.05)) -> None:
    """The blend weight's rule (lowest validation MAPE, or the best-ranking weight within a MAPE slack),
    with the shipped GBT and with a bag of three GBT seeds: test MAPE and within-task Spearman, mean ±
    std over the files of one setting (one file per seed)."""
    from collections import defaultdict

    from cdmpp.evaluation.metrics import ranking_metrics
    from cdmpp.model.blend import blend, blend_weight

    rows = defaultdict(list)
    for path in paths:
        d = np.load(path)
        setting = os.path.basename(path).rsplit("-", 1)[0]
        yv, yt, tv, tt = d["val_seconds"], d["test_seconds"], d["val_task"], d["test_task"]
        for gbt in ("gbt", "gbt_bag"):
            rows[setting, f"{gbt} alone"].append((_mape(d[f"test_{gbt}"], yt),
                                                  ranking_metrics(yt, d[f"test_{gbt}"], tt)["spearman"], np.nan))
            for slack in slacks:
                w = blend_weight(yv, d["val_transformer"], d[f"val_{gbt}"], tv, slack)
                p = blend(d["test_transformer"], d[f"test_{gbt}"], w)
                rows[setting, f"transformer ⊕ {gbt}, slack {slack:.2f}"].append(
                    (_mape(p, yt), ranking_metrics(yt, p, tt)["spearman"], w))
    print("| setting | prediction | MAPE | Spearman | weights | seeds |\n|---|---|---:|---:|---|---:|")
    for (setting, name), r in rows.items():
        m, rho, w = np.array(r).T
        print(f"| {setting} | {name} | {100 * m.mean():.1f} ± {100 * m.std():.1f} % | {rho.mean():.3f} ± "
              f"{rho.std():.3f} | {' / '.join('—' if np.isnan(x) else f'{x:.1f}' for x in w)} | {len(r)} |")


def tail(paths: list[str]) -> None:
    """The 1-thread / 2-thread label ratio of the tail's twins against that of every twin pair: a wrong
    label (too fast) would show as a ratio outside the usual spread. Programs are found by (device, task,
    label), which the saved predictions keep."""
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore

    devices = ("amd-epyc-znver4-1t/llvm-avx512", "amd-epyc-znver4-2t/llvm-avx512")
    store, labels, by_label = RecordStore("datasets/measurements"), {}, {}
    for dev in devices:
        for r in store.iter_records(dev):
            if y := label(r):
                labels[dev, r["task"], r["program_hash"]] = y
                by_label[f"{dev}|{r['task']}", round(y, 15)] = r["program_hash"]
    one, two = devices
    all_ratios = [y / labels[two, t, h] for (d, t, h), y in labels.items() if d == one and (two, t, h) in labels]
    ratios, n_tail = [], 0
    for path in paths:
        d = np.load(path)
        y, p, keys = d["test_seconds"], d["test_shipped"], d["test_task"]
        for i in np.where(np.abs(p - y) / y > 1.0)[0]:
            n_tail += 1
            dev, task = keys[i].split("|")
            h = by_label[keys[i], round(float(y[i]), 15)]
            pair = (labels.get((one, task, h)), labels.get((two, task, h)))
            if None not in pair:
                ratios.append(pair[0] / pair[1])
    q = lambda r: " / ".join(f"{x:.2f}" for x in np.percentile(r, [10, 25, 50, 75, 90]))
    print(f"1-thread / 2-thread label ratio, percentiles 10 / 25 / 50 / 75 / 90:\n"
          f"  tail (APE > 100 %; {len(ratios)} of {n_tail} have a twin): {q(ratios)}\n"
          f"  every twin pair ({len(all_ratios)}): {q(all_ratios)}")


if __name__ == "__main__":
    if sys.argv[1] == "train":
        print(train(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
    elif sys.argv[1] == "weights":
        weights(sys.argv[2:])
    elif sys.argv[1] == "tail":
        tail(sys.argv[2:])
    else:
        study(sys.argv[2:])
