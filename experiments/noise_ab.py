"""Back-to-back run-to-run noise of the same built programs: 2 threads vs 1 thread, repeat/min_repeat_ms variants."""
import os, sys, json, random, statistics, time
import numpy as np
from cdmpp.program import tvm_env
tvm = tvm_env.setup(2)
from tvm.s_tir import meta_schedule as ms, Schedule
from tvm.s_tir.schedule import Trace
from cdmpp.records.store import RecordStore
from cdmpp.devices.guard import CpuGuard
from cdmpp.records.labels import label
from cdmpp.zoo.tasks import TaskTable, load_task_mod
table = TaskTable.load("datasets/tasks-llvm.json.gz")
recs = [r for r in RecordStore("datasets/measurements").iter_records() if label(r)]
random.Random(1).shuffle(recs); recs = recs[:int(os.environ.get("N", 40))]
mods = []
for r in recs:
    s = Schedule(load_task_mod(table[r["task"]])); Trace.apply_json_to_schedule(r["trace"], s); mods.append(s.mod)
target = tvm_env.make_target("llvm", num_cores=2)
b = ms.builder.LocalBuilder(max_workers=2, initializer=tvm_env.worker_initializer)
builds = b.build([ms.builder.BuilderInput(m, target) for m in mods])
inputs = [ms.runner.RunnerInput(x.artifact_path, "cpu", ms.arg_info.ArgInfo.from_prim_func(m["main"])) for x, m in zip(builds, mods)]
noop = lambda *a, **k: None
def run(threads, repeat, mrm, flush=False):
    os.environ["TVM_NUM_THREADS"] = str(threads)
    r = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(number=1, repeat=repeat, min_repeat_ms=mrm, enable_cpu_cache_flush=flush), f_cleanup=noop, initializer=tvm_env.worker_initializer)
    g = CpuGuard(); g.wait_quiet(0.05, 60)
    res = [f.result() for f in r.run(inputs)]
    return [sorted(float(s) for s in x.run_secs) if x.run_secs else None for x in res]
STATS = {"median": statistics.median, "min": min,
         "trimmed": lambda v: statistics.mean(v[len(v) // 4: len(v) - len(v) // 4] or v)}
for cfg in [(2, 5, 40), (2, 15, 15), (1, 5, 40), (1, 15, 15)]:
    a = run(*cfg); c = run(*cfg)
    for name, f in STATS.items():
        x = np.array([f(v) if v else np.nan for v in a]); y = np.array([f(v) if v else np.nan for v in c])
        rel = np.abs(x - y) / np.minimum(x, y)
        print(cfg, name, "median %.3f p90 %.3f" % (np.nanmedian(rel), np.nanpercentile(rel, 90)), flush=True)
