"""Inside a search, does ``CDMPPCostModel``'s per-task correction order the candidates still to come better than the
shipped model alone, and better than a model of the task's measurements alone (what TVM's XGBModel learns)?

Replays the searches ``cdmpp collect --from-search`` ran on ``intel-xeon-rocketlake-2t/llvm-avx512`` (64 trials a
task in batches of 16, steered by the shipped model): for each task with >= 48 labelled candidates and each n of
16 and 32, the first n candidates in trial order are "measured", and the rest are scored by

* ``shipped``: the shipped model's order prediction (``predict(order=True)``, what the cost model asks);
* ``shipped + correction``: times ``exp`` of ``cost_model.fit_task_correction`` fitted on the n measured (the
  cost model's own correction, the same trees);
* ``task alone``: the same trees fitted on the n measured log latencies, no pretraining.

Scored on the rest of the task's candidates: within-task Spearman, top-1 (the measured latency of the predicted
best over the best, 1.0 ideal) and MAPE; the mean over tasks. The shipped model never trained on these candidates
(they were measured after it).

    .venv/bin/python experiments/search_replay.py
"""

import numpy as np

DEVICE = "intel-xeon-rocketlake-2t/llvm-avx512"


def search_trials(device: str = DEVICE) -> dict:
    """Record id -> its trial index in its task's search, for every searched record of ``device``."""
    from cdmpp import defaults
    from cdmpp.records.dataset import LoadReport
    from cdmpp.records.store import RecordStore

    return {r.id: r.extra["search"]["trial"] for r in RecordStore(defaults.DATASET).records(device, LoadReport(), False)
            if r.extra.get("search")}


def searches(programs, trial: dict, min_candidates: int = 48) -> dict:
    """Task -> its candidates among ``programs`` in trial order, for tasks with >= ``min_candidates`` of them."""
    by_task: dict = {}
    for p in programs:
        if p.record_id in trial:
            by_task.setdefault(p.task, []).append(p)
    return {t: sorted(ps, key=lambda p: trial[p.record_id]) for t, ps in by_task.items() if len(ps) >= min_candidates}


def replay(tasks: dict, base: dict, name: str = "shipped", ns=(16, 32)) -> dict:
    """(n, scorer) -> per task (Spearman, top-1, MAPE) on the candidates after the first n: ``name`` (``base``:
    record id -> predicted seconds), ``name + correction`` and ``task alone`` (see the module's docstring)."""
    import xgboost as xgb
    from scipy import stats

    from cdmpp.model.pooled_gbt import summed_rows
    from cdmpp.predict.cost_model import fit_task_correction

    rows: dict = {}
    for n in ns:
        for programs in tasks.values():
            seen, rest = programs[:n], programs[n:]
            y = np.array([p.seconds for p in rest])
            b_rest = np.array([base[p.record_id] for p in rest])
            scorers = [(name, b_rest)]
            if n:
                y_seen = np.log([p.seconds for p in seen])
                b_seen = np.log([base[p.record_id] for p in seen])
                rest_rows = xgb.DMatrix(summed_rows([p.features for p in rest]))
                correction = fit_task_correction([p.features for p in seen], y_seen - b_seen)
                alone = fit_task_correction([p.features for p in seen], y_seen, base_score=float(y_seen.mean()))
                scorers += [(f"{name} + correction", b_rest * np.exp(correction.predict(rest_rows))),
                            ("task alone", np.exp(alone.predict(rest_rows)))]
            for scorer, pred in scorers:
                rho = stats.spearmanr(pred, y).statistic
                rows.setdefault((n, scorer), []).append((0.0 if not np.isfinite(rho) else rho,
                                                         y[np.argmin(pred)] / y.min(), float(np.mean(np.abs(pred / y - 1)))))
    return rows


def main() -> None:
    from cdmpp import defaults
    from cdmpp.model.checkpoint import TrainedModel
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    ds = load_dataset(defaults.DATASET, TaskTable.load(defaults.TASK_TABLE), devices=[DEVICE], progress=False)
    tasks = searches(ds.programs, search_trials())
    model = TrainedModel.load(defaults.MODEL)
    every = [p for ps in tasks.values() for p in ps]
    base = dict(zip((p.record_id for p in every), model.predict([p.features for p in every], DEVICE, order=True)[0]))
    rows = replay(tasks, base)
    print(f"{len(tasks)} tasks, {len(every)} candidates\n")
    print("| measured first | scorer | within-task Spearman (rest) | top-1 | MAPE |\n|---:|---|---:|---:|---:|")
    for (n, name), v in rows.items():
        v = np.array(v)
        print(f"| {n} | {name} | {v[:, 0].mean():.3f} | {v[:, 1].mean():.3f} | {100 * v[:, 2].mean():.1f} % |")


if __name__ == "__main__":
    main()
