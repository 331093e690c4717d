"""``cdmpp network`` says which schedules it summed and refuses to mix untuned default code in silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdmpp.defaults import MODEL
from cdmpp.predict.network import TaskProgram, check_schedules, schedule_counts
from cdmpp.model.kinds import is_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _programs(*sources):
    return [TaskProgram(f"task{i}", f"k{i}", 1, None, None, None, s) for i, s in enumerate(sources)]


def test_counts_name_measured_tuned_and_default_schedules():
    progs = _programs("best-measured", "best-measured", "database", "default")
    assert schedule_counts(progs) == {"measured": 2, "tuned": 1, "default": 1}
    rows = [{"source": p.source} for p in progs]  # NetworkPrediction.tasks rows count the same
    assert schedule_counts(rows) == schedule_counts(progs)


def test_a_total_that_mixes_in_default_code_is_refused_unless_allowed():
    mixed = _programs("best-measured", "default", "default")
    with pytest.raises(ValueError, match=r"2 of 3 tasks of net@1 have no measured program for dev in data/m "
                                         r"\(task1, task2\).*--allow-default"):
        check_schedules("net@1", "dev", mixed, "best-measured", "data/m")
    with pytest.raises(ValueError, match="have no tuned program for dev in db/"):
        check_schedules("net@1", "dev", _programs("database", "default"), "db/", "db/")
    check_schedules("net@1", "dev", mixed, "best-measured", allow_default=True)
    check_schedules("net@1", "dev", _programs("default", "default"), "default")  # asked for untuned code
    check_schedules("net@1", "dev", _programs("best-measured", "database"), "best-measured")


@pytest.mark.skipif(not is_checkpoint(MODEL) or not (ROOT / "datasets" / "tasks-llvm.json.gz").exists(),
                    reason="no shipped model or task table")
def test_the_network_command_works_from_any_folder_and_states_its_schedules(tmp_path, monkeypatch, capsys):
    from cdmpp.cli import main

    monkeypatch.chdir(tmp_path)  # the task and device tables resolve beside the package
    empty = tmp_path / "no-measurements"
    empty.mkdir()
    args = ["network", "bert_tiny@1", "--dataset", str(empty)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "tasks of bert_tiny@1 have no measured program" in err and str(empty) in err and "--allow-default" in err
    assert main(args + ["--schedules", "default"]) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert "bert_tiny@1 on amd-epyc-znver4-2t/llvm-avx512" in out and "schedules: 0 measured, 0 tuned, 23 default" in out
    assert main(args + ["--devices", str(tmp_path / "none.json")]) == 2
    assert "none.json (no such file" in capsys.readouterr().err
