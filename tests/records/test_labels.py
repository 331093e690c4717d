"""Labels: the fastest repeat over the passes that count."""

from cdmpp.records.store import LoadReport, RecordStore


def test_later_passes_attach_to_their_record_and_lower_its_label(tmp_path):
    from cdmpp.records.labels import label

    store = RecordStore(str(tmp_path))
    store.append("d", [{"id": "d|t|0", "seconds": [3.0, 2.0], "error": None, "disturbed": False},
                       {"id": "d|t|1", "seconds": [], "error": "run: boom", "disturbed": False}])
    store.append("d", [{"id": "d|t|0|pass2", "of": "d|t|0", "seconds": [1.5], "error": None, "disturbed": False},
                       {"id": "d|t|0|pass3", "of": "d|t|0", "seconds": [0.1], "error": None, "disturbed": True},
                       {"id": "d|t|0|pass4", "of": "d|t|0", "seconds": [], "error": "run: x", "disturbed": False},
                       {"id": "d|t|9|pass2", "of": "d|t|9", "seconds": [1.0], "error": None, "disturbed": False}])
    report = LoadReport()
    recs = {r["id"]: r for r in store.iter_records(report=report)}
    assert set(recs) == {"d|t|0", "d|t|1"} and report.records == 2 and report.remeasures == 4
    assert label(recs["d|t|0"]) == 1.5 and label(recs["d|t|0"], passes=1) == 2.0  # disturbed/failed passes ignored
    assert label(recs["d|t|1"]) is None and store.done_ids("d") == {"d|t|0", "d|t|1"}
