"""Where ``CDMPPCostModel.predict`` spends its time per new candidate, beside TVM's ``XGBModel`` (issue 21).

The setting of ``cdmpp bench costmodel`` (the same 4 zoo tasks, 128 new candidates each, XGBModel trained
on the stored measurements), at 1 and 2 tuning-context threads; each part timed on its own over the
same candidates, in ms per program. Run alone: ``/work/cpu-slot .venv/bin/python benchmarks/costmodel_profile.py``.
"""

import sys
import time

import numpy as np

from cdmpp.program import tvm_env
from cdmpp.bench.cost_model import DEFAULT_TASKS, _candidates, _measured
from cdmpp.bench.tune import find_task
from cdmpp.zoo.tasks import TaskTable, load_task_mod

tvm_env.setup()
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from cdmpp.predict.cost_model import CDMPPCostModel, _torch_threads  # noqa: E402
from cdmpp.program.compact_ast import walk  # noqa: E402
from cdmpp.program.features import program_hash  # noqa: E402
from cdmpp.predict.predictor import Predictor  # noqa: E402

DEVICE = "amd-epyc-znver4-2t/llvm-avx512"


def main() -> None:
    target = tvm_env.make_target("llvm", num_cores=2)
    table = TaskTable.load("datasets/tasks-llvm.json.gz")
    work = []
    for spec in DEFAULT_TASKS:
        task = find_task(table, spec)
        mod = load_task_mod(task)
        cands = _candidates(mod, target, 136, 0)
        work.append((mod, cands[:8], cands[8:], _measured(task.key, mod, "datasets/measurements", DEVICE)))
    pred = Predictor.load(sys.argv[1] if len(sys.argv) > 1 else None)
    ext = ms.feature_extractor.PerStoreFeature()
    for threads in (1, 2):
        t = dict(cdmpp=0.0, xgb=0.0, extract=0.0, xgb_booster=0.0, walk=0.0, hash=0.0, model=0.0)
        n = 0

        def timed(key, f):
            t0 = time.perf_counter()
            out = f()
            t[key] += time.perf_counter() - t0
            return out

        for mod, warm, cands, (train_c, train_r) in work:
            ctx = ms.TuneContext(mod, target=target, num_threads=threads)
            xgb = ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=0)
            xgb.update(ctx, train_c, train_r)
            cm = CDMPPCostModel(predictor=Predictor(pred.model), device=DEVICE, online_finetune=False)
            cm.predict(ctx, warm)
            xgb.predict(ctx, warm)
            timed("cdmpp", lambda: cm.predict(ctx, cands))
            timed("xgb", lambda: xgb.predict(ctx, cands))
            rows = [x.numpy().astype("float32") for x in timed("extract", lambda: ext.extract_from(ctx, cands))]
            timed("xgb_booster", lambda: xgb._predict(rows))
            mods = [c.sch.mod for c in cands]
            timed("walk", lambda: [walk(m) for m in mods])  # compact AST and FLOPs, one pass
            timed("hash", lambda: [program_hash(m) for m in mods])
            feats = cm._features(ctx, cands)
            with _torch_threads(threads):
                timed("model", lambda: pred.model.predict(feats, DEVICE))
            n += len(cands)
        print(f"{threads} thread(s), ms per program:", {k: round(v / n * 1e3, 3) for k, v in t.items()},
              f"ratio cdmpp/XGBModel {t['xgb'] / t['cdmpp']:.3f}", flush=True)


if __name__ == "__main__":
    main()
