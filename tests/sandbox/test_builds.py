"""Builds in the sandbox: a build is optional work (the model's instruction counts), so a program whose build
outruns its worker's CPU limit is answered unbuilt, not failed."""

import json
import time


def _item(n: int, unrolled: bool) -> str:
    """An n x n x n matmul as workload + trace; ``unrolled``: every loop unrolled (LLVM then takes ~80 s to
    build n = 32, while featurizing it takes milliseconds)."""
    from cdmpp.program import tvm_env

    tvm_env.setup(1)
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import Workload

    from cdmpp.program.inputs import to_json_value
    from cdmpp.zoo import workloads

    mod = workloads.matmul(n, n, n)
    sch = Schedule(mod)
    if unrolled:
        for loop in sch.get_loops(sch.get_sblock("matmul")):
            sch.unroll(loop)
    return json.dumps({"workload": Workload(mod).as_json(), "trace": to_json_value(sch.trace.as_json())})


def test_a_chunk_whose_build_outruns_the_cpu_limit_is_answered_unbuilt():
    from cdmpp.sandbox.pool import Sandbox

    quick, slow = _item(16, False), _item(32, True)
    sb = Sandbox(1, item_cpu_s=1)
    try:
        assert sb.wait_ready(180), sb.start_errors
        feats, errors, _, _ = sb.run([quick, slow], [0, 1], "llvm", build={"kind": "llvm"},
                                     deadline=time.monotonic() + 120)
        assert not errors and len(feats) == 2
        assert all(f.asm is None for f in feats)  # the chunk asked again without the build
        assert feats[1].n_leaves == 1
        feats, errors, _, _ = sb.run([quick], [0], "llvm", build={"kind": "llvm"}, deadline=time.monotonic() + 120)
        assert not errors and feats[0].asm is not None  # a build that ends in time gives its counts
    finally:
        sb.close()
