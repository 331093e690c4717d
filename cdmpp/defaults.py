"""Where cdmpp looks when it is not told: the checkout's dataset files (or the wheel's copies), the shipped
model, the training recipes and the feature cache. Every command, option and settings class takes its
default from here."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> str:
    """A file of the checkout's ``datasets/`` (beside ``cdmpp/``: a checkout or an editable install), else the
    copy an installed wheel ships as package data (``cdmpp/datasets/``): an absolute path, so that every
    command finds it from any folder (and after a ``chdir``)."""
    path = PACKAGE.parent / "datasets" / name
    if not path.exists() and (PACKAGE / "datasets" / name).exists():
        path = PACKAGE / "datasets" / name
    return str(path)


DATASET = _shipped("measurements")  # measurement records (JSON lines), appended to by `cdmpp collect`
if not Path(DATASET).is_dir():  # an installed wheel ships none: a folder of the working folder
    DATASET = "datasets/measurements"
TASK_TABLE = _shipped("tasks-llvm.json.gz")  # the network zoo's tuning tasks
DEVICES = _shipped("devices.json")  # the device spec table
MODEL = PACKAGE / "models" / "default"  # the shipped checkpoint (package data)
MODEL_OUT = "cdmpp/models/default"  # where `cdmpp train` writes by default (a checkout's shipped model)
REPORTS = "reports"  # evaluation reports and benchmark results
PROTOCOL_RUNS = REPORTS + "/protocol-runs.jsonl"  # every scored row of `cdmpp protocol`
# the protocol's devices, pinned so data added later on other devices does not move its numbers, and its
# cross-device target (ids of the device table, DEVICES)
PROTOCOL_DEVICES = ("amd-epyc-znver4-2t/llvm-avx512", "amd-epyc-znver4-1t/llvm-avx512")
PROTOCOL_TARGET = "amd-epyc-znver4-1t/llvm-avx512"

RECIPES = PACKAGE.parent / "train"  # a checkout; an installed wheel has them as package data (cdmpp/recipes)
if not (RECIPES / "default.toml").exists():
    RECIPES = PACKAGE / "recipes"


def cache_dir(dataset_dir: str) -> str:
    """The feature cache (and kept build artifacts) of a dataset folder: ``$CDMPP_CACHE`` or
    ``~/.cache/cdmpp/<dataset folder name>``."""
    return os.environ.get("CDMPP_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "cdmpp",
                                                      os.path.basename(os.path.abspath(dataset_dir))))


def assembly_dir(dataset_dir: str) -> str:
    """The built programs' instruction counts of a dataset folder (``cdmpp.program.assembly``): ``assembly``
    beside it (``datasets/assembly`` for ``datasets/measurements``), kept in git: builds take hours."""
    return os.path.join(os.path.dirname(os.path.abspath(dataset_dir)), "assembly")
