"""``cdmpp bench costmodel``."""

import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


@pytest.mark.slow
def test_bench_costmodel_reports_both_models(tvm):
    """A short ``cdmpp bench costmodel``: XGBModel trained on stored measurements, both models timed on
    new candidates and on the stream of a real (tiny) search, and where cdmpp's time goes."""
    from pathlib import Path

    from cdmpp.bench import cost_model as bench_costmodel

    data = Path(__file__).resolve().parents[2] / "datasets"
    r = bench_costmodel.run(["bert_tiny@1/fused_softmax_broadcast_to2"], 8, [1], None,
                            "amd-epyc-znver4-2t/llvm-avx512", str(data / "measurements"),
                            str(data / "tasks-llvm.json.gz"), seed=0, search_trials=8, search_population=16)
    one = r["threads"]["1"]
    assert r["candidates"] == 8 and one["cdmpp_per_s"] > 0 and one["xgb_per_s"] > 0
    assert one["ratio"] == pytest.approx(one["cdmpp_per_s"] / one["xgb_per_s"], rel=1e-2)
    assert one["extract_per_s"] > 0
    assert set(r["breakdown_1_thread"]) == {"extract_ms", "hash_ms", "walk_ms", "model_ms"}
    assert all(v > 0 for v in r["breakdown_1_thread"].values())
    search = r["search"]
    assert search["scored"] > 0 and 0 <= search["repeat_share"] < 1 and search["threads"]["1"]["ratio"] > 0
