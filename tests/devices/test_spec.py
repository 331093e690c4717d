"""Device ids and specs."""

from __future__ import annotations

import numpy as np
import pytest

from cdmpp.devices.spec import SPEC_FIELDS, device_id, hardware_slug


def _cpu(mcpu="znver4", cores=2):
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}


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


def test_feature_vector(probed):
    spec, _ = probed
    v = spec.feature_vector()
    assert v.dtype == np.float32 and v.shape == (len(SPEC_FIELDS),)
    assert v[SPEC_FIELDS.index("peak_gflops")] == pytest.approx(spec.peak_gflops, rel=1e-6)
