"""``Measurer``: what measures a task's programs on a device, and its settings (``MeasureConfig``).

Like MetaSchedule's ``runner.py``, this file holds the interface; each implementation has a file of its
own: ``cdmpp.measure.fast`` (``"fast"``: one module per task, one long-lived runner process, adaptive
repeats; the default) and ``cdmpp.measure.metaschedule`` (``"metaschedule"``: MetaSchedule's
``LocalBuilder`` and ``LocalRunner``/``RPCRunner``; remote devices, cache flushing, kept artifacts).
``Measurer.create(kind, ...)`` picks one by name. Both measure only on a quiet machine
(``cdmpp.devices.guard``), pause while a ``PAUSE`` file exists and stop cleanly (``cdmpp.measure.stop``).

A measurer takes *jobs*, one task's programs each: a dict with ``task_key``, ``mod_json`` (the task's
workload), either ``traces`` (stored programs to measure again elsewhere: twins) or ``n`` and ``seed``
(random schedules to draw), and ``skip`` (program hashes already stored). It yields each job with a
``Result`` per program, or with an error string when the job failed as a whole; the collector
(``cdmpp.measure.campaigns.collect``) turns results into records (``cdmpp.measure.results``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, NamedTuple

SKIP_AFTER_TIMEOUTS = 2  # programs of one task that timed out in a batch before its others are skipped


@dataclass
class MeasureConfig:
    repeat: int = 15
    min_repeat_ms: int = 15
    number: int = 1
    cache_flush: bool = False
    build_timeout_s: float = 60.0
    run_timeout_s: float = 30.0
    kill_grace_s: float = 10.0  # past run_timeout_s, the collector kills a runner worker that did not stop
    run_budget_s: float = 2.0  # seconds of repeats per program: slower programs get fewer (run_within_budget)
    builders: int = 2
    quiet_share: float = 0.05  # max CPU share (of all cores) other processes may use while we measure
    max_tries: int = 10
    max_wait_s: float = 1800.0
    # adaptive repeats (the fast measurer, ``cdmpp.measure.fast``): stop once the fastest repeat has not
    # improved by more than ``stable_tol`` for ``stable_patience`` repeats, after at least ``min_repeats``
    min_repeats: int = 5
    stable_tol: float = 0.01
    stable_patience: int = 3
    # kernels that fill a repeat with one call (>= min_repeat_ms): at least this many repeats, the probe
    # included, and a patience of at most one fewer (their repeats vary little; each costs a whole call)
    min_repeats_long: int = 3
    # fast measurer with overlap: one more build worker on the runner's cores, stopped while programs run
    idle_builder: bool = True


@dataclass
class Built:
    """One program of a job after its build: where its code is, or why it has none. ``program_hash`` is
    empty for a trace that no longer applies (nothing to key a record by)."""

    task: str
    program_hash: str
    trace: object  # JSON value of the MetaSchedule trace
    so: str | None = None  # fast measurer: the task's shared library ...
    fname: str | None = None  # ... and this program's function in it
    args: list = field(default_factory=list)  # [(dtype, shape)] of the PrimFunc's buffers
    error: str | None = None
    build_s: float = 0.0
    cpu_s: float = 0.0  # its share of the build job's CPU seconds (sampling, lowering, LLVM, linking)


class Result(NamedTuple):
    """One program's measurement: every repeat's seconds (empty when it failed), the error, and the CPU
    share other processes used while its batch ran."""

    program: Built
    seconds: list[float]
    error: str | None
    others_cpu: float


class Measurer(ABC):
    """Measures jobs of programs; ``close`` (or ``with``) ends its processes and removes what it built."""

    kind: str = ""  # the name ``create`` knows it by, stored in a run's provenance
    on_wait: Callable[[float, str], None] | None = None  # (seconds waited, what for) while waiting
    skipped: int = 0  # programs of the jobs left out because they are stored already (``skip``)
    times: dict[str, float]  # seconds spent per phase (waits for builds, a quiet machine, pauses; runs)

    @staticmethod
    def create(kind: str, target, cfg: MeasureConfig, threads: int, pause_dir: str | None = None,
               overlap: bool | None = None, rpc: tuple[str, int, str] | None = None, device_id: str | None = None,
               artifact_dir: str | None = None, batch_size: int = 32) -> Measurer:
        """``"fast"`` or ``"metaschedule"``: the measurer of that name, with the settings it takes."""
        if kind == "fast":
            from cdmpp.measure.fast import FastMeasurer

            if rpc or cfg.cache_flush:
                raise ValueError("the fast measurer runs locally without cache flushing: drop "
                                 "--rpc-tracker/--cache-flush or use the MetaSchedule measurer")
            return FastMeasurer(target, cfg, threads, pause_dir=pause_dir, overlap=overlap)
        if kind == "metaschedule":
            import os

            from cdmpp.measure.metaschedule import MetaScheduleMeasurer

            return MetaScheduleMeasurer(target, cfg, rpc, pause_flag=os.path.join(pause_dir, "PAUSE") if pause_dir else None,
                                        artifact_dir=artifact_dir, device_id=device_id, batch_size=batch_size)
        raise ValueError(f"unknown measurer {kind!r}: expected 'fast' or 'metaschedule'")

    @abstractmethod
    def measure_jobs(self, jobs: Iterable[dict]) -> Iterator[tuple[dict, list[Result] | str]]:
        """Each job with its programs' results (or the reason it failed as a whole), as they finish."""

    def provenance(self) -> dict:
        """What a run's entry (``runs.jsonl``) says about this measurer."""
        return {"measurer": self.kind}

    @abstractmethod
    def close(self) -> None:
        """Stop its processes and remove what it built."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
