"""``cdmpp bench costmodel``: is ``CDMPPCostModel.predict`` as fast as the XGBoost cost model it replaces?

Both models score the same new candidates (random MetaSchedule schedules of a few zoo tasks) through
MetaSchedule's own ``predict(context, candidates)``, with the tuning context's thread count set as a
tuner would. TVM's ``XGBModel`` is first trained (``update``) on the task's programs stored in the
dataset, with their measured latencies, so it scores with a real booster instead of its random warm-up.
Each model sees every candidate once (no cache can help); the ratio cdmpp / XGBoost of programs per
second is the figure of merit. Both spend nearly all their time in TVM's feature extractor, so
``extract_per_s`` (the extractor alone) is the ceiling of any model on its features.

``search_trials`` > 0 adds what a tuner sees: the batches a real MetaSchedule search (evolutionary,
real builds and runs, steered by TVM's ``RandomModel`` as XGBModel is for its first 100 measurements)
asked its cost model to score, replayed in order to fresh instances of both models. A search scores
many candidates more than once; cdmpp keeps features by structural hash, XGBModel does not.
"""

from __future__ import annotations

import sys
import time

from cdmpp.bench.tune import DEFAULT_POPULATION

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


def search_stream(mod, target, trials: int, per_iter: int, threads: int, seed: int, population: int) -> list[list]:
    """The batches of candidates a short MetaSchedule search asked its cost model to score, in order."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model import PyCostModel

    from cdmpp.bench.tune import tune_one

    @derived_object
    class Recording(PyCostModel):
        def __init__(self):
            super().__init__()
            self.inner, self.batches = ms.cost_model.RandomModel(seed=seed), []

        def load(self, path):
            pass

        def save(self, path):
            pass

        def update(self, context, candidates, results):
            pass

        def predict(self, context, candidates):
            self.batches.append(list(candidates))
            return self.inner.predict(context, candidates)

    recording = Recording()
    tune_one(mod, target, recording, trials, per_iter, threads, seed, population)
    return recording.batches


def _repeat_share(batches: list[list]) -> float:
    """The share of the scored candidates whose program was scored before in the stream."""
    from cdmpp.program.features import program_hash

    seen, repeats, total = set(), 0, 0
    for batch in batches:
        for c in batch:
            h = program_hash(c.sch.mod)
            repeats += h in seen
            seen.add(h)
            total += 1
    return repeats / max(total, 1)


def _timed(model, context, batches: list[list]) -> float:
    t0 = time.perf_counter()
    for batch in batches:
        model.predict(context, batch)
    return time.perf_counter() - t0


def _ratio(n: int, cdmpp_s: float, xgb_s: float) -> dict:
    r = {"cdmpp_per_s": round(n / cdmpp_s, 1), "xgb_per_s": round(n / xgb_s, 1)}
    r["ratio"] = round(r["cdmpp_per_s"] / r["xgb_per_s"], 3)
    return r


def breakdown(work: list, model, device: str, target) -> dict:
    """Milliseconds per new program, on one thread, of each step ``CDMPPCostModel.predict`` takes:
    TVM's extractor (which XGBModel runs too), the structural hash (the feature cache's key), the
    compact-AST walk (leaf positions and FLOPs) and the model at the bench's call size. What cdmpp adds
    to the extractor bounds its throughput on new candidates: ratio <= extract / (extract + the rest)."""
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.program.compact_ast import walk
    from cdmpp.program.features import Featurizer, program_hash
    from cdmpp.predict.cost_model import _torch_threads

    extractor, featurizer = ms.feature_extractor.PerStoreFeature(), Featurizer()
    spent = dict.fromkeys(("extract", "hash", "walk", "model"), 0.0)
    n = 0
    for _, mod, _, cands, _ in work:
        context = ms.TuneContext(mod, target=target, num_threads=1)
        steps = {"extract": lambda: extractor.extract_from(context, cands),
                 "hash": lambda: [program_hash(c.sch.mod) for c in cands],
                 "walk": lambda: [walk(c.sch.mod) for c in cands]}
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            spent[name] += time.perf_counter() - t0
        feats = featurizer.from_candidates(context, cands, with_hash=False)
        with _torch_threads(1):
            t0 = time.perf_counter()
            model.predict(feats, device, order=True)
            spent["model"] += time.perf_counter() - t0
        n += len(cands)
    return {f"{k}_ms": round(1000 * v / n, 3) for k, v in spent.items()}


def run(tasks: list[str], n: int, threads_list: list[int], model: str | None, device: str,
        dataset_dir: str, task_table: str, seed: int, search_trials: int = 0,
        search_population: int = DEFAULT_POPULATION) -> dict:
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

    def fresh(mod, threads, train):
        context = ms.TuneContext(mod, target=target, num_threads=threads)
        xgb = ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=0)
        xgb.update(context, *train)
        return context, CDMPPCostModel(predictor=Predictor(predictor.model), device=device), xgb

    out = {"device": device, "candidates": sum(len(w[3]) for w in work), "tasks": tasks, "threads": {}}
    extractor = ms.feature_extractor.PerStoreFeature()
    for threads in threads_list:
        cdmpp_s = xgb_s = extract_s = 0.0
        for spec, mod, warm, cands, train in work:
            context, cm, xgb = fresh(mod, threads, train)
            for m in (cm, xgb):
                m.predict(context, warm)
            cdmpp_s += _timed(cm, context, [cands])
            xgb_s += _timed(xgb, context, [cands])
            t0 = time.perf_counter()
            extractor.extract_from(context, cands)
            extract_s += time.perf_counter() - t0
        r = _ratio(out["candidates"], cdmpp_s, xgb_s)
        r["extract_per_s"] = round(out["candidates"] / extract_s, 1)
        out["threads"][str(threads)] = r
        print(f"bench costmodel: {threads} thread(s): cdmpp {r['cdmpp_per_s']} programs/s, "
              f"XGBModel {r['xgb_per_s']} programs/s, ratio {r['ratio']}; TVM's extractor alone "
              f"{r['extract_per_s']} programs/s", file=sys.stderr)
    out["breakdown_1_thread"] = b = breakdown(work, predictor.model_for(device), device, target)
    print(f"bench costmodel: ms per new program on 1 thread: TVM's extractor {b['extract_ms']}, hash "
          f"{b['hash_ms']}, compact-AST walk {b['walk_ms']}, model {b['model_ms']}", file=sys.stderr)
    if search_trials > 0:
        spec, mod, _, _, train = work[0]
        batches = search_stream(mod, target, search_trials, 32, max(threads_list), seed, search_population)
        scored = sum(len(b) for b in batches)
        stream = {"task": spec, "trials": search_trials, "population": search_population, "scored": scored,
                  "repeat_share": round(_repeat_share(batches), 3), "threads": {}}
        for threads in threads_list:
            context, cm, xgb = fresh(mod, threads, train)
            r = stream["threads"][str(threads)] = _ratio(scored, _timed(cm, context, batches),
                                                         _timed(xgb, context, batches))
            print(f"bench costmodel: a search's {scored} scored candidates ({stream['repeat_share']:.0%} repeats), "
                  f"{threads} thread(s): cdmpp {r['cdmpp_per_s']} programs/s, XGBModel {r['xgb_per_s']} "
                  f"programs/s, ratio {r['ratio']}", file=sys.stderr)
        out["search"] = stream
    return out
