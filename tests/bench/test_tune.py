"""``cdmpp bench tune``."""

import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "predictor.json").exists(),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


@pytest.mark.slow
def test_bench_tune_short(tvm, restore_logging):
    """A short ``cdmpp bench tune``: each method and seed tunes the task, and cdmpp is judged against
    XGBoost's run of the same seed."""
    from pathlib import Path

    from cdmpp.bench import tune as bench_tune

    table = str(Path(__file__).resolve().parents[2] / "datasets" / "tasks-llvm.json.gz")
    r = bench_tune.run(["bert_tiny@1/fused_softmax_broadcast_to2"], ["cdmpp", "xgb"], trials=4, per_iter=4,
                       threads=1, model=None, device=None, finetune=True, task_table=table, seeds=[0])
    runs = r["tasks"]["bert_tiny@1/fused_softmax_broadcast_to2"]
    assert [x["seed"] for x in runs["cdmpp"]] == [0] and len(runs["xgb"][0]["best_so_far"]) == 4
    v = r["verdict"]["bert_tiny@1/fused_softmax_broadcast_to2"]
    assert 0 < v["budget_share_to_xgb_final"] <= 1.25 and v["final_vs_xgb"] > 0
    assert v["unseen"] is ("bert_tiny" not in r["model_saw"])
    assert "cdmpp/0" in bench_tune.table(r)
