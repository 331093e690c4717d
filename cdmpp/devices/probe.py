"""Probe this machine's CPU for a ``DeviceSpec``: caches, clock and SIMD width from the OS, memory
bandwidth and peak FLOP/s measured with a short TVM-compiled FMA loop and a numpy copy."""

from __future__ import annotations

import datetime as _dt
import os
import re
import threading
import time
from pathlib import Path

import numpy as np

from cdmpp.devices.spec import DeviceSpec, device_id, hardware_slug, isa_level, target_dict


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cpuinfo() -> dict[str, str]:
    """First processor block of /proc/cpuinfo as {key: value}."""
    info: dict[str, str] = {}
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if not line.strip():
            if info:
                break
            continue
        k, _, v = line.partition(":")
        info.setdefault(k.strip(), v.strip())
    return info


def _size_kb(text: str | None) -> float:
    if not text:
        return 0.0
    m = re.fullmatch(r"(\d+)\s*([KMG]?)B?", text.strip(), re.I)
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1 / 1024, "K": 1, "M": 1024, "G": 1024 * 1024}[m.group(2).upper()]


def _caches_kb(cpu: int = 0) -> dict[int, float]:
    """{1: L1d, 2: L2, 3: L3} sizes in KiB of the cache instances ``cpu`` uses (sysfs)."""
    out: dict[int, float] = {}
    base = f"/sys/devices/system/cpu/cpu{cpu}/cache"
    for idx in sorted(Path(base).glob("index*")) if os.path.isdir(base) else []:
        level, ctype = _read(f"{idx}/level"), _read(f"{idx}/type")
        if level is None or ctype == "Instruction":
            continue
        out[int(level)] = _size_kb(_read(f"{idx}/size"))
    return out


def _clock_ghz(info: dict[str, str]) -> float:
    """cpufreq's max if the kernel exposes it (bare metal), else /proc/cpuinfo MHz (VMs: the TSC rate)."""
    khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if khz and khz.isdigit():
        return int(khz) / 1e6
    try:
        return float(info.get("cpu MHz", "0")) / 1000
    except ValueError:
        return 0.0


def _chip_simd_bits(flags: set[str]) -> int:
    if "avx512f" in flags:
        return 512
    if "avx2" in flags or "avx" in flags:
        return 256
    if flags & {"sse", "sse2", "asimd", "neon"}:
        return 128
    return 64


def _in_threads(fn, n: int) -> float:
    """Run ``fn(i)`` in ``n`` Python threads at once; wall seconds of the whole group."""
    ths = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return time.perf_counter() - t0


def measure_bandwidth_gbs(threads: int, mbytes: int = 128, repeats: int = 8) -> float:
    """Copy bandwidth in GB/s (read + write bytes, STREAM convention) with ``threads`` threads.

    numpy's ``copyto`` releases the GIL, so ``threads`` Python threads each copying a slice load the memory
    system as a ``threads``-thread program would. 128 MiB per array is 4x a 32 MiB L3, so caches barely
    help; best of ``repeats`` after one warm-up pass that takes the page faults.
    """
    n = mbytes * 2**20 // 4
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    cuts = np.linspace(0, n, threads + 1).astype(int)

    def copy(i):
        np.copyto(dst[cuts[i]:cuts[i + 1]], src[cuts[i]:cuts[i + 1]])

    _in_threads(copy, threads)
    best = min(_in_threads(copy, threads) for _ in range(repeats))  # 128 MiB: ~10 ms a pass
    return 2 * src.nbytes / best / 1e9


def _fma_kernel(lanes: int, accumulators: int):
    """TIR: ``acc = acc * a + b`` on ``accumulators`` independent vector registers of ``lanes`` floats."""
    from cdmpp.program import tvm_env

    tvm_env.setup()
    from tvm.script import tirx as T

    width = lanes * accumulators

    @T.prim_func
    def fma(out: T.Buffer((width,), "float32"), iters: T.int32, a: T.float32, b: T.float32):
        acc = T.decl_buffer((width,), "float32", scope="local")
        for j in T.vectorized(width):
            acc[j] = T.Cast("float32", j) * T.float32(1e-3)
        for i in range(iters):
            for k in T.unroll(accumulators):
                for j in T.vectorized(lanes):
                    acc[k * lanes + j] = acc[k * lanes + j] * a + b
        for j in T.vectorized(width):
            out[j] = acc[j]

    return fma, width


def measure_peak_gflops(target, threads: int, seconds: float = 0.005, repeats: int = 40) -> float:
    """Float32 FMA throughput (GFLOP/s) of code TVM generates for ``target``, run by ``threads`` threads.

    Why a TVM kernel and not a numpy matmul: numpy's BLAS picks its own kernels for the chip, so it would
    report the same peak for an AVX2 and an AVX-512 target; the TVM kernel is compiled for the target's
    ISA, which is what the device's programs get. The kernel is compiled single-threaded and called from
    ``threads`` Python threads (TVM's FFI releases the GIL), because TVM's own thread pool is sized once per
    process by ``TVM_NUM_THREADS`` and could not give both 1- and 2-thread numbers in one process.
    12 independent accumulators cover FMA latency x throughput on current x86 cores (4 cycles x 2 units)
    while leaving registers for the operands even with 16 AVX2 registers. Many short runs (best of 40 x 5 ms)
    rather than a few long ones: when other processes share the cores, the best short window is the one the
    scheduler left us whole, which is what peak means.
    """
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    t = target_dict(target)
    _, bits = isa_level(t)
    lanes = max(1, bits // 32)
    fma, width = _fma_kernel(lanes, 12)
    single = dict(t, **{"num-cores": 1})
    f = tvm.compile(tvm.IRModule({"main": fma}), target=tvm.target.Target(single))["main"]
    dev = tvm.cpu()
    outs = [tvm.runtime.tensor(np.zeros(width, np.float32), dev) for _ in range(threads)]

    calib = 200_000
    t_cal = _in_threads(lambda i: f(outs[i], calib, 0.999999, 1e-6), 1)
    iters = max(calib, int(calib * seconds / max(t_cal, 1e-6)))
    best = min(_in_threads(lambda i: f(outs[i], iters, 0.999999, 1e-6), threads) for _ in range(repeats))
    return 2.0 * width * iters * threads / best / 1e9


def local_hardware() -> str:
    """This machine's CPU as ``DeviceSpec.hardware`` names it: the model name and LLVM's host cpu."""
    from cdmpp.program import tvm_env

    tvm_env.setup()
    return _hardware(_model_name(_cpuinfo()), tvm_env.host_mcpu())


def _model_name(info: dict[str, str]) -> str:
    return info.get("model name") or info.get("Model name") or "unknown cpu"


def _hardware(model: str, host_mcpu: str) -> str:
    return f"{model} ({host_mcpu})"


def check_runs_here(spec) -> None:
    """Raise ValueError unless ``spec`` (a ``DeviceSpec``) is a CPU device of this machine's chip: code
    built for another chip may not run here (AVX-512 code on an AVX2 chip dies of SIGILL), and where it
    runs it times this chip, not that one."""
    here = local_hardware()
    if spec.kind != "cpu" or spec.hardware != here:
        raise ValueError(f"{spec.id} is {spec.hardware}, this machine is {here}: measure it on its own machine "
                         f"(or pick a device of this one: python -m cdmpp.devices.table)")


def others_cores(loadavg_1m: float, others_share: float, cpus: int) -> float:
    """Cores' worth of work of other processes: the 1-minute load average less this process's one runnable
    thread, or the share of all cores others used during the probe (``CpuGuard``), whichever is higher (the
    load average lags by a minute, the share sees only the probe's second)."""
    return max(0.0, loadavg_1m - 1.0, others_share * cpus)


def under_load(others: float, cpus: int, threads: int) -> bool:
    """Whether other processes' work (cores, ``others_cores``) did not fit on the cores a ``threads``-thread
    probe leaves idle: then it competed with the probe, whose bandwidth and peak come out low."""
    return others > max(0, cpus - threads) + 0.5


def _measure(target: dict, threads: int) -> dict:
    """One probe's measured numbers and how busy the machine was meanwhile."""
    from cdmpp.devices.guard import CpuGuard

    guard = CpuGuard()
    load, mark, t0 = os.getloadavg()[0], guard.start(), time.perf_counter()
    peak1 = measure_peak_gflops(target, 1) if threads > 1 else None
    peak = measure_peak_gflops(target, threads)
    bw = measure_bandwidth_gbs(threads)
    cpus = os.cpu_count() or 1
    return {"peak1": peak1, "peak": peak, "bw": bw, "seconds": time.perf_counter() - t0, "loadavg_1m": load,
            "others_cores": round(others_cores(load, guard.others_share(mark), cpus), 2)}


def probe_local_cpu(threads: int, mcpu: str | None = None, relation: str = "", tries: int = 3,
                    wait_s: float = 5.0, reference: bool = False) -> DeviceSpec:
    """Spec of this machine's CPU run with ``threads`` threads and compiled with ``mcpu`` (default: host's).

    Static facts come from /proc/cpuinfo and sysfs; bandwidth and peak are measured (about 1 s, see
    :func:`measure_bandwidth_gbs`, :func:`measure_peak_gflops`). Another busy process lowers both, so a probe
    taken under load (:func:`under_load`) is taken again, up to ``tries`` times, each after waiting up to
    ``wait_s`` for a quieter machine; the best numbers count (load only lowers them). If every try was under
    load, ``probe`` says so (``under_load``, ``warning``): re-probe on an idle machine. ``reference``: also
    measure the reference kernels at 1 thread (``cdmpp.devices.reference``, about half a minute): the level a
    model moves its predictions to this chip by (``reference_s``).
    """
    from cdmpp.devices.guard import CpuGuard
    from cdmpp.program import tvm_env

    tvm_env.setup()
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    host = tvm_env.host_mcpu()
    target = target_dict(tvm_env.make_target("llvm", num_cores=threads, mcpu=mcpu or host))
    info = _cpuinfo()
    flags = set(info.get("flags", info.get("Features", "")).split())
    chip_bits = _chip_simd_bits(flags)
    label, target_bits = isa_level(target)
    if target_bits > chip_bits:
        raise ValueError(f"target mcpu={target['mcpu']} uses {target_bits}-bit SIMD ({label}) but this chip "
                         f"has {chip_bits}-bit: its code would not run here")
    model = _model_name(info)
    slug = hardware_slug(model, host)
    caches = _caches_kb(0)
    cpus = os.cpu_count() or 1
    runs = []
    for i in range(max(1, tries)):
        if i:  # others' work competed with the probe: wait (a little) for them to finish, then again
            CpuGuard().wait_quiet(max(0.0, cpus - threads) / cpus + 0.05, wait_s)
        runs.append(_measure(target, threads))
        if not under_load(runs[-1]["others_cores"], cpus, threads):
            break
    peak, bw = max(r["peak"] for r in runs), max(r["bw"] for r in runs)
    peak1 = max(r["peak1"] for r in runs) if threads > 1 else None
    last = runs[-1]
    probe = {"peak": "TVM-compiled float32 FMA loop, Python threads", "bandwidth": "numpy copyto, 128 MiB",
             "seconds": round(sum(r["seconds"] for r in runs), 2), "loadavg_1m": last["loadavg_1m"],
             "others_cores": last["others_cores"], "tries": len(runs),
             "online_cpus": cpus, "cpu_family": info.get("cpu family"), "cpu_model": info.get("model"),
             "chip_simd_bits": chip_bits}
    if peak1 is not None:
        probe["peak_gflops_1t"] = round(peak1, 2)
        if peak < 0.75 * threads * peak1:
            probe["warning"] = (f"{threads}-thread peak is {peak / peak1:.2f}x the 1-thread peak: other processes "
                                "were probably using the cores; re-probe on an idle machine")
    if under_load(last["others_cores"], cpus, threads):
        probe["under_load"] = True
        probe["warning"] = (f"probed under load {len(runs)} times (other processes' work: {last['others_cores']:g} "
                            f"cores of {cpus}, load average {last['loadavg_1m']:.2f}): memory bandwidth and peak "
                            "may be low; re-probe on an idle machine (cdmpp devices probe --add --replace)")
    if threads > cpus:
        probe["warning"] = f"{threads} threads on {cpus} cpus: oversubscribed"
    reference_s = None
    if reference:
        from cdmpp.devices.reference import geometric_mean_s, measure_reference_s

        kernel_s = measure_reference_s(target["mcpu"])
        reference_s = geometric_mean_s(kernel_s)
        probe["reference"] = {"method": "cdmpp.devices.reference kernels, fast measurer, 1 thread, fastest repeat",
                              "kernel_s": {h: float(f"{v:.4g}") for h, v in sorted(kernel_s.items())}}
        if reference_s is None:
            probe["warning"] = (f"{len(kernel_s)} of the reference kernels ran: no reference_s, so a model moves "
                                "predictions to this chip by its peak FLOP/s instead")
    return DeviceSpec(
        id=device_id(slug, target, threads), kind="cpu", hardware=_hardware(model, host), target=target,
        threads=int(threads), clock_ghz=round(_clock_ghz(info), 3), cores=int(threads),
        simd_width_bits=int(min(chip_bits, target_bits)), l1d_kb=caches.get(1, 0.0), l2_kb=caches.get(2, 0.0),
        l3_kb=caches.get(3, 0.0), mem_bw_gbs=round(bw, 2), peak_gflops=round(peak, 2),
        reference_s=float(f"{reference_s:.6g}") if reference_s else None, relation=relation,
        measured_at=_dt.date.today().isoformat(), probe=probe)
