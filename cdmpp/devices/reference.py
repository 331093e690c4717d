"""Reference kernels: a chip's speed measured on tensor programs, not on an FMA loop.

The per-thread peak FLOP/s ratio of two chips moves few programs right: most time goes to programs far from
the peak, so Zen 5 (2.3x Zen 4's per-thread peak) runs Zen 4's programs at 0.73x its time, not 0.44x, and an
Intel Xeon with twice Zen 4's peak at 1.0x (reports/leave-one-chip-out.md). The geometric-mean latency of
16 fixed programs of the core set (``reference_kernels.json``), run with one thread and the device's
target, is a measured spec (``DeviceSpec.reference_s``) whose ratio between two chips
(``cdmpp.model.physics.chip_ratio``) is the level a new chip's predictions are moved by.
``cdmpp devices probe --add`` measures it on this machine (``measure_reference_s``); for a device measured
by the collector it comes from the labels of its chip's 1-thread device (``reference_from_labels``), which
are the same measurement. The kernels are excluded from the test sets that judge the transfer.

A GPU's level is measured on its own tuned programs instead (``gpu_level_from_labels``: ``level_gflops``, the
FLOP/s a fixed tenth of them reach), since GPUs of other people's logs share no program set; its ratio between two
GPUs moves a new GPU's predictions (reports/gpu-transfer.md), and those programs leave its test sets likewise.
"""

from __future__ import annotations

import functools
import json
import math
import os

KERNELS_FILE = os.path.join(os.path.dirname(__file__), "reference_kernels.json")


@functools.lru_cache(maxsize=1)
def kernels() -> tuple[dict, ...]:
    """The reference kernels: each a dict with ``task`` (key of the task table), ``program_hash``, ``trace``."""
    with open(KERNELS_FILE, encoding="utf-8") as f:
        return tuple(json.load(f)["kernels"])


def kernel_hashes() -> frozenset[str]:
    return frozenset(k["program_hash"] for k in kernels())


def geometric_mean_s(seconds: dict[str, float]) -> float | None:
    """The reference level from each kernel's latency; None unless every kernel has a positive one (a level
    over a subset would not compare with another chip's)."""
    values = [seconds.get(h) for h in kernel_hashes()]
    if not all(v is not None and v > 0 and math.isfinite(v) for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def measure_reference_s(mcpu: str, task_table: str | None = None, cfg=None,
                        only: frozenset[str] | None = None) -> dict[str, float]:
    """Each reference kernel's latency (its fastest repeat, as a label) on this machine with one thread and
    ``mcpu``, measured by the collector's fast measurer (``cdmpp.measure.fast``); kernels that fail, or whose
    trace no longer gives the program it names, are left out. About half a minute. ``only``: those hashes."""
    from cdmpp import defaults
    from cdmpp.measure.measurer import MeasureConfig, Measurer
    from cdmpp.program import tvm_env
    from cdmpp.zoo.tasks import TaskTable

    tasks = TaskTable.load(task_table or defaults.TASK_TABLE)
    target = tvm_env.make_target("llvm", num_cores=1, mcpu=mcpu)
    jobs = [{"task_key": k["task"], "mod_json": tasks[k["task"]].mod_json, "traces": [k["trace"]], "skip": frozenset()}
            for k in kernels() if only is None or k["program_hash"] in only]
    wanted = kernel_hashes() if only is None else kernel_hashes() & only
    out = {}
    with Measurer.create("fast", target, cfg or MeasureConfig(), 1) as m:
        for _, results in m.measure_jobs(jobs):
            if isinstance(results, str):
                continue
            for built, seconds, error, _ in results:
                if not error and seconds and built.program_hash in wanted:
                    out[built.program_hash] = min(seconds)
    return out


def reference_from_labels(store, device: str) -> dict[str, float]:
    """The reference kernels' labels on ``device`` in a ``RecordStore`` (what the collector measured)."""
    from cdmpp.records.labels import label

    wanted = kernel_hashes()
    out = {}
    for r in store.iter_records(device, traces=False):
        if r["program_hash"] in wanted and (y := label(r)) is not None:
            out[r["program_hash"]] = y
    return out


def levels_from_labels(table, store) -> dict[str, dict]:
    """For each CPU device of ``table`` (a ``DeviceTable``) without ``reference_s``: the reference level its
    chip's 1-thread device of the same target label has in ``store`` (every kernel labelled), as
    ``{device: {"reference_s", "from", "kernel_s"}}``. Devices of one chip and ISA share the level: it is
    measured at 1 thread whatever the device's thread count (as ``cdmpp devices probe --reference`` does)."""
    out, cache = {}, {}
    for spec in table:
        if spec.kind != "cpu" or spec.reference_s:
            continue
        label_ = spec.id.rpartition("/")[2]
        for src in table:
            if src.hardware == spec.hardware and src.threads == 1 and src.id.rpartition("/")[2] == label_:
                if src.id not in cache:
                    cache[src.id] = reference_from_labels(store, src.id)
                level = geometric_mean_s(cache[src.id])
                if level:
                    out[spec.id] = {"reference_s": level, "from": src.id, "kernel_s": cache[src.id]}
                break
    return out


LEVEL_SHARE = 10  # one of every LEVEL_SHARE of a GPU's programs (by hash) measures its level
LEVEL_QUANTILE = 0.9  # the level: the FLOP/s its level programs reach at this quantile
MIN_LEVEL_PROGRAMS = 50


def is_level_program(program_hash: str) -> bool:
    """Whether a GPU's program is one its level is measured on (``gpu_level_from_labels``): a fixed tenth by
    hash, which leave-one-chip-out keeps out of the chip's test set as it keeps the CPU kernels out."""
    return int(program_hash[:8], 16) % LEVEL_SHARE == 0


def gpu_level_from_labels(store, device: str) -> dict | None:
    """A GPU's measured level from its labelled programs in a ``RecordStore``: the FLOP/s its level programs
    (``is_level_program``) reach at the 90th percentile, as ``{"level_gflops", "programs"}``; None with fewer
    than 50 of them. Meant for tuned programs (a tuning log, a MetaSchedule database): what the chip reaches
    there is its level, while random schedules measure the sampler as much as the chip."""
    from cdmpp.records.labels import label

    rates = []
    for r in store.iter_records(device, traces=False):
        flops = float(r.get("flops") or 0.0)
        if flops > 0 and is_level_program(r["program_hash"]) and (y := label(r)) is not None and y > 0:
            rates.append(flops / y / 1e9)
    if len(rates) < MIN_LEVEL_PROGRAMS:
        return None
    rates.sort()
    return {"level_gflops": rates[min(len(rates) - 1, int(LEVEL_QUANTILE * len(rates)))], "programs": len(rates)}
