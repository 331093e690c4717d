"""What a measurement record is worth as a label: the passes that count and the fastest repeat."""

from __future__ import annotations

from cdmpp.records.record import Record
from cdmpp.records.store import is_disturbed


def usable(measurement: Record | dict) -> bool:
    """A pass that counts towards a label: it has seconds, no error, and nobody else was busy meanwhile."""
    if isinstance(measurement, Record):
        return bool(measurement.seconds) and not measurement.error and not is_disturbed(measurement)
    return bool(measurement.get("seconds")) and not measurement.get("error") and not is_disturbed(measurement)


def label(record: Record | dict, passes: int | None = None) -> float | None:
    """The latency label of a record: its fastest repeat over its first ``passes`` valid passes (all by
    default; ``cdmpp remeasure`` adds passes); None for failed records and for records measured while
    other processes were busy (kept, not used; ``cdmpp.records.store.is_disturbed``). A stored dict
    (``RecordStore.iter_records``) works as well as a ``Record``."""
    if not usable(record):
        return None
    if isinstance(record, Record):
        valid = [record] + [p for p in record.remeasures if usable(p)]
        return min(min(p.seconds) for p in valid[:passes])
    valid = [record] + [p for p in record.get("remeasures", []) if usable(p)]
    return min(min(p["seconds"]) for p in valid[:passes])
