"""Where twin-Amdahl's error sits on cross-device-seen (issue 19; reports/study-issue19.md, round 19), and
whether a rule that needs no target label removes it: the protocol's seen split (seeds 0-2, no shots),
the share of the error in tiny kernels (target label <= 5 us) and in programs slower on 2 threads than on
1, then variants of the law: other fork/join costs (quantiles of the source's per-parallel-leaf latency),
other floors on the work left after the fork/joins, and the target's roofline bound clipped into what
the twin allows. ``.venv/bin/python benchmarks/twin_amdahl_tail.py``; a few seconds per seed."""

import numpy as np

from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import splits
from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned
from cdmpp.model.pooled_gbt import roofline_seconds

opts = ProtocolOptions()
ds = load_pinned(opts)
spec = DeviceTable(opts.devices).spec_table()
target = spec[opts.target_device]
rows: dict[str, list] = {}


def score(name: str, pred: np.ndarray, y: np.ndarray) -> None:
    rows.setdefault(name, []).append(float(np.abs(pred / y - 1).mean()))


for seed in (0, 1, 2):
    sp = splits.cross_device_split(ds, opts.target_device, 0, seed=seed, programs="seen")
    source = [p for p in sp.train if p.device == sp.info["source_devices"][0]]
    test = sp.test
    y = np.array([p.seconds for p in test])
    twin = np.array([sp.twins[p.features.program_hash] for p in test])

    def law_with(**kw):  # twin-Amdahl's predictions of the test programs, with some of its settings changed
        return TwinAmdahl(sp.twins, spec[source[0].device]["cores"], target["cores"], **kw).fit(source).predict(test)

    pred = law_with()
    ape = np.abs(pred / y - 1)
    score("twin-Amdahl (as in the protocol)", pred, y)
    tiny, slower = (y <= 5e-6) & (ape > 0.5), (y / twin < 0.45) & (y > 5e-6)
    rows.setdefault("share of error: tiny kernels, APE > 50 %", []).append(ape[tiny].sum() / ape.sum())
    rows.setdefault("share of programs: tiny kernels, APE > 50 %", []).append(tiny.mean())
    rows.setdefault("share of error: > 2.2x slower on 2 threads", []).append(ape[slower].sum() / ape.sum())
    rows.setdefault("MAPE without both", []).append(ape[~tiny & ~slower].mean())

    for q in (0.02, 0.05):
        score(f"fork/join cost at the {q:.0%} quantile", law_with(quantile=q), y)
    for floor in (0.03, 0.1):
        score(f"work at least {floor:.0%} of the twin's label", law_with(floor=floor), y)
    bound = roofline_seconds([p.features for p in test], target["peak_gflops"], target["mem_bw_gbs"])
    for q in (0.02, 0.05):
        score(f"roofline bound clipped to [twin law at the {q:.0%} cost, twin law]",
              np.clip(bound, law_with(quantile=q), pred), y)

for name, vals in rows.items():
    print(f"{name:64s} " + " / ".join(f"{100 * v:5.2f}" for v in vals) + f"   mean {100 * np.mean(vals):5.2f} %")
