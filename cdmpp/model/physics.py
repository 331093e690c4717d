"""Amdahl's law per leaf: how a CPU program's latency moves from one thread count to another.

A model trained on one thread count cannot learn what another does to a program (its device input never
varies), so a device running a thread count it never trained on is predicted through the nearest device it
did train on (its *anchor*, ``anchor_device``) and moved there by this law (``TrainedModel.predict``); the
seen-programs baseline ``TwinAmdahl`` moves a measured twin's label the same way. Only the program's
features and the two thread counts enter, plus the fork/join cost of a parallel region on the anchor
(``fork_join_seconds``). A GPU never trained on is reached the same way from the trained GPU closest in
peak FLOP/s, moved by the ratio of the two GPUs' measured levels (or peaks) alone.

Tensor cores are Amdahl's law again, over two kinds of work: the share f of a program's FLOPs done by tensor-core
intrinsics runs ``tensor_speedup`` times faster than on the FP32 units the levels and peaks describe
(``tensor_time_share``). A model learns every label as its FP32-equivalent time (``fp32_equivalent``) and each
prediction is sped up by its device's tensor cores again, so a GPU whose tensor-core programs no trained GPU ran
is still predicted from its spec (reports/gpu-transfer.md, "Tensor cores").
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

import numpy as np

from cdmpp.program.features import FEATURE_NAMES

_OP_COLUMNS = slice(FEATURE_NAMES.index("float_mad"), FEATURE_NAMES.index("int_other_func") + 1)  # log2(x + 1)
_PARALLEL_NUM = FEATURE_NAMES.index("parallel_num")  # parallel loops around the store
_PARALLEL_PROD = FEATURE_NAMES.index("parallel_prod")  # log2(1 + their extent product)


def leaf_parallelism(features) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per leaf of a program's ``ProgramFeatures``: its operations (+ a tiny floor, so an op-free leaf
    still counts), the extent product of its parallel loops, and whether it is under one."""
    r = np.asarray(features.leaf_features, dtype=np.float64)
    if not len(r):
        return np.zeros(0), np.zeros(0), np.zeros(0, bool)
    ops = (np.exp2(r[:, _OP_COLUMNS]) - 1.0).sum(axis=1) + 1e-9
    return ops, np.exp2(r[:, _PARALLEL_PROD]) - 1.0, r[:, _PARALLEL_NUM] > 0


def time_share(leaves: tuple[np.ndarray, np.ndarray, np.ndarray], threads: int) -> float:
    """A program's run time on ``threads`` threads as a share of its 1-thread time, from its
    ``leaf_parallelism``. A parallel loop of extent e runs in ceil(e / threads) rounds, so it is sped up
    e / ceil(e / threads), not ``threads`` times (extent 3 on 2 threads: 1.5x); a leaf whose extent is
    not known is taken as evenly split."""
    ops, extent, par = leaves
    if not len(ops):
        return 1.0
    e = np.maximum(np.round(extent), 1.0)
    speedup = np.where(extent >= 1.0, e / np.ceil(e / threads), float(threads))
    return float((ops / np.where(par, speedup, 1.0)).sum() / ops.sum())


def parallel_share(features: Sequence) -> np.ndarray:
    """``[n, 2]`` per program: the share of its operations (TVM's per-store float and int op counts) in
    leaves under a parallel loop, and the number of such leaves."""
    out = np.zeros((len(features), 2))
    for i, f in enumerate(features):
        ops, _, par = leaf_parallelism(f)
        if len(ops):
            out[i] = (ops * par).sum() / ops.sum(), par.sum()
    return out


def fork_join_seconds(seconds: Sequence[float], features: Sequence, quantile: float = 0.01) -> float:
    """The fork/join cost of one parallel region on a multi-threaded device: the ``quantile`` of its
    programs' latency per parallel leaf (no kernel runs faster than its fork/joins). 0 without any."""
    return _fork_join(seconds, parallel_share(features)[:, 1], quantile)


def _fork_join(seconds: Sequence[float], n_parallel: np.ndarray, quantile: float = 0.01) -> float:
    n = np.asarray(n_parallel, dtype=np.float64)
    per_leaf = np.asarray(seconds, dtype=np.float64)[n > 0] / n[n > 0]
    return float(np.quantile(per_leaf, quantile)) if len(per_leaf) else 0.0


def parallel_leaves(rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per program packed as ``rows`` (program i: ``offsets[i]:offsets[i+1]``, at least one row each), its leaves
    under a parallel loop: ``parallel_share``'s second column, from a pack or a chunk of a feature store."""
    return np.add.reduceat((np.asarray(rows)[:, _PARALLEL_NUM] > 0).astype(np.float64), np.asarray(offsets)[:-1])


def amdahl_seconds(seconds: Sequence[float], features: Sequence, from_threads: int, to_threads: int,
                   fork_join_s: float = 0.0, floor: float = 0.01) -> np.ndarray:
    """Latencies measured (or predicted) on ``from_threads`` threads, moved to ``to_threads`` threads of the
    same kind of core: ``W (1 - f + f / t) + o n`` with W the work, f each leaf's parallel share (cut to
    what its loop extent allows, ``time_share``), n the parallel leaves and ``o`` the fork/join cost,
    paid only when t > 1. The work left after removing fork/joins is at least ``floor`` of the latency."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if from_threads == to_threads:
        return seconds.copy()
    leaves = [leaf_parallelism(f) for f in features]
    n = np.array([float(par.sum()) for _, _, par in leaves])

    def fork_join(threads):
        return fork_join_s * n if threads > 1 else 0.0

    def share(threads):
        return np.array([time_share(leaf, threads) for leaf in leaves])

    work = np.maximum(seconds - fork_join(from_threads), floor * seconds) / share(from_threads)
    return work * share(to_threads) + fork_join(to_threads)


def tensor_speedup(spec: dict) -> float:
    """How much faster a device's tensor cores do their FLOPs than its FP32 units: its tensor-core peak
    (``tensor_gflops``, datasheets) over its FP32 peak; 1 without tensor cores."""
    tensor, peak = spec.get("tensor_gflops"), spec.get("peak_gflops")
    return max(float(tensor) / float(peak), 1.0) if tensor and peak else 1.0


def tensor_time_share(features, spec: dict) -> float:
    """A program's run time on a device as a share of its time on FP32 units alone: ``1 - f + f / s``, f the
    share of its FLOPs in tensor-core intrinsics (``ProgramFeatures.tensor_flops``; None counts as none), s
    ``tensor_speedup``. 1 for a program without tensor-core work or a device without tensor cores."""
    return float(tensor_time_shares([features], [""], {"": spec})[0])


def tensor_time_shares(features: Sequence, devices: Sequence[str], table: dict) -> np.ndarray:
    """``tensor_time_share`` of each program on its device (ones at once where no device has tensor cores: a
    CPU's or a cost model's batch pays nothing per program)."""
    if not any(table.get(d, {}).get("tensor_gflops") for d in set(devices)):
        return np.ones(len(features))
    return tensor_time_shares_of(np.array([f.flops for f in features], dtype=np.float64),
                                 np.array([getattr(f, "tensor_flops", None) or 0.0 for f in features], dtype=np.float64),
                                 devices, table)


def tensor_time_shares_of(flops: np.ndarray, tensor_flops: np.ndarray, devices: Sequence[str], table: dict) -> np.ndarray:
    """``tensor_time_shares`` from columns of FLOPs and tensor-core FLOPs (a feature store's)."""
    speedup = {d: tensor_speedup(table.get(d, {})) if table.get(d, {}).get("tensor_gflops") else 1.0 for d in set(devices)}
    s = np.array([speedup[d] for d in devices], dtype=np.float64)
    f = np.where((tensor_flops > 0) & (flops > 0), np.minimum(tensor_flops / np.where(flops > 0, flops, 1.0), 1.0), 0.0)
    return 1.0 - f + f / s


def fp32_equivalent(labeled: Sequence, table: dict) -> list:
    """Labelled programs with each label divided by its ``tensor_time_share`` on its device: what a model
    learns, the same for a program whichever GPU's tensor cores ran it (unchanged without tensor-core work)."""
    labeled = list(labeled)
    share = tensor_time_shares([s.features for s in labeled], [s.device for s in labeled], table)
    return [s if x == 1.0 else dataclasses.replace(s, seconds=float(s.seconds / x)) for s, x in zip(labeled, share)]


def _parts(device: str) -> tuple[str, str, str]:
    """(hardware, target kind, ISA) of a device id ``<hardware>-<n>t/<kind>-<isa>``."""
    head, _, tail = device.rpartition("/")
    kind, _, isa = tail.partition("-")
    return re.sub(r"-\d+t$", "", head), kind, isa


def anchor_device(device: str, trained: Sequence[str], table: dict, cross_chip: bool = True) -> str | None:
    """The trained device a prediction for ``device`` is made on and moved from by ``move``: None
    (predicted directly) when ``device`` was trained on or cannot be reached from a trained device.

    A chip the model trained on, at a thread count it never ran: the trained CPU device of the same ISA,
    then the same hardware, then the closest thread count (reports/study-issue19.md, round 25); at a
    thread count some trained device ran, directly. A chip it never trained on (``cross_chip``): the
    trained CPU device of the closest thread count, then the same ISA, moved by Amdahl's law and the
    two chips' reference levels or per-thread peaks (``move``), which a network cannot extrapolate from a
    handful of training chips (issue 52; reports/leave-one-chip-out.md). A GPU never trained on: the
    trained GPU closest in peak FLOP/s, moved by their levels' or peaks' ratio (``chip_ratio``)."""
    if device in trained:
        return None
    hardware, kind, isa = _parts(device)
    if kind == "cuda":
        peak = table[device].get("peak_gflops")
        gpus = [d for d in trained if _parts(d)[1] == "cuda" and table[d].get("peak_gflops")]
        if not (cross_chip and peak and gpus):
            return None
        return min(gpus, key=lambda d: (abs(math.log(float(table[d]["peak_gflops"]) / float(peak))), d))
    cpus = [d for d in trained if _parts(d)[1] == "llvm"]
    cores = table[device].get("cores")
    if kind != "llvm" or not cpus or not cores:
        return None
    cores = float(cores)
    new_chip = all(_parts(d)[0] != hardware for d in cpus)
    if new_chip and cross_chip:
        return min(cpus, key=lambda d: (abs(math.log(float(table[d]["cores"]) / cores)), _parts(d)[2] != isa, d))
    if any(float(table[d]["cores"]) == cores for d in cpus):
        return None

    def distance(d):
        h, _, i = _parts(d)
        return i != isa, h != hardware, abs(math.log(float(table[d]["cores"]) / cores)), d

    return min(cpus, key=distance)


def chip_ratio(src: str, dst: str, table: dict, reference: bool = True) -> float:
    """How much longer a program takes per thread on ``dst``'s chip than on ``src``'s (1 between devices of
    one chip): the ratio of their reference kernels' latencies (``reference_s``, measured at 1 thread:
    ``cdmpp.devices.reference``) where both chips have it and ``reference``, else of their per-thread peak
    FLOP/s (clock x SIMD width x FMA units, as probed); between GPUs, of the FLOP/s their tuned programs reach
    (``level_gflops``) where both have it and ``reference``, else of their whole peaks (a kernel spreads over
    every SM): a K80 reaches a third of its datasheet peak, a V100 two thirds (reports/gpu-transfer.md). On
    twins, Zen 4 1-thread labels moved to Zen 5 / Zen 3 / a Xeon by the kernels' ratio are 15 / 40 / 31 %
    MAPE, by the peak ratio 39 / 38 / 49 % (reports/leave-one-chip-out.md)."""
    if _parts(src)[0] == _parts(dst)[0]:
        return 1.0
    s, d = table[src], table[dst]
    if reference and s.get("reference_s") and d.get("reference_s"):
        return float(d["reference_s"]) / float(s["reference_s"])
    if reference and _parts(src)[1] == _parts(dst)[1] == "cuda" and s.get("level_gflops") and d.get("level_gflops"):
        return float(s["level_gflops"]) / float(d["level_gflops"])
    if not all(x.get("peak_gflops") and x.get("cores") for x in (s, d)):
        return 1.0
    if _parts(src)[1] == _parts(dst)[1] == "cuda":
        return float(s["peak_gflops"]) / float(d["peak_gflops"])
    return (float(s["peak_gflops"]) / float(s["cores"])) / (float(d["peak_gflops"]) / float(d["cores"]))


def fork_join_by_device(samples: Sequence, table: dict) -> dict[str, float]:
    """Per CPU device of labelled ``samples``: its ``fork_join_seconds`` (0 on one thread, which forks nothing);
    per GPU, 0 (no CPU threads to fork). What ``TrainedModel.anchors`` keeps, so a device never trained on
    can be reached from these."""
    samples = list(samples)
    return fork_join_of([s.device for s in samples], [s.seconds for s in samples],
                        parallel_share([s.features for s in samples])[:, 1], table)


def fork_join_of(devices: Sequence[str], seconds: Sequence[float], n_parallel: np.ndarray, table: dict) -> dict[str, float]:
    """``fork_join_by_device`` from columns: each program's device, latency and leaves under a parallel loop
    (``parallel_leaves``), so a feature store's programs need not be in memory."""
    devices, seconds, n_parallel = np.asarray(devices), np.asarray(seconds, dtype=np.float64), np.asarray(n_parallel)
    out = {}
    for d in sorted(set(devices.tolist())):
        if _parts(d)[1] == "cuda":
            out[d] = 0.0
        if _parts(d)[1] != "llvm":
            continue
        on = devices == d
        out[d] = _fork_join(seconds[on], n_parallel[on]) if float(table[d]["cores"]) > 1 else 0.0
    return out


def move(seconds: Sequence[float], features: Sequence, from_devices: Sequence[str], to_devices: Sequence[str],
         table: dict, fork_join: dict[str, float]) -> np.ndarray:
    """Each latency on its ``from_devices`` entry moved to its ``to_devices`` entry by ``amdahl_seconds``
    (CPUs) and, between chips, ``chip_ratio`` and the two devices' ``tensor_time_share`` (unchanged where
    the two are the same); the fork/join cost is the anchor's, whichever side it is on."""
    seconds = np.asarray(seconds, dtype=np.float64)
    out = seconds.copy()
    for src, dst in set(zip(from_devices, to_devices)) - {(d, d) for d in to_devices}:
        idx = np.flatnonzero([(a, b) == (src, dst) for a, b in zip(from_devices, to_devices)])
        if _parts(src)[1] == "llvm":  # a GPU's "cores" are SMs, which no thread count splits work over
            out[idx] = amdahl_seconds(seconds[idx], [features[i] for i in idx], int(table[src]["cores"]),
                                      int(table[dst]["cores"]), fork_join.get(src, fork_join.get(dst, 0.0)))
        sub = [features[i] for i in idx]
        tensor = tensor_time_shares(sub, [dst] * len(sub), table) / tensor_time_shares(sub, [src] * len(sub), table)
        out[idx] *= chip_ratio(src, dst, table) * tensor
    return out


def on_anchors(labeled: Sequence, anchor_of, table: dict, fork_join: dict[str, float]) -> list:
    """Labelled programs (``LabeledProgram``), those of a device with an anchor (``anchor_of(device)``)
    moved to it by Amdahl's law run backwards: what a model predicting through the anchor learns from."""
    labeled = list(labeled)
    anchors = [anchor_of(s.device) or s.device for s in labeled]
    seconds = move([s.seconds for s in labeled], [s.features for s in labeled], [s.device for s in labeled],
                   anchors, table, fork_join)
    return [s if a == s.device else dataclasses.replace(s, device=a, seconds=float(x))
            for s, a, x in zip(labeled, anchors, seconds)]
