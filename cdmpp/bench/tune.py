"""``cdmpp bench tune``: does cdmpp make MetaSchedule find fast schedules in fewer measured trials?

Each task (default: a resnet18 conv2d, a bert_tiny dense layer and a bert_tiny softmax from the zoo) is
tuned with the same trial budget, search strategy, builder and runner by ``ms.tune_tir``, once per
cost model: ``cdmpp`` (``CDMPPCostModel``, online fine-tuning on), MetaSchedule's ``xgb`` and
``random``; on request also ``xgb-nowarmup``. MetaSchedule's default XGBoost model returns random
scores until it holds 100 measurements, so within a 64-trial budget ``xgb`` ranks candidates at random
(the search still mutates the best measured ones); ``xgb-nowarmup`` trains from the first measured batch
on. For every run: the best measured latency after each trial (the curve), the final best, and the
trials each model needed to reach XGBoost's final best (and to come within 5 % of it). Each
run's best schedule is compiled and timed once more in process (median of 10), because one runner
measurement of one candidate is noisy (see TVM-NOTES). Writes ``reports/tune.json`` after every run (a
rerun with the same settings resumes from it) and prints a table.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time

import numpy as np
from cdmpp import defaults

DEFAULT_TASKS = [  # from the networks the cross-model evaluation holds out (cdmpp.evaluation.splits.HELD_OUT_NETWORKS)
    "resnet18@1/fused_conv2d4_subtract2_divide2_multiply2_add5_relu2",
    "resnet18@1/fused_conv2d10_subtract4_divide4_multiply4_add11_relu4",
    "mobilenet_v2@1/fused_conv2d11_subtract8_divide8_multiply8_add15_tir_clip5",
    "bert_tiny@1/fused_matmul5_add3",
    "bert_tiny@1/fused_softmax_broadcast_to2",
]


def load_tasks(specs: list[str], task_table: str) -> list[tuple[str, object]]:
    """``network@batch/task_name`` → (spec, IRModule) from the zoo task table."""
    from cdmpp.zoo.tasks import TaskTable, load_task_mod

    table = TaskTable.load(task_table)
    return [(spec, load_task_mod(find_task(table, spec))) for spec in specs]


def find_task(table, spec: str):
    """The ``Task`` named by ``network@batch/task_name`` in a ``TaskTable``."""
    occ, _, name = spec.partition("/")
    task = next((t for t, _ in table.tasks_of(occ) if t.name == name), None)
    if task is None:
        raise ValueError(f"no task {name!r} in {occ} of the task table")
    return task


DEFAULT_POPULATION = 512  # candidates the evolutionary search scores per generation: MetaSchedule's own default

# how each cdmpp cost model learns from the tuner's measurements (``CDMPPCostModel``'s ``correct`` and
# ``online_finetune``): "cdmpp" as CDMPPCostModel() does by default, a per-task correction of its predictions;
# "cdmpp-finetune" fine-tunes the transformer instead; "cdmpp-frozen" does not learn
CDMPP_KINDS = {"cdmpp": {"finetune": False, "correct": True}, "cdmpp-finetune": {"finetune": True, "correct": False},
               "cdmpp-frozen": {"finetune": False, "correct": False}}


def make_cost_model(kind: str, model: str | None, device: str | None, seed: int, threads: int):
    from tvm.s_tir import meta_schedule as ms

    if kind in CDMPP_KINDS:  # pretrained; all but "cdmpp-frozen" keep learning from the tuner's measurements
        from cdmpp.predict.cost_model import CDMPPCostModel

        learn = CDMPP_KINDS[kind]
        return CDMPPCostModel(model=model, device=device, online_finetune=learn["finetune"], correct=learn["correct"])
    if kind == "xgb":  # exactly what tune_tir(cost_model="xgb") builds: random scores until 100 samples
        return ms.cost_model.XGBModel(num_tuning_cores=threads)
    if kind == "xgb-nowarmup":  # XGBoost trained from the first measured batch on
        return ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=0)
    if kind == "random":
        return ms.cost_model.RandomModel(seed=seed)
    raise ValueError(f"unknown cost model {kind!r}: expected {', '.join(CDMPP_KINDS)}, xgb, xgb-nowarmup or random")


def tune_one(mod, target, cost_model, trials: int, per_iter: int, threads: int, seed: int,
             population: int = DEFAULT_POPULATION) -> dict:
    """One ``ms.tune_tir`` run; the measured latency of every trial in order, and the best schedule.
    ``population``: candidates the evolutionary search keeps and scores per generation."""
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.program import tvm_env

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work_dir, unnamed_handlers_aside():
        db = ms.tune_tir(
            mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=per_iter,
            builder=ms.builder.LocalBuilder(max_workers=threads, timeout_sec=60,
                                            initializer=tvm_env.worker_initializer),
            runner=ms.runner.LocalRunner(timeout_sec=30, initializer=tvm_env.worker_initializer,
                                         evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=3,
                                                                                    min_repeat_ms=50)),
            database=ms.database.MemoryDatabase(), cost_model=cost_model, seed=seed, num_tuning_cores=threads,
            strategy=ms.search_strategy.EvolutionarySearch(population_size=population))
        records = db.get_all_tuning_records()
    secs = []
    for r in records:  # commit order = trial order
        run = [float(s) for s in (r.run_secs or [])]
        secs.append(float(np.median(run)) if run and max(run) < 1e9 else float("inf"))
    best_i = int(np.argmin(secs)) if secs else -1
    return {"trial_seconds": secs, "best_so_far": np.minimum.accumulate(secs).tolist() if secs else [],
            "best_record": records[best_i] if best_i >= 0 else None, "wall_s": round(time.perf_counter() - t0, 1)}


@contextlib.contextmanager
def unnamed_handlers_aside():
    """``tune_tir`` puts every handler of MetaSchedule's logger into a logging dictConfig by name and fails
    on unnamed ones (pytest's capture handlers, which a previous run leaves there): set them aside meanwhile."""
    import logging

    lg = logging.getLogger("tvm.s_tir.meta_schedule")
    aside = [h for h in lg.handlers if h.get_name() is None]
    for h in aside:
        lg.removeHandler(h)
    try:
        yield
    finally:
        for h in aside:
            lg.addHandler(h)


def retime(mod, record, target, repeat: int = 10) -> float | None:
    """Median latency of a tuning record's schedule, compiled and timed in this process."""
    import tvm
    from tvm.s_tir import Schedule

    if record is None:
        return None
    sch = Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    ex = tvm.compile(sch.mod, target=target)
    dev = tvm.cpu()
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    args = [tvm.runtime.tensor(np.random.rand(*[int(d) for d in a.shape]).astype(str(a.dtype)), dev)
            for a in ArgInfo.from_prim_func(sch.mod["main"])]
    f = ex.jit().time_evaluator("main", dev, number=5, repeat=repeat, min_repeat_ms=50)
    return float(np.median(f(*args).results))


def trials_to_reach(curve: list[float], goal: float) -> int | None:
    for i, v in enumerate(curve):
        if v <= goal:
            return i + 1
    return None


def run(tasks: list[str], cost_models: list[str], trials: int, per_iter: int, threads: int, model: str | None,
        device: str | None, task_table: str, seeds: list[int], out: str | None = None,
        population: int = DEFAULT_POPULATION) -> dict:
    """Every task x cost model x seed; a run is compared with XGBoost's run of the same task and seed.

    With ``out``, the report is rewritten after every run, and runs already in it (same trials, trials
    per iteration, threads, model and population) are kept instead of tuned again: an interrupted benchmark
    resumes. A small ``population`` makes a quick smoke run (the search scores fewer candidates)."""
    from cdmpp.program import tvm_env

    tvm_env.setup(threads)
    target = tvm_env.make_target("llvm", num_cores=threads)
    result = {"target": str(target), "trials": trials, "per_iter": per_iter, "threads": threads, "seeds": seeds,
              "model": model or "shipped", "population": population, "model_saw": sorted(_networks_seen(model)), "tasks": {}}
    done = _previous_runs(out, result)
    for spec, kind, seed in done:  # kept in the report until their task's turn comes, should this run stop first
        result["tasks"].setdefault(spec, {}).setdefault(kind, []).append(done[(spec, kind, seed)])
    for spec, mod in load_tasks(tasks, task_table):
        runs: dict[str, list] = {}
        for (s, kind, seed), r in done.items():  # other seeds' and cost models' runs of this task stay
            if s == spec and (seed not in seeds or kind not in cost_models):
                runs.setdefault(kind, []).append(r)
        for seed in seeds:
            for kind in cost_models:
                r = done.get((spec, kind, seed))
                if r is None:
                    print(f"bench tune: {spec} with {kind}, seed {seed} ({trials} trials)", file=sys.stderr)
                    r = _tune_and_retime(kind, mod, target, model, device, trials, per_iter, threads, seed, population)
                runs.setdefault(kind, []).append(r)
                _compare_with_xgb(runs)
                result["tasks"][spec] = runs
                if out:
                    _write(out, result)
    result["verdict"] = verdict(result)
    return result


def _tune_and_retime(kind, mod, target, model, device, trials, per_iter, threads, seed, population) -> dict:
    cm = make_cost_model(kind, model, device, seed, threads)
    r = tune_one(mod, target, cm, trials, per_iter, threads, seed, population)
    try:
        r["best_retimed_s"] = retime(mod, r.pop("best_record"), target)
    except Exception as e:  # a report without the re-timing beats no report
        print(f"bench tune: could not re-time the best {kind} schedule: {e}", file=sys.stderr)
        r["best_retimed_s"] = None
    if kind.startswith("cdmpp"):
        r["cdmpp"] = {"device": cm.device, "predict_calls": cm.n_predict_calls,
                      "predicted": cm.n_predicted, "results": cm.n_results, "finetunes": cm.n_finetunes,
                      "tasks_corrected": len(cm.corrections_)}
    r["seed"] = seed
    return r


def _compare_with_xgb(runs: dict[str, list]) -> None:
    """Final best, and trials to reach XGBoost's final best (and within 5 % of it) of the same seed."""
    goals = {x["seed"]: x["best_so_far"][-1] for x in runs.get("xgb", []) if x["best_so_far"]}
    for kind_runs in runs.values():
        for r in kind_runs:
            goal = goals.get(r["seed"])
            r["final_best_s"] = r["best_so_far"][-1] if r["best_so_far"] else None
            r["trials_to_xgb_final"] = trials_to_reach(r["best_so_far"], goal) if goal else None
            r["trials_to_within_5pct_of_xgb"] = trials_to_reach(r["best_so_far"], 1.05 * goal) if goal else None


def _previous_runs(out: str | None, result: dict) -> dict:
    """Runs of an earlier report at ``out`` made with the same settings, by (task, cost model, seed)."""
    if not out or not os.path.exists(out):
        return {}
    with open(out) as f:
        old = json.load(f)
    if any(old.get(k, DEFAULT_POPULATION if k == "population" else None) != result[k]
           for k in ("target", "trials", "per_iter", "threads", "model", "population")):
        return {}
    return {(spec, kind, r["seed"]): {**r, "best_so_far": [np.inf if v is None else v for v in r["best_so_far"]],
                                      "trial_seconds": [np.inf if v is None else v for v in r["trial_seconds"]]}
            for spec, runs in old.get("tasks", {}).items() for kind, rs in runs.items() for r in rs}


def _write(out: str, result: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_finite(result), f, indent=1)
    os.replace(tmp, out)


def _networks_seen(model: str | None) -> set[str]:
    """Networks whose programs trained the checkpoint (from its summary), to mark unseen tasks."""
    from cdmpp.model.kinds import read_summary

    summary = read_summary(model or defaults.MODEL)
    per = (summary.get("data") or {}).get("per_device", {}) if isinstance(summary.get("data"), dict) else {}
    return {n for d in per.values() for n in d.get("networks", {})}


def verdict(result: dict, method: str = "cdmpp") -> dict:
    """The issue's targets per task, for ``method`` against XGBoost: mean over seeds of the share of the
    budget it needs to reach XGBoost's final best (a run that never reaches it counts as 1.0), and its
    mean final best relative to XGBoost's."""
    out = {}
    for spec, runs in result["tasks"].items():
        if method not in runs or "xgb" not in runs:
            continue
        shares = [(r["trials_to_xgb_final"] or result["trials"] + 1) / result["trials"] for r in runs[method]]
        finals = [r["final_best_s"] / x["final_best_s"] for r, x in zip(runs[method], runs["xgb"])
                  if r["final_best_s"] and x["final_best_s"]]
        out[spec] = {"budget_share_to_xgb_final": round(float(np.mean(shares)), 3),
                     "final_vs_xgb": round(float(np.mean(finals)), 4) if finals else None,
                     "unseen": spec.split("@")[0] not in result.get("model_saw", [])}
    return out


def table(result: dict) -> str:
    marks = sorted({max(1, result["trials"] // 4), max(1, result["trials"] // 2)})
    lines = [f"{'task':58s} {'model':7s} {'best ms':>8s} {'retimed':>8s} "
             + " ".join(f"{'@' + str(m):>8s}" for m in marks) + f" {'to xgb':>6s} {'<=5%':>5s} {'wall s':>6s}"]
    for spec, runs in result["tasks"].items():
        for kind, r in ((f"{k}/{r['seed']}", r) for k, rs in runs.items() for r in rs):
            curve = r["best_so_far"]

            def at(n):
                return f"{1e3 * curve[min(n, len(curve)) - 1]:.3f}" if curve else "-"

            lines.append(f"{spec[:58]:58s} {kind:7s} {at(len(curve)):>8s} "
                         f"{(1e3 * r['best_retimed_s']) if r['best_retimed_s'] else float('nan'):8.3f} "
                         + " ".join(f"{at(m):>8s}" for m in marks) + f" {str(r['trials_to_xgb_final']):>6s} "
                         f"{str(r['trials_to_within_5pct_of_xgb']):>5s} {r['wall_s']:6.0f}")
    return "\n".join(lines)


def _finite(obj):
    """inf (a failed trial) as null, so the report is standard JSON."""
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def main(args) -> int:
    tasks = [t.strip() for t in args.tasks.split(",")] if args.tasks else DEFAULT_TASKS
    cms = [c.strip() for c in args.cost_models.split(",") if c.strip()]
    seeds = [int(x) for x in str(args.seeds).split(",") if x.strip()]
    r = run(tasks, cms, args.trials, args.per_iter, args.threads, args.model, args.device,
            args.task_table, seeds, args.out, args.population)
    print(table(r))
    for spec, v in r["verdict"].items():
        print(f"{spec}: cdmpp needs {100 * v['budget_share_to_xgb_final']:.0f} % of the trials to reach XGBoost's "
              f"final best; final {100 * (v['final_vs_xgb'] - 1):+.1f} % vs XGBoost"
              f"{'' if v['unseen'] else ' (model saw this network)'}" if v["final_vs_xgb"] else spec)
    _write(args.out, r)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
