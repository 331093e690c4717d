"""``cdmpp bench tune``."""

import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


@pytest.mark.slow
def test_bench_tune_short(tvm, restore_logging, tmp_path, monkeypatch):
    """A short ``cdmpp bench tune``: each method and seed tunes the task, and cdmpp is judged against
    XGBoost's run of the same seed. The report is written as runs finish, and a second call with the
    same settings resumes from it instead of tuning again."""
    import json
    from pathlib import Path

    from cdmpp.bench import tune as bench_tune

    table = str(Path(__file__).resolve().parents[2] / "datasets" / "tasks-llvm.json.gz")
    out = str(tmp_path / "tune.json")
    args = dict(trials=4, per_iter=4, threads=1, model=None, device=None, task_table=table, seeds=[0], population=16)
    r = bench_tune.run(["bert_tiny@1/fused_softmax_broadcast_to2"], ["cdmpp", "xgb"], out=out, **args)
    assert json.loads(Path(out).read_text())["tasks"]["bert_tiny@1/fused_softmax_broadcast_to2"]["xgb"][0]["seed"] == 0

    def no_tuning(*a, **k):
        raise AssertionError("a run already in the report was tuned again")

    monkeypatch.setattr(bench_tune, "tune_one", no_tuning)
    again = bench_tune.run(["bert_tiny@1/fused_softmax_broadcast_to2"], ["cdmpp", "xgb"], out=out, **args)
    assert again["verdict"] == r["verdict"]
    # tuning another seed keeps the first seed's runs of the task in the report (here seed 1's "runs"
    # are copies of seed 0's: what is checked is the report's bookkeeping, not a tuning)
    first = {kind: dict(rs[0]) for kind, rs in r["tasks"]["bert_tiny@1/fused_softmax_broadcast_to2"].items()}
    monkeypatch.setattr(bench_tune, "_tune_and_retime", lambda kind, *a, **k: {**first[kind], "seed": 1})
    bench_tune.run(["bert_tiny@1/fused_softmax_broadcast_to2"], ["cdmpp", "xgb"], out=out, **{**args, "seeds": [1]})
    kept = json.loads(Path(out).read_text())["tasks"]["bert_tiny@1/fused_softmax_broadcast_to2"]
    assert sorted(x["seed"] for x in kept["xgb"]) == [0, 1] and sorted(x["seed"] for x in kept["cdmpp"]) == [0, 1]
    # tuning with another cost model keeps the other cost models' runs of the task
    monkeypatch.setattr(bench_tune, "_tune_and_retime", lambda kind, *a, **k: {**first["xgb"], "seed": 0})
    bench_tune.run(["bert_tiny@1/fused_softmax_broadcast_to2"], ["random"], out=out, **args)
    kept = json.loads(Path(out).read_text())["tasks"]["bert_tiny@1/fused_softmax_broadcast_to2"]
    assert sorted(kept) == ["cdmpp", "random", "xgb"] and len(kept["cdmpp"]) == len(kept["xgb"]) == 2
    # a run that stops before a task's turn keeps that task's earlier runs in the report
    monkeypatch.setattr(bench_tune, "load_tasks", lambda specs, table: iter(()))
    bench_tune.run([], ["cdmpp", "xgb"], out=out, **args)
    assert "bert_tiny@1/fused_softmax_broadcast_to2" in json.loads(Path(out).read_text())["tasks"]
    runs = r["tasks"]["bert_tiny@1/fused_softmax_broadcast_to2"]
    assert [x["seed"] for x in runs["cdmpp"]] == [0] and len(runs["xgb"][0]["best_so_far"]) == 4
    v = r["verdict"]["bert_tiny@1/fused_softmax_broadcast_to2"]
    assert 0 < v["budget_share_to_xgb_final"] <= 1.25 and v["final_vs_xgb"] > 0
    assert v["unseen"] is ("bert_tiny" not in r["model_saw"])
    assert "cdmpp/0" in bench_tune.table(r)
