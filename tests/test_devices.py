"""Tests of device naming, probing and the device table (fast: one ~1 s probe)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cdmpp.devices.probe import probe_local_cpu
from cdmpp.devices.spec import SPEC_FIELDS, DeviceSpec, device_id, hardware_slug, isa_level, target_label
from cdmpp.devices.table import DeviceTable


def _cpu(mcpu="znver4", cores=2):
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}


def _spec(id_="hw-a-2t/llvm-avx2", hardware="HW A", threads=2, **kw):
    vals = dict(clock_ghz=2.6, cores=threads, simd_width_bits=256, l1d_kb=32.0, l2_kb=1024.0, l3_kb=32768.0,
                mem_bw_gbs=20.0, peak_gflops=100.0)
    vals.update(kw)
    return DeviceSpec(id=id_, kind="cpu", hardware=hardware, target=_cpu("haswell", threads), threads=threads,
                        measured_at="2026-11-01", **vals)


def test_ids_differ_by_threads_isa_and_hardware(tvm):
    a = device_id("amd-epyc-znver4", _cpu("znver4", 2), 2)
    assert a == "amd-epyc-znver4-2t/llvm-avx512"
    assert device_id("amd-epyc-znver4", _cpu("znver4", 1), 1) == "amd-epyc-znver4-1t/llvm-avx512"
    # an AVX2-level mcpu on the same chip is another device; both spellings of AVX2 name the same level
    assert device_id("amd-epyc-znver4", _cpu("x86-64-v3"), 2) == "amd-epyc-znver4-2t/llvm-avx2"
    assert device_id("amd-epyc-znver4", _cpu("haswell"), 2) == "amd-epyc-znver4-2t/llvm-avx2"
    assert device_id("amd-epyc-znver1", _cpu("znver1"), 2) == "amd-epyc-znver1-2t/llvm-avx2"
    assert device_id("nvidia-h100", {"kind": "cuda", "arch": "sm_90"}) == "nvidia-h100/cuda-sm90"
    # stable: same inputs, same id; Target objects and dicts agree
    assert device_id("amd-epyc-znver4", tvm.target.Target(_cpu("znver4", 2)), 2) == a
    with pytest.raises(ValueError, match="mcpu"):
        device_id("x", _cpu("not-a-cpu"), 2)


def test_hardware_slug():
    assert hardware_slug("AMD EPYC", "znver4") == "amd-epyc-znver4"
    assert hardware_slug("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "icelake-server") == \
        "intel-xeon-platinum-8375c-icelake-server"
    assert hardware_slug("AMD EPYC 7B13 64-Core Processor", "znver3") == "amd-epyc-7b13-znver3"


@pytest.fixture(scope="module")
def probed(tvm):
    from cdmpp.program import tvm_env

    return probe_local_cpu(1), tvm_env.host_mcpu()


def test_probe_is_sane(probed):
    spec, host = probed
    assert spec.kind == "cpu" and spec.threads == 1 and spec.cores == 1
    assert spec.id.endswith("-1t/" + target_label(spec.target)) and host in spec.id
    assert spec.target["mcpu"] == host
    for f in SPEC_FIELDS:
        assert getattr(spec, f) > 0, f
    assert 0.3 < spec.clock_ghz < 7 and spec.simd_width_bits in (128, 256, 512)
    assert 1 < spec.mem_bw_gbs < 5000 and 0.5 < spec.peak_gflops < 10000
    assert spec.l1d_kb < spec.l2_kb <= spec.l3_kb or spec.l3_kb == 0
    json.dumps(spec.to_dict())  # JSON-able


def test_simd_capped_by_target(probed):
    spec, _ = probed
    if spec.simd_width_bits != 512:
        pytest.skip("chip without AVX-512")
    # static part only: the AVX2 target's SIMD width on an AVX-512 chip
    assert isa_level(_cpu("x86-64-v3")) == ("avx2", 256)


def test_feature_vector(probed):
    spec, _ = probed
    v = spec.feature_vector()
    assert v.dtype == np.float32 and v.shape == (len(SPEC_FIELDS),)
    assert v[SPEC_FIELDS.index("peak_gflops")] == pytest.approx(spec.peak_gflops, rel=1e-6)


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
