"""Cross-device-seen: the twin-ratio fits on KMeans shots, each shot weighted by the pool programs it
stands for (its cluster's size) or not (reports/study-issue19.md, round 22). The protocol's split, shots
chosen without a model (KMeans / random on mean-pooled normalized leaves), seeds 0-2, k = 64 and 5 %:
physics (twin-Amdahl) alone, Amdahl x the ratio GBT, and the ratio GBT over every physics base (what
``cdmpp + twin`` fits, without cdmpp's embedding).

``.venv/bin/python benchmarks/shot_weights.py``; a few minutes, run alone."""

import numpy as np

from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P
from cdmpp.evaluation import splits
from cdmpp.evaluation.methods.twin_ratio import TwinRatio

opts = P.ProtocolOptions()
ds = P.load_pinned(opts)
target = opts.target_device
specs = DeviceTable(opts.devices).spec_table()
rows: dict = {}
for seed in (0, 1, 2):
    n_target = splits.cross_device_split(ds, target, 0, seed=seed, programs="seen").info["n_target"]
    for k_name in ("64", "5%"):
        for sampler in ("kmeans", "random"):
            sp = splits.cross_device_split(ds, target, P._k_value(k_name, n_target), sampler, seed, programs="seen")
            priors = P.twin_priors(sp, specs)
            y = np.array([p.seconds for p in sp.test])
            variants = {"twin-Amdahl": priors[0].predict(sp.test)}
            for weighted in (False, True):
                w = sp.shot_weights if weighted else None
                tag = ", weighted" if weighted else ""
                variants["Amdahl x ratio GBT" + tag] = TwinRatio(sp.twins, random_state=seed, prior=priors[0]).fit(
                    sp.shots, weights=w).predict(sp.test)
                variants["every base x ratio GBT" + tag] = TwinRatio(sp.twins, random_state=seed, prior=priors).fit(
                    sp.shots, weights=w).predict(sp.test)
            for name, pred in variants.items():
                rows.setdefault((k_name, sampler, name), []).append(float(np.mean(np.abs(pred - y) / y)))
            print(f"seed {seed} k={k_name} {sampler}: " + ", ".join(
                f"{name} {100 * rows[(k_name, sampler, name)][-1]:.2f} %" for name in variants), flush=True)

print("\n| k | shots | method | MAPE, seeds 0 / 1 / 2 | mean ± std |\n|---|---|---|---|---:|")
for (k_name, sampler, name), v in rows.items():
    v = 100 * np.array(v)
    print(f"| {k_name} | {sampler} | {name} | {' / '.join(f'{x:.2f}' for x in v)} | {v.mean():.2f} ± {v.std():.2f} % |")
