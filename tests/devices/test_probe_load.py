"""A probe taken while other processes load the machine is taken again, else stored with a warning."""

from __future__ import annotations

import pytest

from cdmpp.devices import probe


def test_load_is_judged_against_the_cores_the_probe_leaves_idle():
    assert probe.others_cores(loadavg_1m=4.5, others_share=0.0, cpus=2) == 3.5  # this process is one of the 4.5
    assert probe.others_cores(loadavg_1m=0.2, others_share=0.5, cpus=2) == 1.0  # the probe's own second
    assert probe.under_load(3.5, cpus=2, threads=2) and probe.under_load(1.0, cpus=2, threads=2)
    assert not probe.under_load(0.3, cpus=2, threads=2)
    assert not probe.under_load(1.2, cpus=2, threads=1)  # one core idle for others
    assert probe.under_load(1.0, cpus=16, threads=16) and not probe.under_load(3.0, cpus=16, threads=8)


@pytest.fixture
def fake_runs(monkeypatch, tvm):
    """``probe_local_cpu`` with its measurements replaced: each call takes the next of ``runs``."""
    runs, waits = [], []

    def measure(target, threads):
        return runs.pop(0)

    monkeypatch.setattr(probe, "_measure", measure)
    monkeypatch.setattr(probe.os, "cpu_count", lambda: 2)
    from cdmpp.devices.guard import CpuGuard

    monkeypatch.setattr(CpuGuard, "wait_quiet", lambda self, share, max_wait_s, *a, **k: waits.append(max_wait_s))
    return runs, waits


def _run(bw, busy):
    return {"peak1": 100.0, "peak": 190.0 + bw / 10, "bw": bw, "seconds": 1.0, "loadavg_1m": 3.0 if busy else 0.5,
            "others_cores": 2.0 if busy else 0.0}


def test_a_probe_under_load_is_taken_again_and_the_quiet_one_counts(fake_runs):
    runs, waits = fake_runs
    runs += [_run(10.0, busy=True), _run(30.0, busy=False)]
    spec = probe.probe_local_cpu(2, wait_s=0.5)
    assert spec.mem_bw_gbs == 30.0 and spec.probe["tries"] == 2 and waits == [0.5]
    assert "under_load" not in spec.probe and "load" not in spec.probe.get("warning", "")


def test_a_probe_under_load_every_time_is_stored_with_a_warning(fake_runs):
    runs, waits = fake_runs
    runs += [_run(10.0, busy=True), _run(12.0, busy=True), _run(11.0, busy=True)]
    spec = probe.probe_local_cpu(2, tries=3, wait_s=0.0)
    assert spec.probe["under_load"] is True and spec.probe["tries"] == 3 and len(waits) == 2
    assert spec.mem_bw_gbs == 12.0  # the best of the tries: load only lowers a number
    assert "probed under load 3 times" in spec.probe["warning"] and "re-probe" in spec.probe["warning"]
