"""What a measurement record is worth as a label: the passes that count and the fastest repeat."""

from __future__ import annotations

from cdmpp.records.store import is_disturbed


def usable(measurement: dict) -> bool:
    """A pass that counts towards a label: it has seconds, no error, and nobody else was busy meanwhile."""
    return bool(measurement.get("seconds")) and not measurement.get("error") and not is_disturbed(measurement)


def label(record: dict, passes: int | None = None) -> float | None:
    """The latency label of a record: its fastest repeat over its first ``passes`` valid passes (all by
    default; ``cdmpp remeasure`` adds passes); None for failed records and for records measured while
    other processes were busy (kept, not used; ``cdmpp.records.store.is_disturbed``)."""
    if not usable(record):
        return None
    valid = [record] + [p for p in record.get("remeasures", []) if usable(p)]
    return min(min(p["seconds"]) for p in valid[:passes])
