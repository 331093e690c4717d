"""``cdmpp import metaschedule``: a real ``ms.tune_tir`` database (a 64x64x64 matmul, 16 trials) becomes
records whose programs replay, whose hashes and labels are the collector's, and a model adapts from them."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from cdmpp.model.kinds import is_checkpoint
from tests.data import DEVICES_JSON, TASKS

DEVICE = "amd-epyc-znver4-2t/llvm-avx512"  # in the device table and the shipped model
TRIALS = 16


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A MetaSchedule JSON database folder written by ``ms.tune_tir`` (2 threads)."""
    from cdmpp.program import tvm_env

    tvm_env.setup(2)
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.bench.tune import unnamed_handlers_aside
    from cdmpp.zoo import workloads

    work_dir = str(tmp_path_factory.mktemp("msdb"))
    before = {n: list(lg.handlers) for n, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    try:
        with unnamed_handlers_aside():
            ms.tune_tir(workloads.matmul(64, 64, 64), tvm_env.make_target("llvm", num_cores=2), work_dir,
                        max_trials_global=TRIALS, num_trials_per_iter=TRIALS, num_tuning_cores=2, seed=0,
                        builder=ms.builder.LocalBuilder(max_workers=2, timeout_sec=60,
                                                        initializer=tvm_env.worker_initializer),
                        runner=ms.runner.LocalRunner(timeout_sec=30, initializer=tvm_env.worker_initializer,
                                                     evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=3)),
                        strategy=ms.search_strategy.EvolutionarySearch(population_size=32, init_min_unmeasured=16,
                                                                       genetic_num_iters=1))
    finally:  # tune_tir's file handlers under work_dir (see conftest's restore_logging)
        for n, lg in list(logging.Logger.manager.loggerDict.items()):
            if isinstance(lg, logging.Logger):
                for h in [h for h in lg.handlers if h not in before.get(n, [])]:
                    lg.removeHandler(h)
                    h.close()
    # a trial that timed out on a loaded machine is stored as a failed run ([1e10] s), which an import skips
    # (test_bad_lines_are_reported_and_skipped): the tests below read a database of measured trials only
    path = Path(work_dir) / "database_tuning_record.json"
    lines = path.read_text().splitlines()
    measured = [x for x in lines if max(json.loads(x)[1][1] or [1e10]) < 1e9]
    if len(measured) < TRIALS - 4:
        pytest.skip(f"the machine is too loaded: {len(lines) - len(measured)} of {len(lines)} trials failed")
    path.write_text("".join(x + "\n" for x in measured))
    return work_dir


def _trials(db) -> int:
    return len((Path(db) / "database_tuning_record.json").read_text().splitlines())


def _import(db, ds, **kw):
    from cdmpp.devices.table import DeviceTable
    from cdmpp.records.importers import import_metaschedule
    from cdmpp.zoo.tasks import TaskTable

    return import_metaschedule(str(db), str(ds), DEVICE, TaskTable.load(str(TASKS)), DeviceTable(DEVICES_JSON), **kw)


def _lines(path):
    return path.read_text().splitlines()


def _plain(obj):
    from cdmpp.program.inputs import to_json_value

    return to_json_value(obj)


@pytest.mark.slow  # the database's tuning takes ~40 s here
def test_every_record_replays_with_its_run_secs_and_label(tuned, tmp_path, monkeypatch):
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.program.features import program_hash
    from cdmpp.program.inputs import apply_trace
    from cdmpp.records.dataset import load_dataset
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable, task_key

    ds = tmp_path / "ds"
    r = _import(tuned, ds, ids_out=str(tmp_path / "ids.txt"))
    assert r["added"] == _trials(tuned) and r["errors"] == 0 and r["spec"] and r["new_workloads"] == 1, r
    recs = {x["id"]: x for x in RecordStore(str(ds)).iter_records(DEVICE)}
    assert len(recs) == _trials(tuned) and sorted(_lines(tmp_path / "ids.txt")) == sorted(recs)
    # MetaSchedule's own reading of the database, against every record
    db = ms.database.JSONDatabase(work_dir=tuned, allow_missing=False)
    theirs = db.get_all_tuning_records()
    assert len(theirs) == _trials(tuned)
    for tr in theirs:
        wl = tr.workload.mod
        h = program_hash(apply_trace(wl, _plain(tr.trace.as_json())))
        rec = recs[f"{DEVICE}|{task_key(wl)}|{h}"]
        assert rec["task"] == task_key(wl) and rec["task_name"] == "matmul" and rec["networks"] == []
        assert program_hash(apply_trace(wl, rec["trace"])) == rec["program_hash"] == h
        secs = [float(s) for s in tr.run_secs]
        assert rec["seconds"] == pytest.approx(secs, rel=1e-6)
        assert label(rec) == pytest.approx(min(secs), rel=1e-6)
        assert rec["source"].startswith(tuned) and json.loads(rec["target"])["mcpu"]
    run = RecordStore(str(ds)).runs()[r["run"]]
    assert run["spec"]["id"] == DEVICE and run["imported"]["format"] == "metaschedule-json"
    # the loader featurizes them through the dataset's workloads.jsonl (the matmul is not a zoo task)
    monkeypatch.setenv("CDMPP_CACHE", str(tmp_path / "cache"))
    loaded = load_dataset(str(ds), TaskTable.load(str(TASKS)), progress=False)
    assert len(loaded) == _trials(tuned) and {p.record_id for p in loaded.programs} == set(recs)
    assert sorted(p.seconds for p in loaded.programs) == pytest.approx(sorted(label(x) for x in recs.values()))


@pytest.mark.slow
def test_reimport_adds_nothing(tuned, tmp_path):
    ds = tmp_path / "ds"
    first = _import(tuned, ds)
    files = {p.name: p.read_bytes() for p in ds.iterdir()}
    again = _import(tuned, ds, ids_out=str(tmp_path / "ids.txt"))
    assert again["added"] == 0 and again["already_present"] == first["added"] == _trials(tuned) and again["run"] is None
    assert {p.name: p.read_bytes() for p in ds.iterdir()} == files
    assert len(_lines(tmp_path / "ids.txt")) == _trials(tuned)


@pytest.mark.slow
def test_bad_lines_are_reported_and_skipped(tuned, tmp_path):
    db = tmp_path / "db"
    shutil.copytree(tuned, db, ignore=shutil.ignore_patterns("logs"))
    path = db / "database_tuning_record.json"
    lines = _lines(path)
    rec = [json.loads(x) for x in lines]
    lines[2] = lines[2][: len(lines[2]) // 2]  # torn line
    rec[4][1][1] = []  # no run_secs
    rec[5][1][1] = [1e10]  # MetaSchedule's mark of a failed run
    rec[6][1][1] = [float("inf")]
    rec[7][0] = 99  # no such workload
    rec[8][1][0][0][0][2][0] = "no_such_block"  # GetSBlock of a block the workload lacks
    for i in range(4, 9):
        lines[i] = json.dumps(rec[i])
    path.write_text("\n".join(lines) + "\n")
    r = _import(db, tmp_path / "ds")
    assert r["added"] == _trials(tuned) - 6 and r["errors"] == 6
    assert (r["unreadable"], r["no_run_secs"], r["failed_run"], r["workload_missing"], r["does_not_replay"]) == (1, 2, 1, 1, 1)
    assert [p.split(": ")[0].rsplit(":", 1)[1] for p in r["problems"]] == ["3", "5", "6", "7", "8", "9"]
    assert rec[8][1][0][0][0][0] == "GetSBlock"


@pytest.mark.slow
def test_cli_and_finetune_from_the_imported_ids(tuned, tmp_path, monkeypatch, capsys):
    """`cdmpp import metaschedule` writes the ids; `cdmpp finetune` adapts the shipped model from them."""
    from cdmpp.cli import main
    from cdmpp.defaults import MODEL

    if not is_checkpoint(MODEL):
        pytest.skip("no shipped model")
    monkeypatch.setenv("CDMPP_CACHE", str(tmp_path / "cache"))
    ds, ids = str(tmp_path / "ds"), str(tmp_path / "ids.txt")
    common = ["--dataset", ds, "--task-table", str(TASKS), "--devices", str(DEVICES_JSON)]
    assert main(["import", "metaschedule", tuned, "--device", DEVICE, "--ids-out", ids, *common]) == 0
    assert json.loads(capsys.readouterr().out)["added"] == _trials(tuned)
    assert main(["finetune", "--model", str(MODEL), "--device", DEVICE, "--ids", ids,
                 "--out", str(tmp_path / "ft"), *common]) == 0
    assert f"({_trials(tuned)} programs measured on {DEVICE})" in capsys.readouterr().out
    assert main(["import", "metaschedule", str(tmp_path), "--device", DEVICE, *common]) == 2  # not a database


def test_dataset_workloads_extend_the_task_table_and_travel_with_the_records(tmp_path):
    """``workloads.jsonl`` adds the tasks the table lacks (never replaces one); ``import_store`` carries it."""
    from cdmpp.records.importers import WORKLOADS, import_store, imported_workloads, with_imported_workloads
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import Task, TaskTable

    table = TaskTable(tasks={"a" * 16: Task("a" * 16, "known", "{}")})
    src = tmp_path / "lent"
    RecordStore(str(src)).append("d", [{"id": "d|b|1", "device": "d", "task": "b" * 16, "seconds": [1e-5]}])
    (src / WORKLOADS).write_text(json.dumps({"key": "b" * 16, "name": "mm", "mod_json": "{}"}) + "\n"
                                 + json.dumps({"key": "a" * 16, "name": "other", "mod_json": "{}"}) + "\n{torn")
    assert with_imported_workloads(table, str(tmp_path)) is table  # no workloads.jsonl: the table as is
    ext = with_imported_workloads(table, str(src))
    assert ext["a" * 16].name == "known" and ext["b" * 16].name == "mm" and len(table) == 1
    import_store(str(src), str(tmp_path / "ds"))
    import_store(str(src), str(tmp_path / "ds"))
    assert len(_lines(tmp_path / "ds" / WORKLOADS)) == 2
    with open(tmp_path / "ds" / WORKLOADS, "a") as f:
        f.write('{"key": "c')  # a write cut short
    with open(src / WORKLOADS, "w") as f:
        f.write(json.dumps({"key": "d" * 16, "name": "new", "mod_json": "{}"}) + "\n")
    import_store(str(src), str(tmp_path / "ds"))
    assert sorted(imported_workloads(str(tmp_path / "ds"))) == ["a" * 16, "b" * 16, "d" * 16]


def test_a_task_of_the_table_keeps_its_key_name_and_networks(tmp_path):
    """A database over a zoo task (as ``tune_relax`` of a zoo network writes) needs no workloads.jsonl."""
    from cdmpp.program import tvm_env

    tvm_env.setup()
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.measure.schedules import sample_schedules
    from cdmpp.records.importers import WORKLOADS
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable, load_task_mod

    task = min((t for t in TaskTable.load(str(TASKS)) if "matmul" in t.name), key=lambda t: len(t.mod_json))
    mod, target = load_task_mod(task), tvm_env.make_target("llvm", num_cores=2)
    (tmp_path / "db").mkdir()
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))
    wl = db.commit_workload(mod)
    schs = sample_schedules(mod, target, 3, seed=0)
    for sch in schs:
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, [2e-5, 1e-5], target,
                                                         ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    r = _import(tmp_path / "db", tmp_path / "ds")
    assert r["added"] == len(schs) and r["new_workloads"] == 0 and not (tmp_path / "ds" / WORKLOADS).exists()
    for rec in RecordStore(str(tmp_path / "ds")).iter_records():
        assert (rec["task"], rec["task_name"], rec["networks"]) == (task.key, task.name, sorted(task.occurrences))
        assert rec["seconds"] == [2e-5, 1e-5]
