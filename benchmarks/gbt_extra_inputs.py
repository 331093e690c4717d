"""Does the pooled GBT (the blended half of cdmpp) gain from inputs beyond the pooled leaf rows?

    .venv/bin/python benchmarks/gbt_extra_inputs.py SETTING SEED   # one JSON line per variant on stdout

Variants, each the latency-target GBT of the shipped blend with the same split: ``base`` (as shipped),
``loops`` (+ the compact AST's loops pooled per kind: count, sum and max of log2 extent; the tree's
size). Scored with the protocol's metrics on the test programs.
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


def main(setting: str, seed: int) -> None:
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.metrics import evaluate
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, setting_splits
    from cdmpp.model.pooled_gbt import PooledGBT
    from cdmpp.records.dataset import attach_loops

    opts = ProtocolOptions()
    ds = load_pinned(opts)
    from cdmpp.zoo.tasks import TaskTable

    attach_loops(ds, opts.dataset, TaskTable.load(opts.task_table), progress=False)
    table = DeviceTable(opts.devices).spec_table()
    (_, split), = setting_splits(ds, setting, seed)

    class WithLoops(PooledGBT):
        def inputs(self, programs):
            return np.hstack([super().inputs(programs), loop_inputs(programs)])

    for name, cls in (("base", PooledGBT), ("loops", WithLoops)):
        t0 = time.time()
        gbt = cls(table, random_state=seed, target="latency").fit(split.train, split.val)
        y = np.array([p.seconds for p in split.test])
        m = evaluate(y, [f"{p.device}|{p.task}" for p in split.test], gbt.predict(split.test))
        print(json.dumps({"setting": setting, "seed": seed, "variant": name, "mape": m["mape"],
                          "median_ape": m["median_ape"], "spearman": m["spearman"],
                          "trees": gbt.booster_.num_boosted_rounds(), "seconds": round(time.time() - t0)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
