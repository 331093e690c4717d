"""Every command works from any folder: the shipped tables resolve beside the package in a checkout (the
installed wheel: tests/test_packaging.py), and the commands that read them take their paths as flags."""

import os
import tomllib
from pathlib import Path

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
