"""Do a search's candidates teach the model the fast path a tuner explores? (issue 54 item 5, issue 55's fast-10 %)

On one device (``intel-xeon-rocketlake-2t/llvm-avx512``: its random schedules and the candidates of
``cdmpp collect --from-search``), per seed arms trained alike (the shipped recipe, 60 epochs; the GBT peers):

* ``random``: the random programs' train share (by program hash, as random-new draws it);
* ``random+search``: the same plus the search candidates of the training tasks;
* ``random+search x4``: the same with each candidate four times (their weight, not their number; an epoch is longer).

Every arm chooses (early stopping, blend weights) on the same validation programs: the random programs' validation
share and the candidates of a sixth of the search tasks. Scored on two test sets no arm trained on: the candidates
of a third of the search tasks (whole tasks held out: a tuner searching a task whose candidates the model never
saw), and the random programs' test share (random-new on this device), each with MAPE on each task's fastest tenth.

    .venv/bin/python experiments/search_candidates.py run 0 1 2   # -> runs/search-study/rows.jsonl (~10 min a seed)
    .venv/bin/python experiments/search_candidates.py run 0 1 2 --arms "random+search x4"   # one arm more
    .venv/bin/python experiments/search_candidates.py table       # the report's table (reports/search-candidates.md)

``--before ISO`` takes the candidates measured before another time (default: the first study's cutoff), ``--rows
FILE`` writes and reads another rows file, so a later, larger run sits beside the first; ``--methods`` names the
methods (default: cdmpp and the GBT peers); ``--replay`` adds, for cdmpp, the held-out tasks' searches replayed as
``search_replay.py`` does (its order prediction as the cost model's base, alone and with the per-task correction,
after 0, 16 and 32 measured candidates). The report's 4 Dec tables:

    .venv/bin/python experiments/search_candidates.py run 0 1 2 --before 2026-12-04T04:25:00+00:00 --rows runs/search-study/rows-9k.jsonl
    .venv/bin/python experiments/search_candidates.py run 0 1 2 --before 2026-12-04T04:25:00+00:00 --methods cdmpp \
        --replay --rows runs/search-study/replay.jsonl

Development seeds only (0-2): a choice made here is then run once on the locked seeds.
"""

import json
import os
import sys

import numpy as np

DEVICE = "intel-xeon-rocketlake-2t/llvm-avx512"
METHODS = ("cdmpp", "pooled-gbt-latency", "pooled-gbt-mape", "gbt-blend")
ROWS = "runs/search-study/rows.jsonl"
SEARCHED_BEFORE = "2026-12-03T22:00:00+00:00"  # the candidates of the first run (3,338 of 54 tasks): every arm on one split


def _split(ds, random_ids: set, seed: int):
    """(train random, train search, val, {test name: programs}): random programs by hash as random-new; search
    candidates by task (a third test, a sixth validation, the rest training); a hash in a test set is in no
    other part."""
    from cdmpp.evaluation import splits
    from cdmpp.records.splits import _rng, _split_by_key

    programs = splits._programs(ds)
    searched = [p for p in programs if p.record_id not in random_ids]
    rand = splits.random_split([p for p in programs if p.record_id in random_ids], seed)
    s_test, s_val, s_train = _split_by_key(searched, lambda p: p.task, [1 / 3, 1 / 6], _rng(seed, "search-tasks"))
    tests = {"search candidates, new tasks": s_test, "random programs (random-new)": rand.test}
    held = {p.features.program_hash for t in tests.values() for p in t}
    keep = lambda ps: [p for p in ps if p.features.program_hash not in held]  # noqa: E731
    return keep(rand.train), keep(s_train), keep(rand.val) + keep(s_val), tests


ARMS = ("random", "random+search", "random+search x4")


def _replay_rows(method, candidates, trial: dict, row: dict, rows: str) -> None:
    """Rows of the held-out tasks' searches replayed with ``method``'s order prediction as the cost model's base:
    the candidates after the first n of each task (n = 0, 16, 32), scored alone and with the per-task correction."""
    from search_replay import replay, searches

    tasks = searches(candidates, trial)
    every = [p for ps in tasks.values() for p in ps]
    base = dict(zip((p.record_id for p in every), method.predict_order(every)))
    for (n, scorer), v in replay(tasks, base, "cdmpp", ns=(0, 16, 32)).items():
        v = np.array(v)
        out = dict(row, method=scorer, test=f"replayed searches, after {n} measured", n_test=len(every), tasks=len(tasks),
                   metrics={"spearman": v[:, 0].mean(), "top1": v[:, 1].mean(), "mape": v[:, 2].mean()})
        with open(rows, "a") as f:
            f.write(json.dumps(out) + "\n")
        print(f"seed {row['seed']} {row['arm']:13s} {scorer:20s} after {n:2d}: Spearman {out['metrics']['spearman']:.3f} "
              f"top-1 {out['metrics']['top1']:.3f} MAPE {100 * out['metrics']['mape']:.1f} %", flush=True)


def run(seed: int, arms=ARMS[:2], before: str = SEARCHED_BEFORE, rows: str = ROWS, methods=METHODS,
        replayed: bool = False) -> None:
    import datetime as dt

    import torch

    from cdmpp import defaults
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.methods import registry
    from cdmpp.evaluation.protocol import recipe_config, score
    from cdmpp.records.dataset import LoadReport, load_dataset
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable

    torch.set_num_threads(2)
    tasks = TaskTable.load(defaults.TASK_TABLE)
    ds = load_dataset(defaults.DATASET, tasks, devices=[DEVICE], progress=True)
    random_ids = {p.record_id for p in load_dataset(defaults.DATASET, tasks, devices=[DEVICE], searched=False).programs}
    cutoff = dt.datetime.fromisoformat(before).timestamp()
    later = {r.id for r in RecordStore(defaults.DATASET).records(DEVICE, LoadReport(), False) if r.measured_at >= cutoff}
    ds.programs = [p for p in ds.programs if p.record_id in random_ids or p.record_id not in later]
    table = DeviceTable(defaults.DEVICES).spec_table()
    train_random, train_search, val, tests = _split(ds, random_ids, seed)
    if replayed:
        from search_replay import search_trials

        trial = search_trials(DEVICE)
    print(f"seed {seed}: {len(train_search)} training candidates, {len(tests['search candidates, new tasks'])} test "
          f"candidates, {len(train_random)} random training programs", flush=True)
    os.makedirs(os.path.dirname(rows), exist_ok=True)
    for arm in arms:
        train = train_random + train_search * {"random": 0, "random+search": 1, "random+search x4": 4}[arm]
        context = registry.Context(seed, table, 2, recipe_config("ablation-no-counts", seed=seed, progress=True))
        for method, _ in registry.build(list(methods), context):
            method.fit(train, val, None)
            if "Amdahl transfer" in method.label:  # one device: the transfer is the identity
                continue
            if method.label == "cdmpp" and replayed:  # the held-out tasks' searches replayed (search_replay.py)
                _replay_rows(method, tests["search candidates, new tasks"], trial, dict(seed=seed, arm=arm), rows)
            for test_name, test in tests.items():
                m = score(method, test)
                row = dict(seed=seed, arm=arm, method=method.label, test=test_name, n_train=len(train),
                           n_search_train=len(train) - len(train_random), n_test=len(test),
                           metrics={k: m[k] for k in ("mape", "mape_fast10", "spearman", "top1", "mape_median")
                                    if k in m})
                with open(rows, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"seed {seed} {arm:13s} {method.label:28s} {test_name:30s} MAPE {100 * m['mape']:5.1f} % "
                      f"fast-10 {100 * m['mape_fast10']:5.1f} % Spearman {m['spearman']:.3f}", flush=True)


def table(path: str = ROWS) -> None:
    """Mean ± std over seeds of each (test, method, arm): MAPE, fast-10 % MAPE, within-task Spearman."""
    from collections import defaultdict

    cells = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        cells[(r["test"], r["method"], r["arm"])].append(r["metrics"])
    print("| test programs | method | trained on | seeds | MAPE | fast-10 % MAPE | Spearman |\n|---|---|---|---:|---:|---:|---:|")
    for (test, method, arm), ms in sorted(cells.items()):
        def stat(key, pct=True):
            if any(key not in m for m in ms):  # a replayed search's rows have no fast-10 %
                return "–"
            v = np.array([m[key] for m in ms], dtype=float)
            return f"{100 * v.mean():.1f} ± {100 * v.std():.1f} %" if pct else f"{v.mean():.3f} ± {v.std():.3f}"
        print(f"| {test} | {method} | {arm} | {len(ms)} | {stat('mape')} | {stat('mape_fast10')} | "
              f"{stat('spearman', False)} |")


if __name__ == "__main__":
    args = sys.argv[2:]

    def option(name, default):
        return args.pop(args.index(name) + 1) if name in args else default

    arms = tuple(option("--arms", ",".join(ARMS[:2])).split(","))
    before, rows = option("--before", SEARCHED_BEFORE), option("--rows", ROWS)
    methods = tuple(option("--methods", ",".join(METHODS)).split(","))
    replayed = "--replay" in args
    if sys.argv[1] == "run":
        for s in [a for a in args if not a.startswith("--")]:
            run(int(s), arms, before, rows, methods, replayed)
    else:
        table(rows)
