"""The record store: appends, sealed parts, quarantined and corrupt lines, superseded records."""

import gzip
import json
import os

from cdmpp.records.store import LoadReport, RecordStore


def _ids(path):
    return [json.loads(ln)["id"] for ln in gzip.open(path, "rt")]


def test_corrupt_lines_are_reported_and_the_rest_loads(tmp_path):
    store = RecordStore(str(tmp_path), seal_every=3)
    recs = [{"id": f"d|t|{i}", "seconds": [1.0], "error": None} for i in range(5)]
    store.append("d", recs[:3])  # sealed into part-0000
    store.append("d", recs[3:])
    active = tmp_path / "d.active.jsonl"
    with open(active, "a") as f:
        f.write("this is not json\n")
        f.write('{"id": "d|t|half", "seconds": [1.')  # a write cut short by a kill
    report = LoadReport()
    ids = [r["id"] for r in store.iter_records(report=report)]
    assert ids == [r["id"] for r in recs]
    assert len(report.problems) == 2 and all("d.active.jsonl:" in p for p in report.problems)
    store.append("d", [{"id": "d|t|5", "seconds": [2.0], "error": None}])  # repairs the tail first
    assert (tmp_path / "d.active.jsonl.partial").read_text().startswith('{"id": "d|t|half"')
    assert len(list(store.iter_records())) == 6

    part = tmp_path / "d.part-0000.jsonl.gz"
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])  # truncated compressed part
    report = LoadReport()
    rest = list(store.iter_records(report=report))
    assert any("part-0000" in p and "truncated" in p for p in report.problems)
    assert {r["id"] for r in rest} >= {"d|t|3", "d|t|4", "d|t|5"}


def test_sealed_parts_are_gzip_json_lines(tmp_path):
    store = RecordStore(str(tmp_path), seal_every=2)
    store.append("dev/x", [{"id": "a"}, {"id": "b"}])
    parts = [p for p in os.listdir(tmp_path) if p.endswith(".jsonl.gz")]
    assert parts == ["dev_x.part-0000.jsonl.gz"]
    lines = gzip.open(tmp_path / parts[0], "rt").read().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["a", "b"]
    assert not (tmp_path / "dev_x.active.jsonl").exists()


def test_a_disturbed_record_is_measured_again_and_superseded(tmp_path):
    store = RecordStore(str(tmp_path))
    store.append("d", [{"id": "d|t|0", "seconds": [9.0], "error": None, "disturbed": True},
                       {"id": "d|t|1", "seconds": [1.0], "error": None, "disturbed": False},
                       {"id": "d|t|2", "seconds": [1.0], "error": None, "others_cpu": 0.3}])  # older format
    assert store.done_ids("d") == {"d|t|1"}  # a resumed collection measures d|t|0 and d|t|2 again
    store.append("d", [{"id": "d|t|0", "seconds": [2.0], "error": None, "disturbed": False},
                       {"id": "d|t|1", "seconds": [5.0], "error": None, "disturbed": False}])
    report = LoadReport()
    got = {r["id"]: r["seconds"] for r in store.iter_records(report=report)}
    assert got == {"d|t|0": [2.0], "d|t|1": [1.0], "d|t|2": [1.0]} and report.duplicates == 2
    assert store.done_ids("d") == {"d|t|0", "d|t|1"}


def test_quarantined_part_then_seal_overwrites_nothing(tmp_path):
    store = RecordStore(str(tmp_path), seal_every=2)
    for k in range(3):  # parts 0000, 0001, 0002
        store.append("d", [{"id": f"d|t|{k}a"}, {"id": f"d|t|{k}b"}])
    parts = sorted(p for p in os.listdir(tmp_path) if ".part-" in p)
    assert parts == [f"d.part-{k:04d}.jsonl.gz" for k in range(3)]
    before = {p: (tmp_path / p).read_bytes() for p in parts}
    # a user moves a corrupt part aside, as the loader's error invites
    os.rename(tmp_path / "d.part-0001.jsonl.gz", tmp_path / "d.part-0001.jsonl.gz.bad")
    store.append("d", [{"id": "d|t|3a"}, {"id": "d|t|3b"}])
    assert _ids(tmp_path / "d.part-0003.jsonl.gz") == ["d|t|3a", "d|t|3b"]
    for p, data in before.items():  # every earlier part (moved or not) byte for byte unchanged
        where = tmp_path / (p + ".bad" if p.endswith("0001.jsonl.gz") else p)
        assert where.read_bytes() == data
    # the quarantined file's number is still taken: the next seal goes after it, not into the gap
    store.append("d", [{"id": "d|t|4a"}, {"id": "d|t|4b"}])
    assert _ids(tmp_path / "d.part-0004.jsonl.gz") == ["d|t|4a", "d|t|4b"]
    assert not (tmp_path / "d.part-0001.jsonl.gz").exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert sorted(r["id"] for r in store.iter_records()) == sorted(
        f"d|t|{k}{x}" for k in (0, 2, 3, 4) for x in "ab")


def test_records_read_without_traces_equal_the_full_records_less_their_trace(tmp_path):
    trace = [[["Annotate", ["b1", "\"SSRSRS\""], ["k\":1,\"seconds\":[9]"], []]], [[0, [1, 2]]]]
    recs = [
        {"id": "d|t|0", "trace": trace, "seconds": [1.0], "error": None},  # the collector's key order
        {"id": "d|t|1", "seconds": [2.0], "trace": trace, "error": None},  # trace after seconds
        {"id": "d|t|2", "trace": [{"seconds": 1}], "networks": ["n@1"], "seconds": [3.0]},  # keys in the trace
        {"id": "d|t|3", "seconds": [4.0]},  # no trace
    ]
    store = RecordStore(str(tmp_path), seal_every=2)
    store.append("d", recs)
    light = list(store.iter_records(traces=False))
    assert light == [{k: v for k, v in r.items() if k != "trace"} for r in recs]


def test_a_corrupt_stream_or_bad_bytes_spoil_only_their_part_or_line(tmp_path):
    """A zlib.error or UnicodeDecodeError used to abort the whole load; now each is reported by file
    (and line) and every other record still loads."""
    store = RecordStore(str(tmp_path), seal_every=2)
    for k in range(3):  # parts 0000-0002
        store.append("d", [{"id": f"d|t|{k}a"}, {"id": f"d|t|{k}b"}])
    part = tmp_path / "d.part-0001.jsonl.gz"
    data = bytearray(part.read_bytes())
    data[12:20] = b"\xff" * 8  # inside the deflate stream: zlib.error ("invalid block type" or the like)
    part.write_bytes(bytes(data))
    with open(tmp_path / "d.active.jsonl", "wb") as f:
        f.write(b'{"id": "d|t|3a"}\n{"id": "d|t|\xff\xfe"}\n{"id": "d|t|3c"}\n')
    report = LoadReport()
    ids = sorted(r["id"] for r in store.iter_records(report=report))
    assert ids == ["d|t|0a", "d|t|0b", "d|t|2a", "d|t|2b", "d|t|3a", "d|t|3c"]
    assert any("d.part-0001.jsonl.gz" in p and "corrupt" in p for p in report.problems), report.problems
    assert any(p.endswith("d.active.jsonl:2: unreadable record (UnicodeDecodeError)") for p in report.problems)
    assert all("d.part-0001.jsonl.gz" in p or "d.active.jsonl:2:" in p for p in report.problems)


def test_a_runs_line_torn_by_a_kill_does_not_swallow_the_next_run(tmp_path):
    store = RecordStore(str(tmp_path))
    store.add_run({"run": "r1", "host": "a"})
    with open(tmp_path / "runs.jsonl", "a") as f:
        f.write('{"run": "r2", "ho')  # the kill
    store.add_run({"run": "r3", "host": "c"})
    assert set(store.runs()) == {"r1", "r3"}
    assert (tmp_path / "runs.jsonl.partial").read_text().startswith('{"run": "r2"')
    with open(tmp_path / "runs.jsonl", "ab") as f:
        f.write(b'{"run": "\xff"}\n')  # bad bytes are skipped, not fatal
    assert set(store.runs()) == {"r1", "r3"}


def test_stale_seal_temporaries_are_removed(tmp_path):
    dead = 2**22 + 12345  # above pid_max's default: no such process
    stale = tmp_path / f".d.seal-{dead}-abc123.tmp"
    stale.write_bytes(b"half a part")
    old = tmp_path / ".d.seal-xyz.tmp"  # an older version's name (no pid), two days old
    old.write_bytes(b"x")
    os.utime(old, (0, 0))
    live = tmp_path / f".d.seal-{os.getpid()}-def456.tmp"  # a seal in progress in a running process
    live.write_bytes(b"x")
    store = RecordStore(str(tmp_path), seal_every=1)
    assert not stale.exists() and not old.exists() and live.exists()
    store.append("d", [{"id": "d|t|0"}])
    assert sorted(r["id"] for r in store.iter_records()) == ["d|t|0"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == [live.name]
