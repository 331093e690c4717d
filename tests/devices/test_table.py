"""The device table file."""

from __future__ import annotations

import pytest

from cdmpp.devices.spec import DeviceSpec
from cdmpp.devices.table import DeviceTable


def _cpu(mcpu="znver4", cores=2):
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}


def _spec(id_="hw-a-2t/llvm-avx2", hardware="HW A", threads=2, **kw):
    vals = dict(clock_ghz=2.6, cores=threads, simd_width_bits=256, l1d_kb=32.0, l2_kb=1024.0, l3_kb=32768.0,
                mem_bw_gbs=20.0, peak_gflops=100.0)
    vals.update(kw)
    return DeviceSpec(id=id_, kind="cpu", hardware=hardware, target=_cpu("haswell", threads), threads=threads,
                        measured_at="2026-11-01", **vals)


def test_table_round_trip_and_never_drops(tmp_path):
    path = tmp_path / "devices.json"
    t = DeviceTable(path)
    a = t.add(_spec())
    t2 = DeviceTable(path)
    assert t2.ids() == [a.id] and t2.get(a.id) == a
    # another writer adds a device; our stale table adds a third: all three survive
    DeviceTable(path).add(_spec("hw-a-1t/llvm-avx2", threads=1))
    t.add(_spec("hw-b-2t/llvm-avx2", hardware="HW B"))
    assert sorted(DeviceTable(path).ids()) == ["hw-a-1t/llvm-avx2", "hw-a-2t/llvm-avx2", "hw-b-2t/llvm-avx2"]
    assert "same chip as hw-a-2t/llvm-avx2, 1 thread instead of 2" in DeviceTable(path).get(
        "hw-a-1t/llvm-avx2").relation
    assert not list(tmp_path.glob("*.tmp"))
    # an id must name one device
    with pytest.raises(ValueError, match="already names"):
        t.add(_spec(hardware="HW C"))
    # unknown keys from a newer writer survive a round trip
    d = _spec().to_dict() | {"new_field": 1}
    assert DeviceSpec.from_dict(d).to_dict()["new_field"] == 1


def test_unknown_id_lists_known(tmp_path):
    t = DeviceTable(tmp_path / "devices.json")
    t.add(_spec())
    with pytest.raises(KeyError, match="hw-a-2t/llvm-avx2"):
        t.get("nope/llvm-avx512")
