"""A CUDA GPU's spec from what the runtime reports."""

def test_a_cuda_spec_from_what_the_runtime_reports():
    """No GPU here: the spec arithmetic from the H100's reported attributes (shared GPU-NOTES)."""
    from cdmpp.devices.cuda import cuda_spec, gpu_slug

    assert gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100"
    assert gpu_slug("NVIDIA GeForce RTX 4090") == "nvidia-rtx-4090"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100"
    spec = cuda_spec({"name": "NVIDIA H100 80GB HBM3", "compute_version": "9.0", "sm_count": 132,
                      "clock_khz": 1_980_000, "l2_bytes": 50 * 2**20, "warp_size": 32}, 3000.0, "emeraldrapids", 16)
    assert spec.id == "nvidia-h100/cuda-sm90" and spec.kind == "gpu" and spec.cores == 132
    assert spec.peak_gflops == round(132 * 128 * 2 * 1.98, 1) and spec.l2_kb == 51200.0 and spec.l1d_kb == 256.0
    assert spec.target["arch"] == "sm_90" and spec.target["host"]["mcpu"] == "emeraldrapids"
