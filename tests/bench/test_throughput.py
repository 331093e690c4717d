"""``cdmpp bench collect``."""

import pytest


@pytest.mark.slow
def test_bench_collect_reports_rate_and_where_the_time_went(tmp_path):
    from cdmpp.bench.throughput import bench_collect

    r = bench_collect("datasets/tasks-llvm.json.gz", "datasets/devices.json", threads=1, mcpu=None, tasks=1,
                      per_task=2, seed=3, measurer="fast", overlap=False, quiet_share=1.0, run_budget_s=0.2,
                      dataset=str(tmp_path / "ds"))
    assert r["measured"] + r["failed"] >= 1 and r["programs_per_s"] >= 0 and r["device"].endswith("-1t/" + r["device"].split("/")[1])
    assert {"wait_build", "run", "wait_quiet", "paused", "build_cpu", "sample_cpu"} <= set(r["times"])
    assert len(list((tmp_path / "ds").glob("*.active.jsonl"))) == 1
