import os

import pytest

os.environ.setdefault("TVM_NUM_THREADS", "1")


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
