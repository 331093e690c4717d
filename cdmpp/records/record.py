"""``Record``: one line of a dataset, a program measured on a device or a later pass over a stored one.

On disk a record is a JSON object (``cdmpp.records.store``). ``Record.to_dict`` gives exactly the object
written before records were typed: the same keys in the same order, optional keys only where the record
has them (``MISSING`` otherwise: a stored ``"stable": null`` and no ``stable`` at all are different
records), and keys cdmpp does not interpret (an importer's ``source``, a search's ``search``) kept in
``extra``, in their order, after the known ones. ``Record.from_dict(d).to_dict() == d``, key order
included, for every record collected so far (``tests/records/test_record.py`` checks stored ones).

Every writer put the known keys in the order of ``KEYS``: the collectors (``id .. stable``), later passes
(``id, of, device, task, seconds ..``), the MetaSchedule importer (``.. trace, seconds, error, run`` and
its own keys) and the Ansor/AutoTVM importer (``flops, program`` before ``trace``). ``trace`` stays right
before ``seconds``: the store's trace-less reader cuts it out of the text there.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class _Missing:
    """The value of an optional key a record does not have: falsy, a singleton (also when unpickled)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "MISSING"


MISSING = _Missing()


@dataclass(slots=True)
class Record:
    """A measured program (or, with ``of``, a later pass over one). Only ``id`` is required; the collectors
    set every field up to ``stable`` (``cdmpp.measure.results``)."""

    id: str  # "<device>|<task key>|<program hash>", a later pass's with "|pass<N>"
    of: str | _Missing = MISSING  # a later pass: the id of the record it measures again
    device: str | _Missing = MISSING
    task: str | _Missing = MISSING  # the task's workload key (``cdmpp.zoo.tasks``)
    task_name: str | _Missing = MISSING
    networks: list[str] | _Missing = MISSING  # "network@batch" occurrences of the task
    program_hash: str | _Missing = MISSING
    flops: float | _Missing = MISSING  # imported lowered programs: their workload's count
    program: str | _Missing = MISSING  # TVMScript, for imports without a trace (Ansor, AutoTVM)
    trace: list | None | _Missing = MISSING  # the MetaSchedule trace (JSON form) that makes the program
    seconds: list[float] | _Missing = MISSING  # every repeat; empty when it failed
    error: str | None | _Missing = MISSING
    build_s: float | _Missing = MISSING
    others_cpu: float | _Missing = MISSING  # CPU share other processes used while it ran
    disturbed: bool | _Missing = MISSING  # others_cpu >= the quiet share: kept, not a label
    run: str | _Missing = MISSING  # the collection run (``runs.jsonl``)
    measured_at: int | _Missing = MISSING  # seconds since the epoch
    stable: bool | None | _Missing = MISSING  # the fastest repeat was stable (``cdmpp.measure.results.is_stable``)
    extra: dict = field(default_factory=dict)  # keys cdmpp does not interpret, in file order
    remeasures: list[Record] = field(default_factory=list)  # later passes, attached when read; never written

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        """The record of a stored JSON object. Keys that are not fields go to ``extra``; a ``remeasures``
        list (the store's dict reader attaches one) becomes records."""
        if "extra" not in d and "remeasures" not in d:
            try:
                return cls(**d)  # the common case: only known keys
            except TypeError:
                pass
        known, extra = {}, {}
        for k, v in d.items():
            (known if k in _FIELDS else extra)[k] = v
        rec = cls(**known, extra=extra)
        if "remeasures" in extra:
            rec.remeasures = [p if isinstance(p, Record) else cls.from_dict(p) for p in extra.pop("remeasures")]
        return rec

    def to_dict(self) -> dict:
        """The JSON object stored for this record (without ``remeasures``, which are records of their own)."""
        d = {}
        for k in KEYS:
            v = getattr(self, k)
            if v is not MISSING:
                d[k] = v
        if self.extra:
            d.update(self.extra)
        return d

    @property
    def has_trace(self) -> bool:
        return self.trace is not None and self.trace is not MISSING

    @property
    def is_pass(self) -> bool:
        """A later pass over a stored program (``cdmpp remeasure``), not a program of its own."""
        return self.of is not MISSING


KEYS = ("id", "of", "device", "task", "task_name", "networks", "program_hash", "flops", "program", "trace",
        "seconds", "error", "build_s", "others_cpu", "disturbed", "run", "measured_at", "stable")
_FIELDS = frozenset(KEYS)
