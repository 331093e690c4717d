"""``--budget-minutes`` bounds the whole command: waiting for a quiet machine and for builds included."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from cdmpp.devices.guard import CpuGuard
from cdmpp.measure.stop import STOP, stop_at


def test_the_budget_ends_a_wait_for_a_quiet_machine():
    with stop_at(time.monotonic() + 0.3) as spent:
        with pytest.raises(KeyboardInterrupt):
            CpuGuard().wait_quiet(-1.0, 600, stop=STOP)  # never quiet: only the budget ends it
    assert spent.is_set() and not STOP.is_set()  # cleared for whatever runs next
    with stop_at(None) as spent:
        assert not spent.is_set()
    with stop_at(time.monotonic() + 600) as spent:  # done before the deadline: nothing fires
        pass
    assert not spent.is_set() and not STOP.is_set()


def _spec(**probe):
    from cdmpp.devices.spec import DeviceSpec

    return DeviceSpec(id="chip-2t/llvm-avx2", kind="cpu", hardware="chip (x86-64-v3)", target={"kind": "llvm"},
                      threads=2, clock_ghz=2.0, cores=2, simd_width_bits=256, l1d_kb=32, l2_kb=512, l3_kb=8192,
                      mem_bw_gbs=10.0 if probe.get("under_load") else 30.0, peak_gflops=100.0, probe=probe)


def test_collect_counts_its_budget_from_the_start_of_the_command(monkeypatch, tmp_path, capsys):
    from cdmpp.cli import main
    from cdmpp.devices import probe
    from cdmpp.measure import campaigns

    got = {}
    monkeypatch.setattr(probe, "probe_local_cpu", lambda threads, mcpu=None, **kw: got.update(
        probe=kw, probed_at=time.monotonic()) or _spec(under_load=True, warning="probed under load 3 times"))
    monkeypatch.setattr(campaigns, "collect", lambda *a, **kw: got.update(kw) or {
        "measured": 0, "failed": 0, "skipped_done": 0, "tasks": 1, "seconds": 0.0, "stopped_by_budget": True})
    start = time.monotonic()
    assert main(["collect", "--budget-minutes", "1", "--tasks-like", "softmax", "--dataset", str(tmp_path / "ds"),
                 "--devices", str(tmp_path / "devices.json")]) == 0
    # fixed before the probe: what the command does before measuring is part of the budget
    assert start + 60 <= got["deadline"] <= got["probed_at"] + 60 and got["budget_minutes"] == 1
    assert got["probe"]["wait_s"] <= 3.0  # the probe's waits take at most a tenth of the budget
    cap = capsys.readouterr()
    assert "warning: chip-2t/llvm-avx2: probed under load" in cap.err and "(stopped by budget)" in cap.out


def test_a_probe_under_load_is_stored_flagged_and_replaced_by_a_quiet_one(tmp_path, capsys):
    from cdmpp.cli.measure import _store_probe
    from cdmpp.devices.table import DeviceTable

    table = DeviceTable(tmp_path / "devices.json")
    _store_probe(table, _spec(under_load=True, warning="probed under load"))
    assert DeviceTable(table.path).get("chip-2t/llvm-avx2").probe["under_load"]
    assert "probed under load" in capsys.readouterr().err
    _store_probe(table, _spec())
    stored = DeviceTable(table.path).get("chip-2t/llvm-avx2")
    assert "under_load" not in stored.probe and stored.mem_bw_gbs == 30.0
    assert "replaced by this quiet probe" in capsys.readouterr().err
    _store_probe(table, _spec(under_load=True, warning="probed under load"))  # a stored quiet probe stands
    assert DeviceTable(table.path).get("chip-2t/llvm-avx2").mem_bw_gbs == 30.0


@pytest.mark.slow
def test_a_collection_on_a_machine_never_quiet_stops_at_its_budget(tmp_path, tvm):
    """The guard would wait up to max_wait_s (10 minutes here) for a quiet machine; the budget ends it."""
    from cdmpp.measure.campaigns import collect
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    from cdmpp.zoo.tasks import Task, task_key

    tvm_env.setup(1)
    mod = workloads.matmul(32, 32, 32)
    task = Task(task_key(mod), "matmul", tvm.ir.save_json(mod), None, {"toy@1": 1})
    cfg = MeasureConfig(repeat=3, min_repeat_ms=1, builders=1, quiet_share=-1.0, max_wait_s=600)
    device = SimpleNamespace(id="test-cpu-1t/llvm", threads=1)
    stats = collect([task], str(tmp_path / "ds"), device, tvm_env.make_target("llvm", num_cores=1), per_task=2,
                    cfg=cfg, progress=False, deadline=time.monotonic() + 5)
    assert stats["stopped_by_budget"] and stats["measured"] == 0 and not STOP.is_set()
