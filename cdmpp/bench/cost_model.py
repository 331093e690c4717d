"""``cdmpp bench costmodel``: is ``CDMPPCostModel.predict`` as fast as the XGBoost cost model it replaces?

Both models score the same new candidates (random MetaSchedule schedules of a few zoo tasks) through
MetaSchedule's own ``predict(context, candidates)``, with the tuning context's thread count set as a
tuner would. TVM's ``XGBModel`` is first trained (``update``) on the task's programs stored in the
dataset, with their measured latencies, so it scores with a real booster instead of its random warm-up.
Each model sees every candidate once (no cache can help); the ratio cdmpp / XGBoost of programs per
second is the figure of merit.
"""

from __future__ import annotations

import sys
import time

DEFAULT_TASKS = [
    "resnet18@1/fused_conv2d4_subtract2_divide2_multiply2_add5_relu2",
    "bert_tiny@1/fused_matmul5_add3",
    "bert_tiny@1/fused_softmax_broadcast_to2",
    "mobilenet_v2@1/fused_conv2d11_subtract8_divide8_multiply8_add15_tir_clip5",
]


def _candidates(mod, target, n: int, seed: int) -> list:
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.measure.schedules import sample_schedules

    return [ms.MeasureCandidate(s, ms.arg_info.ArgInfo.from_prim_func(s.mod["main"]))
            for s in sample_schedules(mod, target, n, seed=seed)]


def _measured(task_key: str, mod, dataset_dir: str, device: str) -> tuple[list, list]:
    """The task's stored programs on ``device`` as candidates, and their measured runner results."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Trace

    from cdmpp.records.labels import usable
    from cdmpp.records.store import RecordStore

    cands, results = [], []
    for rec in RecordStore(dataset_dir).iter_records(device):
        if rec.get("task") != task_key or not usable(rec):
            continue
        sch = Schedule(mod)
        Trace.apply_json_to_schedule(rec["trace"], sch)
        cands.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
        results.append(ms.runner.RunnerResult(run_secs=[float(s) for s in rec["seconds"]], error_msg=None))
    return cands, results


def run(tasks: list[str], n: int, threads_list: list[int], model: str | None, device: str,
        dataset_dir: str, task_table: str, seed: int) -> dict:
    from cdmpp.program import tvm_env
    from cdmpp.bench.tune import find_task
    from cdmpp.zoo.tasks import TaskTable, load_task_mod

    tvm_env.setup()
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.predict.cost_model import CDMPPCostModel
    from cdmpp.predict.predictor import Predictor

    target = tvm_env.make_target("llvm", num_cores=2)
    table = TaskTable.load(task_table)
    per_task = -(-n // len(tasks))
    work = []
    for spec in tasks:
        task = find_task(table, spec)
        mod = load_task_mod(task)
        cands = _candidates(mod, target, per_task + 8, seed)  # 8 to warm up on
        train = _measured(task.key, mod, dataset_dir, device)
        if not train[0]:
            raise ValueError(f"{spec}: no measured programs on {device} in {dataset_dir} to train XGBModel on")
        work.append((spec, mod, cands[:8], cands[8:], train))
        print(f"bench costmodel: {spec}: {len(cands) - 8} candidates, {len(train[0])} measured programs",
              file=sys.stderr)
    predictor = Predictor.load(model)
    out = {"device": device, "candidates": sum(len(w[3]) for w in work), "tasks": tasks, "threads": {}}
    for threads in threads_list:
        cdmpp_n = xgb_n = 0
        cdmpp_s = xgb_s = 0.0
        for spec, mod, warm, cands, (train_c, train_r) in work:
            context = ms.TuneContext(mod, target=target, num_threads=threads)
            xgb = ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=0)
            if train_c:
                xgb.update(context, train_c, train_r)
            cm = CDMPPCostModel(predictor=Predictor(predictor.model), device=device, online_finetune=False)
            for m in (cm, xgb):
                m.predict(context, warm)
            for m, is_cdmpp in ((cm, True), (xgb, False)):
                t0 = time.perf_counter()
                m.predict(context, cands)
                dt = time.perf_counter() - t0
                if is_cdmpp:
                    cdmpp_n, cdmpp_s = cdmpp_n + len(cands), cdmpp_s + dt
                else:
                    xgb_n, xgb_s = xgb_n + len(cands), xgb_s + dt
        r = {"cdmpp_per_s": round(cdmpp_n / cdmpp_s, 1), "xgb_per_s": round(xgb_n / xgb_s, 1)}
        r["ratio"] = round(r["cdmpp_per_s"] / r["xgb_per_s"], 3)
        out["threads"][str(threads)] = r
        print(f"bench costmodel: {threads} thread(s): cdmpp {r['cdmpp_per_s']} programs/s, "
              f"XGBModel {r['xgb_per_s']} programs/s, ratio {r['ratio']}", file=sys.stderr)
    return out
