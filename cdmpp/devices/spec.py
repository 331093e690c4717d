"""Devices: what a latency was measured on, named so that two measurements are comparable iff the names match.

A *device* is hardware + compilation target + thread count (DESIGN §4): one chip compiled for AVX2 instead
of AVX-512, or run with 1 thread instead of 2, gives different latencies, so each is its own device. A device
carries a few numeric specs (clock, cores, SIMD width, caches, memory bandwidth, peak FLOP/s) that the
model's device encoder reads (:meth:`DeviceSpec.feature_vector`), so an unseen device is not a blank.

The table of known devices lives in ``datasets/devices.json`` (:class:`DeviceTable`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

#: Numeric specs in the order of :meth:`DeviceSpec.feature_vector` (the device encoder's input; never reorder,
#: only append). CPU meaning / GPU meaning:
#:   clock_ghz       nominal core clock (cpufreq max, else /proc/cpuinfo MHz) / SM boost clock
#:   cores           threads the device runs with / number of SMs
#:   simd_width_bits vector width the *target* can use on this chip (min of chip and target ISA) / warp * 32
#:   l1d_kb          L1 data cache of one core / L1+shared memory of one SM
#:   l2_kb           L2 of one core (one cache instance) / whole L2
#:   l3_kb           L3 of one cache instance (what one thread's cluster shares) / 0
#:   mem_bw_gbs      measured copy bandwidth with `threads` threads, read+write bytes (STREAM convention)
#:   peak_gflops     measured float32 FMA throughput with `threads` threads and the target's ISA
SPEC_FIELDS: tuple[str, ...] = ("clock_ghz", "cores", "simd_width_bits", "l1d_kb", "l2_kb", "l3_kb",
                                "mem_bw_gbs", "peak_gflops")

DEFAULT_TABLE = "datasets/devices.json"

# x86 ISA levels, widest first: (LLVM feature, id label, SIMD bits). The id names the level, not the mcpu,
# because the level is what changes the generated code (haswell and x86-64-v3 both give `llvm-avx2`).
_X86_LEVELS = (("avx512f", "avx512", 512), ("avx2", "avx2", 256), ("avx", "avx", 256),
               ("sse4.2", "sse4", 128), ("sse2", "sse2", 128))
_ARM_LEVELS = (("sve", "sve", 128), ("neon", "neon", 128))
_GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl", "webgpu")


@dataclass
class DeviceSpec:
    """One device: identity (id, hardware, target, threads), numeric specs (:data:`SPEC_FIELDS`) and provenance.

    ``relation`` says in words how it differs from other devices on the same chip, because ids alone do not
    say that ``...-1t/llvm-avx512`` and ``...-2t/llvm-avx512`` share silicon. ``probe`` records how the
    numbers were obtained (method, load average, single-thread peak), so a suspicious number can be judged.
    """

    id: str
    kind: str  # "cpu" or "gpu"
    hardware: str
    target: dict
    threads: int
    clock_ghz: float
    cores: int
    simd_width_bits: int
    l1d_kb: float
    l2_kb: float
    l3_kb: float
    mem_bw_gbs: float
    peak_gflops: float
    relation: str = ""
    measured_at: str = ""
    probe: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # keys written by a newer cdmpp, kept so a re-save loses nothing

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(d.pop("extra"))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceSpec":
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        missing = [n for n in ("id", "kind", "hardware", "target", "threads", *SPEC_FIELDS) if n not in d]
        if missing:
            raise ValueError(f"device spec {d.get('id', '?')!r} lacks {missing}")
        known = {k: v for k, v in d.items() if k in names}
        return cls(**known, extra={k: v for k, v in d.items() if k not in names})

    def feature_vector(self) -> np.ndarray:
        """Raw numeric specs in :data:`SPEC_FIELDS` order (float32); normalizing is the model's job."""
        return np.array([float(getattr(self, f)) for f in SPEC_FIELDS], dtype=np.float32)

    def specs(self) -> dict[str, float]:
        """{spec name: value}, the form the model's device-spec normalizer takes."""
        return {f: float(getattr(self, f)) for f in SPEC_FIELDS}

    def make_target(self):
        """The ``tvm.target.Target`` this device compiles for."""
        from cdmpp.program import tvm_env

        return tvm_env.setup().target.Target(self.target)


# ----------------------------------------------------------------------------------------------- naming

def target_dict(target) -> dict:
    """A JSON-able dict of a target (dict or ``tvm.target.Target``), without derived/empty entries."""
    if isinstance(target, dict):
        d = dict(target)
    else:
        d = _plain(target.export())
    d.pop("keys", None)
    if not d.get("tag"):
        d.pop("tag", None)
    if d.get("host") is not None and not isinstance(d["host"], str):
        d["host"] = target_dict(d["host"])
    return d


def _plain(x):
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "items"):
        return {str(k): _plain(v) for k, v in x.items()}
    if hasattr(x, "export"):  # a nested Target
        return _plain(x.export())
    return [_plain(v) for v in x]


def slugify(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower())).strip("-")


def hardware_slug(model_name: str, mcpu: str | None = None) -> str:
    """Short stable name of a chip: marketing noise dropped, LLVM's cpu name appended.

    ``("AMD EPYC", "znver4")`` → ``amd-epyc-znver4``; ``("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
    "icelake-server")`` → ``intel-xeon-platinum-8375c-icelake-server``. The LLVM name is added because
    VMs often hide the model ("AMD EPYC" here) while LLVM still tells the microarchitecture apart.
    """
    s = model_name.lower()
    s = re.sub(r"\((r|tm)\)", " ", s)
    s = re.sub(r"@\s*[\d.]+\s*[gm]hz", " ", s)
    s = re.sub(r"\b(\d+-core|processor|cpu|with radeon graphics)\b", " ", s)
    s = slugify(s)
    if mcpu and slugify(mcpu) not in s.split("-"):
        s = f"{s}-{slugify(mcpu)}" if s else slugify(mcpu)
    return s or "unknown"


def _get(target: dict, key: str, default=None):
    return target.get(key, target.get(key.replace("-", "_"), default))


def _llvm_triple(target: dict) -> str:
    from cdmpp.program import tvm_env

    tvm_env.setup()
    from tvm.target import codegen

    return _get(target, "mtriple") or codegen.llvm_get_system_triple()


def _validated_llvm(target: dict):
    """The ``tvm.target.Target`` of an llvm target dict; raises if LLVM does not know its mcpu.

    LLVM 22 in TVM only logs an error for an unknown ``mcpu`` and silently compiles generic code, which
    would measure (and name) a different device than asked for.
    """
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    from tvm.target import codegen

    mcpu = _get(target, "mcpu")
    if mcpu and not codegen.llvm_is_valid_cpu(mcpu, _llvm_triple(target)):
        raise ValueError(f"LLVM {codegen.llvm_version_major()} does not know mcpu={mcpu!r} "
                         f"for triple {_llvm_triple(target)}")
    return tvm.target.Target(target)


def isa_level(target) -> tuple[str, int]:
    """(label, SIMD bits) of the widest vector ISA an llvm target may use, asked of TVM's LLVM itself."""
    t = target_dict(target)
    tgt = _validated_llvm(t)
    from tvm.target import codegen

    triple = _llvm_triple(t)
    levels = _ARM_LEVELS if triple.startswith(("aarch64", "arm")) else _X86_LEVELS
    for feature, label, bits in levels:
        if codegen.target_has_features(feature, tgt):
            return label, bits
    return "generic", 64


def target_label(target) -> str:
    """``llvm-avx512``, ``llvm-avx2``, ``cuda-sm90``: target kind plus what changes its code."""
    t = target_dict(target)
    kind = t["kind"]
    if kind == "llvm":
        return f"llvm-{isa_level(t)[0]}"
    arch = _get(t, "arch") or _get(t, "mcpu") or _get(t, "model")
    return f"{kind}-{slugify(str(arch)).replace('-', '')}" if arch else kind


def device_kind(target) -> str:
    return "gpu" if target_dict(target)["kind"] in _GPU_KINDS else "cpu"


def device_id(hardware_slug: str, target, threads: int | None = None) -> str:
    """Stable, readable device id: ``amd-epyc-znver4-2t/llvm-avx512``, ``nvidia-h100/cuda-sm90``.

    CPU ids carry the thread count (latency depends on it); GPU ids do not (a kernel's parallelism is in
    the program). The target part names the ISA level, not the exact mcpu: see :func:`target_label`.
    """
    slug = slugify(hardware_slug)
    label = target_label(target)
    if device_kind(target) == "gpu":
        return f"{slug}/{label}"
    if not threads or int(threads) < 1:
        raise ValueError(f"a CPU device needs threads >= 1, got {threads!r}")
    return f"{slug}-{int(threads)}t/{label}"


def describe_relation(spec: DeviceSpec, others) -> str:
    """In words, how ``spec`` differs from its nearest devices on the same hardware (fewest differences)."""
    mcpu = _get(spec.target, "mcpu")
    found = []
    for o in others:
        if o.hardware != spec.hardware or o.id == spec.id:
            continue
        diffs = []
        if o.threads != spec.threads:
            diffs.append(f"{spec.threads} thread{'s' * (spec.threads != 1)} instead of {o.threads}")
        o_label, s_label = o.id.split("/")[-1], spec.id.split("/")[-1]
        if o_label != s_label:
            diffs.append(f"{s_label.split('-', 1)[-1].upper()} target (mcpu={mcpu}) instead of "
                         f"{o_label.split('-', 1)[-1].upper()} (mcpu={_get(o.target, 'mcpu')})")
        elif _get(o.target, "mcpu") != mcpu:
            diffs.append(f"mcpu={mcpu} instead of {_get(o.target, 'mcpu')} (same ISA level)")
        if diffs:
            found.append((len(diffs), f"same chip as {o.id}, " + ", ".join(diffs)))
    nearest = min((n for n, _ in found), default=0)
    return "; ".join(text for n, text in found if n == nearest)


# ----------------------------------------------------------------------------------------------- probing

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


def probe_local_cpu(threads: int, mcpu: str | None = None, relation: str = "") -> DeviceSpec:
    """Spec of this machine's CPU run with ``threads`` threads and compiled with ``mcpu`` (default: host's).

    Static facts come from /proc/cpuinfo and sysfs; bandwidth and peak are measured (about 1 s, see
    :func:`measure_bandwidth_gbs`, :func:`measure_peak_gflops`). Another busy process lowers both: the
    load average at probe time and the single-thread peak are kept in ``probe`` to tell.
    """
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
    model = info.get("model name") or info.get("Model name") or "unknown cpu"
    slug = hardware_slug(model, host)
    caches = _caches_kb(0)
    t0 = time.perf_counter()
    peak1 = measure_peak_gflops(target, 1) if threads > 1 else None
    peak = measure_peak_gflops(target, threads)
    bw = measure_bandwidth_gbs(threads)
    probe = {"peak": "TVM-compiled float32 FMA loop, Python threads", "bandwidth": "numpy copyto, 128 MiB",
             "seconds": round(time.perf_counter() - t0, 2), "loadavg_1m": os.getloadavg()[0],
             "online_cpus": os.cpu_count(), "cpu_family": info.get("cpu family"), "cpu_model": info.get("model"),
             "chip_simd_bits": chip_bits}
    if peak1 is not None:
        probe["peak_gflops_1t"] = round(peak1, 2)
        if peak < 0.75 * threads * peak1:
            probe["warning"] = (f"{threads}-thread peak is {peak / peak1:.2f}x the 1-thread peak: other processes "
                                "were probably using the cores; re-probe on an idle machine")
    if threads > (os.cpu_count() or 1):
        probe["warning"] = f"{threads} threads on {os.cpu_count()} cpus: oversubscribed"
    return DeviceSpec(
        id=device_id(slug, target, threads), kind="cpu", hardware=f"{model} ({host})", target=target,
        threads=int(threads), clock_ghz=round(_clock_ghz(info), 3), cores=int(threads),
        simd_width_bits=int(min(chip_bits, target_bits)), l1d_kb=caches.get(1, 0.0), l2_kb=caches.get(2, 0.0),
        l3_kb=caches.get(3, 0.0), mem_bw_gbs=round(bw, 2), peak_gflops=round(peak, 2), relation=relation,
        measured_at=_dt.date.today().isoformat(), probe=probe)


# ----------------------------------------------------------------------------------------------- table

class DeviceTable:
    """The device spec table in a JSON file (a list of :class:`DeviceSpec` dicts).

    :meth:`add` writes through at once: several collectors may add devices to one table, so a save first
    re-reads the file and keeps every device it finds there (adding never drops one), then replaces the
    file atomically (tmp file + ``os.replace``) so a crash never leaves half a table.
    """

    def __init__(self, path: str | os.PathLike = DEFAULT_TABLE):
        self.path = Path(path)
        self._specs: dict[str, DeviceSpec] = self._read()

    def _read(self) -> dict[str, DeviceSpec]:
        if not self.path.exists():
            return {}
        with open(self.path) as f:
            data = json.load(f)
        return {d["id"]: DeviceSpec.from_dict(d) for d in data}

    def ids(self) -> list[str]:
        return list(self._specs)

    def get(self, device_id: str) -> DeviceSpec:
        try:
            return self._specs[device_id]
        except KeyError:
            raise KeyError(f"unknown device {device_id!r} in {self.path}; known devices: "
                           f"{', '.join(self._specs) or '(none)'}") from None

    def __contains__(self, device_id: str) -> bool:
        return device_id in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[DeviceSpec]:
        return iter(self._specs.values())

    def add(self, spec: DeviceSpec, save: bool = True) -> DeviceSpec:
        """Add or update (re-probe) ``spec``; fills an empty ``relation`` from the same chip's devices.

        Raises ``ValueError`` if the id is taken by a different hardware or target: an id must name one device.
        """
        old = self._specs.get(spec.id)
        if old is not None and (old.hardware != spec.hardware or old.target != spec.target):
            raise ValueError(f"device id {spec.id!r} already names {old.hardware} / {old.target}, "
                             f"not {spec.hardware} / {spec.target}")
        if not spec.relation:
            spec.relation = describe_relation(spec, self._specs.values())
        self._specs[spec.id] = spec
        if save:
            self.save()
        return spec

    def save(self) -> None:
        on_disk = self._read()
        merged = {**on_disk, **self._specs}
        self._specs = merged
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump([s.to_dict() for s in merged.values()], f, indent=1)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def spec_table(self) -> dict[str, dict[str, float]]:
        """{id: {spec: value}} for the model's device-spec normalizer."""
        return {i: s.specs() for i, s in self._specs.items()}



def main(argv=None) -> int:
    """``python -m cdmpp.devices.spec --threads 2 [--mcpu x86-64-v3]``: probe this CPU and add it to the table.

    Re-probing an existing id replaces its numbers (e.g. after a probe on a busy machine was flagged).
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m cdmpp.devices.spec", description=main.__doc__)
    p.add_argument("--threads", type=int, action="append", help="thread count (repeatable); default all cpus")
    p.add_argument("--mcpu", action="append", help="LLVM cpu (repeatable); default this host's")
    p.add_argument("--table", default=DEFAULT_TABLE)
    args = p.parse_args(argv)
    table = DeviceTable(args.table)
    for mcpu in args.mcpu or [None]:
        for threads in args.threads or [os.cpu_count() or 1]:
            spec = probe_local_cpu(threads, mcpu)
            spec.relation = describe_relation(spec, [s for s in table if s.id != spec.id])
            table.add(spec)
            print(spec.id, {f: getattr(spec, f) for f in SPEC_FIELDS}, spec.probe.get("warning", ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ----------------------------------------------------------------------------------------------- CUDA GPUs

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
