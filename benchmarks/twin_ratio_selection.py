"""Cross-device-seen: how ``TwinRatio`` chooses its correction on the shots (reports/study-issue19.md,
round 22). The protocol's split, shots chosen without a model (KMeans and random on mean-pooled normalized
leaves), seeds 0-2 (or those given), k = 64 and 5 %; the bases of ``cdmpp + twin`` (Amdahl's law, the
roofline ratio, the twin's label) without cdmpp's embedding. Rules: the lowest cross-validated MAPE among corrections
(before round 22), and the same with "no correction" as a choice under the one-standard-error rule (now).

``.venv/bin/python benchmarks/twin_ratio_selection.py [SEEDS]`` (default 0,1,2); a few minutes, run alone."""

import sys

import numpy as np

from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P
from cdmpp.evaluation import splits
from cdmpp.evaluation.methods.twin_ratio import TwinRatio

opts = P.ProtocolOptions()
ds = P.load_pinned(opts)
target = opts.target_device
specs = DeviceTable(opts.devices).spec_table()


def lowest_cv_mape(tr: TwinRatio, shots) -> TwinRatio:
    """The rule before round 22: every (base, rounds) but "no correction", lowest mean wins."""
    y = np.log([p.seconds for p in shots])
    x = tr._x(shots)
    ratios = {kind: y - np.log(tr._base(shots, kind)) for kind in [*range(len(tr.priors)), "twin"]}
    ape = {(kind, n): a.mean() for kind, r in ratios.items() for n, a in tr._cv_ape(x, r).items() if n is not None}
    kind, rounds = min(ape, key=ape.get)
    fixed = TwinRatio(tr.twins, random_state=tr.random_state, prior=tr.priors, rounds=rounds)
    fixed.fit(shots)  # rounds fixed: the first base; put the chosen base in its place
    fixed.base_kind_ = kind
    fixed.base_ = float(np.median(ratios[kind]))
    fixed.model_ = fixed._booster(rounds, fixed.base_).fit(x, ratios[kind]) if rounds else None
    return fixed


rows: dict = {}
seeds = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "0,1,2").split(",")]
for seed in seeds:
    n_target = splits.cross_device_split(ds, target, 0, seed=seed, programs="seen").info["n_target"]
    for k_name in ("64", "5%"):
        for sampler in ("kmeans", "random"):
            sp = splits.cross_device_split(ds, target, P._k_value(k_name, n_target), sampler, seed, programs="seen")
            priors = P.twin_priors(sp, specs)
            y = np.array([p.seconds for p in sp.test])
            variants = {
                "twin-Amdahl": priors[0].predict(sp.test),
                "lowest CV MAPE (before)": lowest_cv_mape(TwinRatio(sp.twins, random_state=seed, prior=priors),
                                                          sp.shots).predict(sp.test),
                "one-SE rule, no correction a choice (now)": TwinRatio(sp.twins, random_state=seed, prior=priors).fit(
                    sp.shots).predict(sp.test),
            }
            for name, pred in variants.items():
                rows.setdefault((k_name, sampler, name), []).append(float(np.mean(np.abs(pred - y) / y)))
            print(f"seed {seed} k={k_name} {sampler}: " + ", ".join(
                f"{name} {100 * rows[(k_name, sampler, name)][-1]:.2f} %" for name in variants), flush=True)

print(f"\n| k | shots | rule | MAPE, seeds {' / '.join(map(str, seeds))} | mean ± std |\n|---|---|---|---|---:|")
for (k_name, sampler, name), v in rows.items():
    v = 100 * np.array(v)
    print(f"| {k_name} | {sampler} | {name} | {' / '.join(f'{x:.2f}' for x in v)} | {v.mean():.2f} ± {v.std():.2f} % |")
