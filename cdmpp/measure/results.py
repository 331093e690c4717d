"""What a measurement pass writes: the fields of a record (or of a later pass), whether its fastest repeat
was stable, and the provenance of the run that measured it."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time

from cdmpp.devices.guard import cpu_model
from cdmpp.measure.measurer import MeasureConfig
from cdmpp.program import tvm_env
from cdmpp.records.record import Record
from cdmpp.records.store import record_id


def measurement_fields(secs: list, err: str | None, build_s: float, others: float, cfg: MeasureConfig, run_id: str) -> dict:
    """The fields every measurement record has, first pass or later one."""
    return {"seconds": secs, "error": err, "build_s": round(build_s, 3), "others_cpu": round(others, 3),
            "disturbed": others >= cfg.quiet_share, "run": run_id, "measured_at": round(time.time())}


def program_record(device_id: str, task, program_hash: str, trace, secs: list, err: str | None, build_s: float,
                   others: float, cfg: MeasureConfig, run_id: str, **extra) -> Record:
    """The record of a program of ``task`` (``cdmpp.zoo.tasks.Task``) measured for the first time on the
    device; ``extra``: keys of its own (a searched candidate's ``search``), stored after the others."""
    return Record(id=record_id(device_id, task.key, program_hash), device=device_id, task=task.key,
                  task_name=task.name, networks=sorted(task.occurrences), program_hash=program_hash, trace=trace,
                  **measurement_fields(secs, err, build_s, others, cfg, run_id),
                  stable=is_stable(secs, cfg) if secs else None, extra=extra)


def pass_record(of: Record, n: int, device_id: str, secs: list, err: str | None, build_s: float, others: float,
                cfg: MeasureConfig, run_id: str) -> Record:
    """A later measurement (pass ``n``) of the stored record ``of`` (``cdmpp remeasure``)."""
    return Record(id=f"{of.id}|pass{n}", of=of.id, device=device_id, task=of.task,
                  **measurement_fields(secs, err, build_s, others, cfg, run_id))


def run_provenance(device, target, cfg: MeasureConfig, rpc, **extra) -> dict:
    """What a run entry in ``runs.jsonl`` says about the machine, the software and the settings."""
    tvm = tvm_env.setup()
    return {
        "device": device.id, "cpu_model": cpu_model(), "cores": os.cpu_count(), "threads": device.threads,
        "target": str(target), "tvm_version": tvm.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(), "measure": dataclasses.asdict(cfg),
        "rpc": f"{rpc[0]}:{rpc[1]}/{rpc[2]}" if rpc else None, "command": " ".join(sys.argv), **extra,
    }

def is_stable(secs: list[float], cfg: MeasureConfig) -> bool | None:
    """Whether a pass's fastest repeat was stable (the fast measurer's stopping rule held): it came before
    the last ``stable_patience`` repeats, or they beat it by no more than ``stable_tol``. None when the
    pass has too few repeats to tell (slow programs: their few long repeats vary little). Kernels of one
    call per repeat follow ``min_repeats_long`` (``cdmpp.measure.fast.adaptive_repeats``)."""
    need, patience = cfg.min_repeats, cfg.stable_patience
    if min(secs) >= cfg.min_repeat_ms / 1e3:
        need = cfg.min_repeats_long
        patience = max(1, min(patience, need - 1))
    if len(secs) < max(need, patience + 1):
        return None
    head = min(secs[:-patience])
    return min(secs) >= head * (1 - cfg.stable_tol)
