"""Does the pooled GBT (the blended half of cdmpp) gain from other inputs or other booster settings?

    .venv/bin/python benchmarks/gbt_variants.py SETTING SEED [VARIANT,...]   # one JSON line per variant

Variants, each the latency-target GBT of the shipped blend on the same split (``VARIANTS``): ``base``
(as shipped), ``loops`` (+ the compact AST's loops pooled per kind: count, sum and max of log2 extent;
the tree's size), booster settings one at a time, and ``bag3`` (the geometric mean of three GBTs that
differ only in their seed). Scored with the protocol's metrics on the test programs.
"""

import json
import sys
import time

import numpy as np

from cdmpp.program.compact_ast import TOKEN_KINDS


def loop_inputs(programs) -> np.ndarray:
    """Per program: for each token kind, count, sum and max of its loops' log2 extents; then the number
    of loop tokens and the last one's pre-order position (the tree's size)."""
    out = np.zeros((len(programs), 3 * len(TOKEN_KINDS) + 2), np.float32)
    for i, p in enumerate(programs):
        loops = p.features.loops
        if loops is None or not len(loops):
            continue
        kind = loops[:, 0].astype(int)
        for k in range(len(TOKEN_KINDS)):
            ext = loops[kind == k, 1]
            if len(ext):
                out[i, 3 * k:3 * k + 3] = (len(ext), ext.sum(), ext.max())
        out[i, -2:] = (len(loops), loops[:, 2].max())
    return out


VARIANTS = {  # name -> PooledGBT keyword arguments (booster settings)
    "base": {}, "loops": {}, "bag3": {},
    "depth11": dict(max_depth=11),
    "min_child16": dict(min_child_weight=16), "colsample0.4": dict(colsample_bytree=0.4),
    "lambda10": dict(reg_lambda=10.0), "l1": dict(objective="reg:absoluteerror"),
}


class Bagged:
    """The geometric mean of GBTs that differ only in their seed (row and column sampling)."""

    def __init__(self, make, seeds):
        self.models = [make(s) for s in seeds]

    def fit(self, train, val):
        for m in self.models:
            m.fit(train, val)
        return self

    def predict(self, programs):
        return np.exp(np.mean([np.log(m.predict(programs)) for m in self.models], axis=0))


def main(setting: str, seed: int, variants: list[str]) -> None:
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.metrics import evaluate
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, setting_splits
    from cdmpp.model.pooled_gbt import PooledGBT
    from cdmpp.records.dataset import attach_loops

    opts = ProtocolOptions()
    ds = load_pinned(opts)
    from cdmpp.zoo.tasks import TaskTable

    if "loops" in variants:
        attach_loops(ds, opts.dataset, TaskTable.load(opts.task_table), progress=False)
    table = DeviceTable(opts.devices).spec_table()
    (_, split), = setting_splits(ds, setting, seed)

    class WithLoops(PooledGBT):
        def inputs(self, programs):
            return np.hstack([super().inputs(programs), loop_inputs(programs)])

    for name in variants:
        t0 = time.time()
        cls = WithLoops if name == "loops" else PooledGBT
        make = lambda s: cls(table, random_state=s, target="latency", **VARIANTS[name])  # noqa: E731
        gbt = Bagged(make, [seed, seed + 100, seed + 200]) if name == "bag3" else make(seed)
        gbt.fit(split.train, split.val)
        y = np.array([p.seconds for p in split.test])
        m = evaluate(y, [f"{p.device}|{p.task}" for p in split.test], gbt.predict(split.test))
        print(json.dumps({"setting": setting, "seed": seed, "variant": name, "mape": m["mape"],
                          "median_ape": m["median_ape"], "spearman": m["spearman"],
                          "n_test": len(split.test), "seconds": round(time.time() - t0)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) > 3 else ["base", "loops"])
