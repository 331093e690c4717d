"""``cdmpp predict`` and ``cdmpp --version``; the public API importable from ``cdmpp``."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cdmpp.defaults import MODEL
from cdmpp.model.kinds import is_checkpoint, read_summary

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "cdmpp" / "samples" / "conv2d.tvmscript"
needs_model = pytest.mark.skipif(not is_checkpoint(MODEL), reason="no shipped model")


def test_version_names_the_package_and_the_model(capsys):
    import cdmpp
    from cdmpp.cli import main

    assert cdmpp.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cdmpp {cdmpp.__version__} (model ")
    if is_checkpoint(MODEL):
        assert read_summary(MODEL)["model_version"] in out


def test_the_public_api_comes_from_cdmpp_without_loading_torch_or_tvm():
    code = ("import sys, cdmpp; assert 'torch' not in sys.modules and 'tvm' not in sys.modules; "
            "from cdmpp import Predictor, Prediction, load_program, Client, UnknownDeviceError, ProgramError; "
            "from cdmpp.program import load_program as lp; from cdmpp.program.inputs import load_program as l2; "
            "assert lp is l2 is load_program; print(sorted(cdmpp.__all__))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "Predictor" in out and "load_program" in out
    import cdmpp

    with pytest.raises(AttributeError):
        cdmpp.NoSuchName


@pytest.fixture(scope="module")
def database(tmp_path_factory, cpu_target):
    """A MetaSchedule JSON database folder with two tuning records of one workload."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from cdmpp.measure.schedules import sample_schedules
    from cdmpp.zoo import workloads

    folder = tmp_path_factory.mktemp("db")
    db = ms.database.JSONDatabase(work_dir=str(folder))
    mod = workloads.matmul(64, 64, 64)
    wl = db.commit_workload(mod)
    for s in sample_schedules(mod, cpu_target, 2, seed=1):
        db.commit_tuning_record(ms.database.TuningRecord(s.trace, wl, run_secs=[1e-3], target=cpu_target,
                                                         args_info=ArgInfo.from_prim_func(s.mod["main"])))
    return folder


def test_programs_are_read_from_tvmscript_json_and_a_database(tmp_path, database):
    from cdmpp.cli.predict import read_programs
    from cdmpp.program.inputs import ProgramError

    lines = (database / "database_workload.json").read_text().splitlines()
    record = json.loads((database / "database_tuning_record.json").read_text().splitlines()[0])
    one = {"workload": json.loads(lines[0]), "trace": record[1][0]}
    (tmp_path / "one.json").write_text(json.dumps(one))
    (tmp_path / "list.json").write_text(json.dumps([one, one]))
    (tmp_path / "request.json").write_text(json.dumps({"device": "d", "workload": one["workload"],
                                                       "programs": [{"trace": one["trace"]}]}))
    got = read_programs([str(SAMPLE), str(database), *(str(tmp_path / n) for n in ("one.json", "list.json",
                                                                                   "request.json"))])
    names = [n for n, _ in got]
    assert names == [str(SAMPLE), f"{database}#record1", f"{database}#record2", str(tmp_path / "one.json"),
                     f"{tmp_path / 'list.json'}#0", f"{tmp_path / 'list.json'}#1", f"{tmp_path / 'request.json'}#0"]
    assert got[0][1].startswith("# from tvm.script") or "T.prim_func" in got[0][1]
    assert got[1][1] == {"workload": json.loads(lines[0]), "trace": record[1][0]} and got[-1][1] == one

    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProgramError, match="bad.json: looks like JSON"):
        read_programs([str(tmp_path / "bad.json")])
    (tmp_path / "nodb").mkdir()
    with pytest.raises(FileNotFoundError, match="not a MetaSchedule database: no database_workload.json"):
        read_programs([str(tmp_path / "nodb")])
    with pytest.raises(FileNotFoundError, match="missing.tvmscript"):
        read_programs([str(tmp_path / "missing.tvmscript")])


@needs_model
def test_predict_prints_a_table_or_json_per_device_and_names_a_bad_program(tmp_path, database, capsys,
                                                                           monkeypatch):
    from cdmpp.cli import main

    monkeypatch.chdir(tmp_path)  # any folder
    (tmp_path / "bad.tvmscript").write_text("this is not TVMScript\n")
    devices = ["amd-epyc-znver4-2t/llvm-avx512", "amd-ryzen7-3700x-8t/llvm-sse2"]  # the second: specs, no data
    args = ["predict", str(SAMPLE), str(database), "--device", ",".join(devices), "--trusted"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["predictions"]
    assert len(rows) == 2 * 3 and {r["device"] for r in rows} == set(devices) and not out["errors"]
    assert all(0 < r["lo90"] <= r["seconds"] <= r["hi90"] for r in rows)
    assert all(("device_untrained" in r["flags"]) == ("ryzen" in r["device"]) for r in rows)  # trained on the VM
    assert out["model_version"].startswith("cdmpp-")

    assert main(args[:3] + [str(tmp_path / "bad.tvmscript"), "--device", devices[0], "--trusted"]) == 2
    cap = capsys.readouterr()
    table = cap.out.splitlines()
    assert table[0].split()[:3] == ["program", "device", "seconds"] and len(table) == 1 + 3
    assert "bad.tvmscript: TVMScript does not parse" in cap.err


@needs_model
def test_predict_on_an_unknown_device_lists_the_known_ones(capsys):
    from cdmpp.cli import main

    assert main(["predict", str(SAMPLE), "--device", "no-such/device", "--trusted"]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'no-such/device'" in err and "amd-epyc-znver4-2t/llvm-avx512" in err


@pytest.mark.slow
@needs_model
def test_predict_parses_in_the_sandbox_by_default(capsys):
    """Without --trusted the programs are parsed in a sandbox worker; the answer is the same."""
    from cdmpp.cli import main

    dev = "amd-epyc-znver4-2t/llvm-avx512"
    assert main(["predict", str(SAMPLE), "--device", dev, "--json"]) == 0
    sandboxed = json.loads(capsys.readouterr().out)["predictions"]
    assert main(["predict", str(SAMPLE), "--device", dev, "--json", "--trusted"]) == 0
    trusted = json.loads(capsys.readouterr().out)["predictions"]
    assert sandboxed[0]["seconds"] == pytest.approx(trusted[0]["seconds"], rel=1e-6)
