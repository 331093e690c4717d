"""Probe a CUDA GPU for a ``DeviceSpec``: SM count, clocks and caches from the driver and the compute
capability, memory bandwidth measured."""

from __future__ import annotations

import datetime as _dt
import os
import re
import time

from cdmpp.devices.spec import DeviceSpec, device_id, slugify

# FP32 lanes per SM and L1+shared memory per SM (KB) by compute capability (NVIDIA's CUDA C guide, tables of
# "arithmetic instructions" and "compute capabilities"); an unknown one falls back to the nearest older.
_SM_FP32_LANES = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128,
                  (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}


_SM_L1_KB = {(6, 0): 64, (6, 1): 96, (7, 0): 128, (7, 5): 96, (8, 0): 192, (8, 6): 128, (8, 7): 192,
             (8, 9): 128, (9, 0): 256, (10, 0): 256, (12, 0): 128}


def _by_cc(table: dict, cc: tuple[int, int], default):
    older = [k for k in table if k <= cc]
    return table[max(older)] if older else default


def gpu_slug(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` → ``nvidia-h100``: vendor and model, without memory size, memory kind,
    form factor or brand words, so one chip's variants share a name only where their code runs alike."""
    drop = re.compile(r"^(\d+gb|hbm\d*e?|pcie|sxm\d*|nvl|geforce|tesla|quadro|graphics)$")
    words = [w for w in re.split(r"[\s_-]+", name.lower()) if w and not drop.match(w)]
    return slugify("-".join(words)) or "gpu"


def cuda_spec(attrs: dict, mem_bw_gbs: float, host_mcpu: str, host_cores: int, probe: dict | None = None) -> DeviceSpec:
    """A CUDA GPU's spec from what the runtime reports (``attrs``: name, compute_version "9.0", sm_count,
    clock_khz, l2_bytes, warp_size) and a measured copy bandwidth. Peak FP32 = SMs x FP32 lanes per SM
    x 2 (FMA) x clock."""
    major, minor = (int(x) for x in str(attrs["compute_version"]).split(".")[:2])
    cc = (major, minor)
    sms, ghz = int(attrs["sm_count"]), float(attrs["clock_khz"]) / 1e6
    target = {"kind": "cuda", "arch": f"sm_{major}{minor}", "max_threads_per_block": 1024,
              "max_shared_memory_per_block": int(attrs.get("max_shared_memory_per_block", 49152)),
              "thread_warp_size": int(attrs.get("warp_size", 32)),
              "host": {"kind": "llvm", "mcpu": host_mcpu, "num-cores": int(host_cores)}}
    lanes = _by_cc(_SM_FP32_LANES, cc, 64)
    return DeviceSpec(
        id=device_id(gpu_slug(attrs["name"]), target), kind="gpu", hardware=str(attrs["name"]), target=target,
        threads=1, clock_ghz=round(ghz, 3), cores=sms, simd_width_bits=int(attrs.get("warp_size", 32)) * 32,
        l1d_kb=float(_by_cc(_SM_L1_KB, cc, 64)), l2_kb=round(float(attrs["l2_bytes"]) / 1024, 1), l3_kb=0.0,
        mem_bw_gbs=round(mem_bw_gbs, 1), peak_gflops=round(sms * lanes * 2 * ghz, 1),
        measured_at=_dt.date.today().isoformat(),
        probe={"peak": f"{sms} SMs x {lanes} FP32 lanes x 2 x {ghz:.3f} GHz (compute capability {major}.{minor})",
               "bandwidth": "TVM device-to-device copy, 256 MiB, read+write bytes", **(probe or {})})


def measure_gpu_bandwidth_gbs(dev, mbytes: int = 256, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth (read + write bytes), best of ``repeats``."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    n = mbytes * (1 << 20) // 4
    a, b = tvm.runtime.empty((n,), "float32", dev), tvm.runtime.empty((n,), "float32", dev)
    a.copyto(b)
    dev.sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.copyto(b)
        dev.sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n * 4 / best / 1e9


def probe_cuda_gpu(index: int = 0) -> DeviceSpec:
    """Spec of this machine's CUDA GPU ``index`` as TVM sees it (``cdmpp collect --target cuda``)."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    dev = tvm.cuda(index)
    if not dev.exist:
        raise ValueError("no CUDA GPU visible to TVM: is libcudart on LD_LIBRARY_PATH (e.g. "
                         "/usr/local/cuda/targets/x86_64-linux/lib) and the driver loaded? (shared GPU-NOTES)")
    attrs = {"name": dev.device_name, "compute_version": dev.compute_version, "sm_count": dev.multi_processor_count,
             "clock_khz": dev.max_clock_rate, "l2_bytes": dev.l2_cache_size_bytes, "warp_size": dev.warp_size,
             "max_shared_memory_per_block": dev.max_shared_memory_per_block}
    bw = measure_gpu_bandwidth_gbs(dev)
    return cuda_spec(attrs, bw, tvm_env.host_mcpu(), os.cpu_count() or 1,
                     probe={"total_memory_bytes": dev.total_global_memory, "loadavg_1m": os.getloadavg()[0]})
