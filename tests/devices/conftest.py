"""Fixtures shared by the tests of this folder."""

from __future__ import annotations

import pytest

from cdmpp.devices.probe import probe_local_cpu


@pytest.fixture(scope="session")
def probed(tvm):
    from cdmpp.program import tvm_env

    return probe_local_cpu(1), tvm_env.host_mcpu()
