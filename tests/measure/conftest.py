"""Fixtures shared by the tests of this folder."""

import pytest


@pytest.fixture
def measurer():
    """``measurer(cfg, **kw)``: a MetaScheduleMeasurer for this CPU, 1 thread, closed after the test."""
    from cdmpp.program import tvm_env

    tvm_env.setup(1)
    from cdmpp.measure.metaschedule import MetaScheduleMeasurer

    made = []

    def make(cfg, **kw):
        made.append(MetaScheduleMeasurer(tvm_env.make_target("llvm", num_cores=1), cfg, **kw))
        return made[-1]

    yield make
    for m in made:
        m.close()
