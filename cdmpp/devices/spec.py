"""Devices: what a latency was measured on, named so that two measurements are comparable iff the names match.

A *device* is hardware + compilation target + thread count: one chip compiled for AVX2 instead
of AVX-512, or run with 1 thread instead of 2, gives different latencies, so each is its own device. A device
carries a few numeric specs (clock, cores, SIMD width, caches, memory bandwidth, peak FLOP/s) that the
model's device encoder reads (:meth:`DeviceSpec.feature_vector`), so an unseen device is not a blank.

The table of known devices lives in ``datasets/devices.json`` (:class:`DeviceTable`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

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

# what physics moves a prediction by, not model inputs: a CPU's reference level, a GPU's level and tensor-core peak
PHYSICS_FIELDS: tuple[str, ...] = ("reference_s", "level_gflops", "tensor_gflops")

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
    # CPU: geometric-mean latency (s) of the reference kernels at 1 thread with this target
    # (``cdmpp.devices.reference``); not a model input: the level a new chip is moved by (physics.chip_ratio)
    reference_s: float | None = None
    # GPU: the FLOP/s its tuned programs reach (``cdmpp.devices.reference.gpu_level_from_labels``); a datasheet
    # peak says little of it (a K80 reaches a third of its peak, a V100 two thirds): what physics.chip_ratio moves by
    level_gflops: float | None = None
    # GPU: dense FP16 tensor-core peak (datasheets); not a model input: how much faster than its FP32 units a
    # program's tensor-core FLOPs run (physics.tensor_time_share)
    tensor_gflops: float | None = None
    relation: str = ""
    measured_at: str = ""
    probe: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # keys written by a newer cdmpp, kept so a re-save loses nothing

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(d.pop("extra"))
        for name in PHYSICS_FIELDS:
            if d[name] is None:  # not measured: the entry reads as before the field existed
                del d[name]
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
        """{spec name: value}, the form the model's device-spec normalizer takes (it reads only
        :data:`SPEC_FIELDS`), with the :data:`PHYSICS_FIELDS` it has."""
        out = {f: float(getattr(self, f)) for f in SPEC_FIELDS}
        for name in PHYSICS_FIELDS:
            if getattr(self, name):
                out[name] = float(getattr(self, name))
        return out

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


def target_kind_of_id(device: str) -> str:
    """The code a device runs, read from its id (``device_id``'s ``<hardware>/<kind>-<isa>``): "cuda" (a GPU),
    else "llvm" (a CPU, and any id that names no kind), as the dataset featurizes its programs."""
    return "cuda" if device.rpartition("/")[2].partition("-")[0] == "cuda" else "llvm"


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


