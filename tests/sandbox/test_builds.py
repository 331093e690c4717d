"""Builds in the sandbox: a build is optional work (the model's instruction counts), so a program whose build
outruns its worker's CPU limit is answered unbuilt, not failed."""

import json
import time

import pytest


def _schedule(n: int, unrolled: bool):
    """An n x n x n matmul's schedule; ``unrolled``: every loop unrolled (LLVM then takes ~80 s to build n = 32,
    while featurizing it takes milliseconds)."""
    from cdmpp.program import tvm_env

    tvm_env.setup(1)
    from tvm.s_tir import Schedule

    from cdmpp.zoo import workloads

    sch = Schedule(workloads.matmul(n, n, n))
    if unrolled:
        for loop in sch.get_loops(sch.get_sblock("matmul")):
            sch.unroll(loop)
    return sch


def _item(n: int, unrolled: bool) -> str:
    """The same as workload + trace, the wire form that runs no code when parsed."""
    from tvm.s_tir.meta_schedule.database import Workload

    from cdmpp.program.inputs import to_json_value
    from cdmpp.zoo import workloads

    trace = _schedule(n, unrolled).trace
    return json.dumps({"workload": Workload(workloads.matmul(n, n, n)).as_json(), "trace": to_json_value(trace.as_json())})


@pytest.fixture(scope="module")
def sandbox():
    from cdmpp.sandbox.pool import Sandbox

    sb = Sandbox(1, item_cpu_s=1)
    assert sb.wait_ready(180), sb.start_errors
    yield sb
    sb.close()


def test_a_chunk_whose_build_outruns_the_cpu_limit_is_answered_unbuilt(sandbox):
    quick, slow = _item(16, False), _item(32, True)
    feats, errors, _, _ = sandbox.run([quick, slow], [0, 1], "llvm", build={"kind": "llvm"},
                                      deadline=time.monotonic() + 120)
    assert not errors and len(feats) == 2
    assert all(f.asm is None for f in feats)  # the chunk asked again without the build
    assert feats[1].n_leaves == 1
    feats, errors, _, _ = sandbox.run([quick], [0], "llvm", build={"kind": "llvm"}, deadline=time.monotonic() + 120)
    assert not errors and feats[0].asm is not None  # a build that ends in time gives its counts


def test_a_tvmscript_program_whose_build_outruns_the_cpu_limit_is_answered_unbuilt(sandbox):
    """TVMScript is parsed by running Python, so a limit reached while parsing is the program's fault (a parse bomb
    is failed, tests/service/test_hostile.py); the worker says when it starts building, and a limit reached after
    that is the build's."""
    slow = _schedule(32, True).mod.script()
    feats, errors, _, _ = sandbox.run([slow], [0], "llvm", tvmscript=True, build={"kind": "llvm"},
                                      deadline=time.monotonic() + 120)
    assert not errors and feats[0].asm is None and feats[0].n_leaves == 1
