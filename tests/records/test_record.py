"""The typed record: stored records read as ``Record``s and written back are the same bytes."""

import gzip
import json
import os
import shutil

import pytest

from cdmpp.records.labels import label
from cdmpp.records.record import MISSING, Record
from cdmpp.records.store import LoadReport, RecordStore

DATASET = os.path.join(os.path.dirname(__file__), "..", "..", "datasets", "measurements")


def _stored_lines(per_file: int = 12) -> list[str]:
    """A few hundred real stored lines: the first ``per_file`` of every part file (every device, every
    writer that has written a part: collectors, later passes, importers)."""
    if not os.path.isdir(DATASET):
        pytest.skip("no datasets/measurements in this checkout")
    lines = []
    for name in sorted(os.listdir(DATASET)):
        if ".part-" in name and name.endswith(".jsonl.gz"):
            with gzip.open(os.path.join(DATASET, name), "rt") as f:
                for _, line in zip(range(per_file), f):
                    lines.append(line.rstrip("\n"))
    return lines


def test_stored_records_round_trip_exactly():
    lines = _stored_lines()
    assert len(lines) >= 300
    kinds = set()
    for line in lines:
        d = json.loads(line)
        rec = Record.from_dict(d)
        out = rec.to_dict()
        assert out == d and list(out) == list(d)  # same keys, values and order
        assert json.dumps(out, separators=(",", ":")) == line  # the bytes the store writes
        kinds.add((rec.is_pass, bool(rec.extra), rec.stable is MISSING))
    assert len(kinds) >= 4  # passes, importer extras, records with and without ``stable``


def test_the_store_writes_records_as_it_wrote_dicts(tmp_path):
    lines = _stored_lines(per_file=3)
    a, b = RecordStore(str(tmp_path / "dicts")), RecordStore(str(tmp_path / "records"))
    a.append("d", [json.loads(x) for x in lines])
    b.append("d", [Record.from_dict(json.loads(x)) for x in lines])
    assert (tmp_path / "dicts" / "d.active.jsonl").read_bytes() == (tmp_path / "records" / "d.active.jsonl").read_bytes()
    assert (tmp_path / "records" / "d.active.jsonl").read_text().splitlines() == lines


def test_typed_and_dict_readers_agree(tmp_path):
    """``records`` and ``iter_records`` keep the same records, passes attached, with the same labels,
    on a copy of one device's stored parts (traces left out, as the dataset loader reads)."""
    if not os.path.isdir(DATASET):
        pytest.skip("no datasets/measurements in this checkout")
    parts = sorted(n for n in os.listdir(DATASET) if n.startswith("amd-epyc-znver4-1t_llvm-avx512.part-"))[:6]
    for n in parts:
        shutil.copyfile(os.path.join(DATASET, n), tmp_path / n)
    store = RecordStore(str(tmp_path))
    r1, r2 = LoadReport(), LoadReport()
    dicts, recs = list(store.iter_records(report=r1, traces=False)), list(store.records(report=r2, traces=False))
    assert (r1.records, r1.duplicates, r1.remeasures) == (r2.records, r2.duplicates, r2.remeasures)
    assert len(dicts) == len(recs) > 1000
    for d, r in zip(dicts, recs):
        assert r.to_dict() == {k: v for k, v in d.items() if k != "remeasures"}
        assert [p.to_dict() for p in r.remeasures] == d.get("remeasures", [])
        assert label(r) == label(d) and label(r, passes=1) == label(d, passes=1)
    assert sum(bool(r.remeasures) for r in recs) > 0


def test_unknown_keys_are_kept_in_order_and_missing_ones_stay_missing():
    d = {"id": "x", "seconds": [1.0], "error": None, "zeta": 1, "search": {"trial": 3}, "stable": None}
    rec = Record.from_dict(d)
    assert rec.extra == {"zeta": 1, "search": {"trial": 3}} and rec.stable is None and rec.device is MISSING
    assert list(rec.to_dict()) == ["id", "seconds", "error", "stable", "zeta", "search"]
    assert Record(id="y").to_dict() == {"id": "y"}
    assert not MISSING and repr(MISSING) == "MISSING"
