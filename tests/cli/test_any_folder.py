"""Every command works from any folder: the shipped tables resolve beside the package, in a checkout and in
an installed wheel, and the commands that read them take their paths as flags."""

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_default_tables_are_absolute_paths_that_exist():
    from cdmpp import defaults

    for path in (defaults.DEVICES, defaults.TASK_TABLE):
        assert os.path.isabs(path) and os.path.exists(path), path


def test_the_wheel_ships_the_device_and_task_tables():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert conf["package-dir"]["cdmpp.datasets"] == "datasets" and "cdmpp.datasets" in conf["packages"]
    shipped = conf["package-data"]["cdmpp.datasets"]
    assert {"devices.json", "tasks-llvm.json.gz"} <= set(shipped)
    assert all((ROOT / "datasets" / name).exists() for name in shipped)


def test_commands_that_read_the_tables_take_their_paths_as_flags():
    from cdmpp.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    for cmd in ("network", "predict", "devices", "collect"):
        assert "--devices" in sub[cmd].format_help(), cmd
    assert "--task-table" in sub["network"].format_help() and "--allow-default" in sub["network"].format_help()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="venv layout is Linux's")
def test_an_installed_wheel_answers_from_an_empty_folder(tmp_path):
    """Build the wheel, install it alone into a fresh venv that borrows torch and TVM from this one (as
    tests/test_packaging.py does), and run the front-door commands from an empty folder."""
    wheels, venv, cwd = tmp_path / "wheels", tmp_path / "venv", tmp_path / "empty"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDMPP_") and k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels)], check=True, cwd=cwd, timeout=300, env=env)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
                    *map(str, wheels.glob("cdmpp-*.whl"))], check=True, cwd=cwd, timeout=300, env=env)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz-borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    def cdmpp(*args, rc=0):
        r = subprocess.run([str(venv / "bin" / "cdmpp"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == rc, r.stderr[-3000:]
        return r

    assert cdmpp("--version").stdout.startswith("cdmpp ")
    table = str(site / "cdmpp" / "datasets" / "devices.json")
    listing = cdmpp("devices").stdout
    assert table in listing and "amd-epyc-znver4-2t/llvm-avx512" in listing
    out = cdmpp("network", "bert_tiny@1", "--schedules", "default").stdout
    assert "schedules: 0 measured, 0 tuned, 23 default" in out
    refused = cdmpp("network", "bert_tiny@1", rc=2).stderr  # no dataset ships: every task would be default
    assert "have no measured program" in refused and "--allow-default" in refused
    sample = str(site / "cdmpp" / "samples" / "conv2d.tvmscript")
    rows = json.loads(cdmpp("predict", sample, "--trusted", "--json").stdout)["predictions"]
    assert rows and all(r["seconds"] > 0 for r in rows)
    assert not list(cwd.iterdir()), "a command wrote into the working folder"
