from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.data import LIMIT, REAL_DEVICE, TASKS, candidate_dirs
from tests.processes import app_server

os.environ.setdefault("TVM_NUM_THREADS", "1")
torch.set_num_threads(1)  # the tests share a small machine with a measurement job


@pytest.fixture(scope="session")
def tvm():
    from cdmpp.program import tvm_env

    return tvm_env.setup()


@pytest.fixture(scope="session")
def cpu_target(tvm):
    from cdmpp.program import tvm_env

    return tvm_env.make_target("llvm", num_cores=2)


@pytest.fixture(scope="session")
def sampled(cpu_target):
    """Several MetaSchedule-sampled schedules of each test workload: {name: [Schedule, ...]}."""
    from cdmpp.measure import schedules
    from cdmpp.zoo import workloads

    return {name: schedules.sample_schedules(make(), cpu_target, 6, seed=3)
            for name, make in workloads.SAMPLES.items()}


@pytest.fixture(scope="session")
def predictor():
    """The shipped model (tests that use it skip when it is absent)."""
    from cdmpp.predict.predictor import Predictor

    return Predictor.load()


@pytest.fixture(scope="session")
def device(predictor):
    """A CPU device the shipped model knows."""
    return next(d for d in predictor.devices() if predictor.target_kind(d) == "llvm")


@pytest.fixture
def restore_logging():
    """tune_tir attaches file handlers under its work_dir to every MetaSchedule logger; drop them after
    the run, or later MetaSchedule users (the XGBoost peer) log into a deleted folder. (pytest's own
    capture handlers, on which tune_tir fails, are added at the call itself: the tuning code sets them
    aside with ``cdmpp.bench.tune.unnamed_handlers_aside``.)"""
    import logging

    before = {name: list(lg.handlers) for name, lg in logging.Logger.manager.loggerDict.items()
              if isinstance(lg, logging.Logger)}
    yield
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger):
            for h in [h for h in lg.handlers if h not in before.get(name, [])]:
                lg.removeHandler(h)
                h.close()


@pytest.fixture(scope="session")
def real(tmp_path_factory):
    """(a dataset folder, its first LIMIT programs): the folder holds REAL_DEVICE's first part alone where the
    data has one, so what ``limit=`` or ``--limit`` reads first is that sample whatever devices are added."""
    if not TASKS.exists():
        pytest.skip("no task table")
    from cdmpp.records.dataset import load_dataset
    from cdmpp.records.store import slug
    from cdmpp.zoo.tasks import TaskTable

    table = TaskTable.load(str(TASKS))
    for folder in candidate_dirs():
        if not (folder.is_dir() and any(folder.glob("*.jsonl"))):
            continue
        first = sorted(folder.glob(f"{slug(REAL_DEVICE)}.part-*.jsonl.gz"))[:1]
        if first:
            folder = tmp_path_factory.mktemp("real")
            shutil.copy(first[0], folder)
        ds = load_dataset(str(folder), table, limit=LIMIT, progress=False)
        if len(ds) >= 100 and len(ds.networks()) >= 3:
            return folder, ds
    pytest.skip(f"no dataset with >= 100 records among {[str(d) for d in candidate_dirs()]}")


@pytest.fixture(scope="session")
def tiny_recipe(tmp_path_factory):
    from cdmpp.defaults import RECIPES

    path = tmp_path_factory.mktemp("recipe") / "tiny.toml"
    path.write_text(f'base = "{RECIPES / "default"}"\nd_model = 32\nd_ff = 64\nepochs = 3\nensemble = 2\n'
                    "lr_cycle_epochs = 2\n")
    return str(path)


@pytest.fixture(scope="session")
def url(predictor):
    """A server for trusted callers: TVMScript allowed (the tests' programs are TVMScript text)."""
    with app_server(predictor, allow_tvmscript=True) as u:
        yield u


@pytest.fixture(scope="session")
def texts(sampled):
    """TVMScript of sampled schedules of every test workload."""
    return [s.mod.script() for schs in sampled.values() for s in schs[:3]]
