"""Probing this machine's CPU."""

from __future__ import annotations

import json

import pytest

from cdmpp.devices.spec import SPEC_FIELDS, isa_level, target_label


def _cpu(mcpu="znver4", cores=2):
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}


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
