"""``cdmpp collect --from-search``: every candidate of an evolutionary search measured, stored and tagged."""

import json
from types import SimpleNamespace

import pytest

from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore


def _search(ds, trials, cost_model="random"):
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.search import collect_from_search
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    from cdmpp.zoo.tasks import Task, task_key

    tvm = tvm_env.setup(1)
    mod = workloads.matmul(64, 64, 64)
    task = Task(task_key(mod), "matmul", tvm.ir.save_json(mod), None, {"toy@1": 1})
    device = SimpleNamespace(id="test-cpu-1t/llvm", threads=1)
    # quiet_share 1.0: the CPU guard would otherwise wait for a quiet machine (tested on its own); two build
    # workers: a batch is built as two jobs
    cfg = MeasureConfig(repeat=3, min_repeat_ms=5, builders=2, quiet_share=1.0)
    s = collect_from_search([task], ds, device, tvm_env.make_target("llvm", num_cores=1), trials, cfg,
                            per_iter=4, cost_model=cost_model, population=32, progress=False)
    return s, task


@pytest.mark.slow
def test_every_searched_candidate_is_a_tagged_labelled_record_and_a_resumed_search_adds_only_the_rest(tmp_path):
    ds = str(tmp_path / "ds")
    s, task = _search(ds, 8)
    recs = list(RecordStore(ds).iter_records())
    assert s["measured"] + s["failed"] == len(recs) == 8
    assert len({r["program_hash"] for r in recs}) == 8  # the search measures no program twice
    for r in recs:
        assert r["task"] == task.key and r["trace"] and r["search"]["strategy"] == "evolutionary"
        assert r["search"]["cost_model"] == "random" and 0 <= r["search"]["trial"] < 8
        assert label(r) is not None and label(r) == min(r["seconds"]) > 0
    again, _ = _search(ds, 8)
    assert again["measured"] == again["tasks_searched"] == 0  # complete: nothing to do
    more, _ = _search(ds, 12)
    recs = list(RecordStore(ds).iter_records())
    # the rest of the 12 trials: a candidate the first 8 already measured is not measured again, so a search
    # whose evolution proposes one again ends with fewer records than trials (seen: 11)
    assert more["tasks_searched"] == 1 and 8 < len(recs) <= 12 and len(recs) == len({r["program_hash"] for r in recs})
    trials = sorted(r["search"]["trial"] for r in recs)
    assert trials[:8] == list(range(8)) and all(8 <= t < 12 for t in trials[8:])  # the new ones are the rest
    # every search ran to the end and is listed, so a restart does not search the task again for the trials
    # its records lack (a candidate stored before leaves none)
    from cdmpp.measure.search import searched_tasks_path

    with open(searched_tasks_path(ds, "test-cpu-1t/llvm")) as f:
        assert [(j["task"], j["trials"]) for j in map(json.loads, f)] == [(task.key, 8), (task.key, 12)]
    done, _ = _search(ds, 12)
    assert done["tasks_searched"] == done["measured"] == 0 and len(list(RecordStore(ds).iter_records())) == len(recs)


def test_an_unknown_cost_model_or_trial_count_is_refused_before_any_work(tmp_path):
    from cdmpp.measure.search import collect_from_search

    with pytest.raises(ValueError, match="unknown search cost model 'best'"):
        collect_from_search([], str(tmp_path), None, None, 8, None, cost_model="best")
    with pytest.raises(ValueError, match=">= 1"):
        collect_from_search([], str(tmp_path), None, None, 0, None)
    assert not (tmp_path / "runs.jsonl").exists()


def test_collect_refuses_from_search_with_another_devices_programs_before_probing(tmp_path, capsys):
    from cdmpp.cli import main

    devices = tmp_path / "devices.json"
    code = main(["collect", "--from-search", "--programs-from", "x/llvm", "--dataset", str(tmp_path / "ds"),
                 "--devices", str(devices)])
    assert code == 2 and "--from-search measures locally" in capsys.readouterr().err
    assert not devices.exists() and not (tmp_path / "ds").exists()


@pytest.mark.slow
def test_a_shared_cost_model_is_made_once_and_learns_from_every_task(tmp_path, monkeypatch):
    """As ms.tune_tir shares one cost model over its tasks: made once, trained on each task's measurements."""
    from cdmpp.measure import search
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    from cdmpp.zoo.tasks import Task, task_key

    made = []
    real = search._cost_model
    monkeypatch.setattr(search, "_cost_model", lambda *args: made.append(real(*args)) or made[-1])
    tvm = tvm_env.setup(1)
    tasks = [Task(task_key(m), name, tvm.ir.save_json(m), None, {"toy@1": 1})
             for name, m in (("matmul", workloads.matmul(64, 64, 64)), ("matmul48", workloads.matmul(48, 48, 48)))]
    device = SimpleNamespace(id="test-cpu-1t/llvm", threads=1)
    cfg = MeasureConfig(repeat=3, min_repeat_ms=5, builders=1, quiet_share=1.0)
    ds = str(tmp_path / "ds")
    s = search.collect_from_search(tasks, ds, device, tvm_env.make_target("llvm", num_cores=1), 4, cfg, per_iter=4,
                                   cost_model="xgb", population=32, progress=False, shared_model=True)
    assert s["tasks_searched"] == 2 and len(made) == 1
    assert len(made[0].data) == 2  # XGBModel's measurements, one group per task's workload
    recs = list(RecordStore(ds).iter_records())
    assert {r["task"] for r in recs} == {t.key for t in tasks} and all(r["search"]["shared_model"] for r in recs)
