"""``cdmpp import metaschedule`` of a SQLite database (mshr-h/metaschedule_sqlitedatabase's schema): the same
records as the JSON database it was written from; bad rows reported; a re-import adds nothing."""

import json
import sqlite3

from tests.data import TASKS
from tests.records.test_import_metaschedule import _import


def _json_db(path):
    """A small JSON database over a zoo matmul: 3 sampled schedules' tuning records."""
    from cdmpp.program import tvm_env

    tvm_env.setup()
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.measure.schedules import sample_schedules
    from cdmpp.zoo.tasks import TaskTable, load_task_mod

    task = min((t for t in TaskTable.load(str(TASKS)) if "matmul" in t.name), key=lambda t: len(t.mod_json))
    mod, target = load_task_mod(task), tvm_env.make_target("llvm", num_cores=2)
    path.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(path))
    wl = db.commit_workload(mod)
    for i, sch in enumerate(sample_schedules(mod, target, 3, seed=0)):
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, [2e-5 * (i + 1), 1e-5 * (i + 1)], target,
                                                         ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def _to_sqlite(src, dst, bad_row=False):
    """The JSON database's lines as that schema's rows (each column one JSON value, as its SQLiteDatabase writes)."""
    dst.mkdir()
    con = sqlite3.connect(dst / "database_workload.sqlite")
    con.execute("CREATE TABLE workload(shash text, mod text)")
    for line in (src / "database_workload.json").read_text().splitlines():
        con.execute("INSERT INTO workload VALUES (?, ?)", json.loads(line))
    con.commit()
    con = sqlite3.connect(dst / "database_tuning_record.sqlite")
    con.execute("CREATE TABLE tuning_record(workload_index int, trace text, run_secs text, target text, args_info text)")
    rows = [json.loads(x) for x in (src / "database_tuning_record.json").read_text().splitlines()]
    for widx, rec in rows:
        con.execute("INSERT INTO tuning_record VALUES (?, ?, ?, ?, ?)", [widx, *map(json.dumps, rec)])
    if bad_row:  # the schema's writer stores a missing run_secs as Python's repr
        con.execute("INSERT INTO tuning_record VALUES (0, ?, 'None', ?, ?)", [json.dumps(rows[0][1][i]) for i in (0, 2, 3)])
    con.commit()
    return len(rows)


def test_sqlite_database_imports_as_its_json_form(tmp_path):
    from cdmpp.records.store import RecordStore

    _json_db(tmp_path / "json")
    n = _to_sqlite(tmp_path / "json", tmp_path / "sql", bad_row=True)
    a = _import(tmp_path / "json", tmp_path / "ds-json")
    b = _import(tmp_path / "sql", tmp_path / "ds-sql")
    assert a["added"] == b["added"] == n and a["errors"] == 0
    assert b["unreadable"] == 1 and b["problems"][0].startswith(f"{tmp_path / 'sql' / 'database_tuning_record.sqlite'}:{n + 1}:")
    keep = ("id", "task", "program_hash", "trace", "seconds", "target", "ms_key")
    mine, theirs = ({r["id"]: {k: r[k] for k in keep} for r in RecordStore(str(tmp_path / d)).iter_records()}
                    for d in ("ds-json", "ds-sql"))
    assert mine == theirs
    assert RecordStore(str(tmp_path / "ds-sql")).runs()[b["run"]]["imported"]["format"] == "metaschedule-sqlite"
    again = _import(tmp_path / "sql", tmp_path / "ds-sql")
    assert again["added"] == 0 and again["already_present"] == n and again["run"] is None


def test_not_a_database_is_named(tmp_path):
    import pytest

    from cdmpp.records.importers import _database_lines

    (tmp_path / "database_workload.sqlite").write_bytes(b"not sqlite")
    (tmp_path / "database_tuning_record.sqlite").write_bytes(b"not sqlite")
    with pytest.raises(FileNotFoundError, match="not a MetaSchedule SQLite database"):
        _database_lines(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a MetaSchedule database"):
        _database_lines(str(tmp_path / "nothing"))


def test_old_traces_are_renamed():
    """TVM <= 0.19's traces (the SQLite database was tuned with 0.15): GetBlock and a one-attribute Split."""
    from cdmpp.records.importers import _upgrade_trace

    old = [[["GetBlock", [], ["C", "main"], ["b0"]], ["Split", ["l1", "v2", "v3"], [1], ["l4", "l5"]]], []]
    assert _upgrade_trace(old) == [[["GetSBlock", [], ["C", "main"], ["b0"]],
                                    ["Split", ["l1", "v2", "v3"], [1, False], ["l4", "l5"]]], []]
    new = [[["GetSBlock", [], ["C", "main"], ["b0"]], ["Split", ["l1", "None", 8], [True, False], ["l4", "l5"]]], []]
    assert _upgrade_trace(new) is new and _upgrade_trace("junk") == "junk"
