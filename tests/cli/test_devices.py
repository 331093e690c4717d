"""``cdmpp devices [show | add | probe]``: the table, trained or not, adding a device safely."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cdmpp.defaults import MODEL
from cdmpp.model.kinds import is_checkpoint, read_summary

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "datasets" / "devices.json"
needs_table = pytest.mark.skipif(not TABLE.exists() or not is_checkpoint(MODEL),
                                 reason="no device table or shipped model")


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "devices.json"
    shutil.copy(TABLE, path)
    return path


def _spec(**kw):
    d = json.loads(TABLE.read_text())[0]
    d.update(id="my-chip-2t/llvm-avx2", hardware="My chip (x86-64-v3)", probe={})
    d.update(kw)
    return d


@needs_table
def test_devices_lists_the_table_with_what_the_model_trained_on_from_any_folder(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cdmpp.cli", "devices"], cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout
    trained = set(read_summary(MODEL)["train_devices"])
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip() and "/" in line.split()[0]}
    assert set(rows) == {d["id"] for d in json.loads(TABLE.read_text())}
    assert all((" yes" in rows[d]) == (d in trained) for d in rows)
    assert str(TABLE) in out and "cdmpp devices add SPEC.json" in out and "cdmpp devices probe --add" in out


@needs_table
def test_show_prints_one_spec_and_an_unknown_id_names_the_table(table, capsys):
    from cdmpp.cli import main

    first = json.loads(table.read_text())[0]
    assert main(["devices", "show", first["id"], "--devices", str(table)]) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert main(["devices", "--devices", str(table), "show", "no/such"]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'no/such'" in err and str(table) in err
    assert main(["devices", "--devices", str(table.parent / "none.json")]) == 2
    assert "no device table at" in capsys.readouterr().err


@needs_table
def test_add_validates_and_never_overwrites_without_replace(table, tmp_path, capsys):
    from cdmpp.cli import main

    before = table.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({k: v for k, v in _spec(mem_bw_gbs="fast", threads=0).items() if k != "peak_gflops"}))
    assert main(["devices", "add", str(bad), "--table", str(table)]) == 2
    err = capsys.readouterr().err
    assert "missing fields: peak_gflops" in err and "mem_bw_gbs must be a positive number" in err
    assert "threads must be an integer >= 1" in err and table.read_text() == before

    good = tmp_path / "good.json"
    good.write_text(json.dumps(_spec()))
    assert main(["devices", "add", str(good), "--table", str(table)]) == 0
    ids = [d["id"] for d in json.loads(table.read_text())]
    assert ids[-1] == "my-chip-2t/llvm-avx2" and len(ids) == len(json.loads(before)) + 1

    good.write_text(json.dumps(_spec(mem_bw_gbs=99.0)))
    assert main(["devices", "add", str(good), "--table", str(table)]) == 2
    err = capsys.readouterr().err
    assert "already in" in err and "pass --replace" in err
    assert json.loads(table.read_text())[-1]["mem_bw_gbs"] != 99.0
    assert main(["devices", "add", str(good), "--table", str(table), "--replace"]) == 0
    after = json.loads(table.read_text())
    assert after[-1]["mem_bw_gbs"] == 99.0 and len(after) == len(ids)


def test_probe_prints_the_spec_warns_under_load_and_adds_on_request(tmp_path, monkeypatch, capsys):
    from cdmpp.cli import main
    from cdmpp.devices import probe
    from cdmpp.devices.spec import DeviceSpec

    spec = DeviceSpec.from_dict(_spec(probe={"under_load": True, "warning": "probed under load 3 times"}))
    seen = {}

    def fake_probe(threads, mcpu=None, tries=3, reference=False, **kw):
        seen.update(threads=threads, tries=tries, reference=reference)
        return spec

    monkeypatch.setattr(probe, "probe_local_cpu", fake_probe)
    table = tmp_path / "devices.json"
    assert main(["devices", "probe", "--threads", "2", "--tries", "2"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["id"] == spec.id and "warning: probed under load" in cap.err
    assert seen == {"threads": 2, "tries": 2, "reference": False} and not table.exists()
    assert main(["devices", "probe", "--threads", "2", "--add", "--table", str(table)]) == 0
    assert seen["reference"]  # a device added to the table gets its reference kernels measured
    assert [d["id"] for d in json.loads(table.read_text())] == [spec.id]
    assert main(["devices", "probe", "--threads", "2", "--add", "--table", str(table)]) == 2
    assert "--replace" in capsys.readouterr().err
