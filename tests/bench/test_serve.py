"""``cdmpp bench serve``."""


def test_bench_serve_in_process_reference(tvm, device):
    """``cdmpp bench serve --in-process``: the requests' programs parsed, featurized and predicted in this
    process, the reference that the wire path's cost per new program is compared with."""
    import json

    from tvm.s_tir.meta_schedule.database import Workload

    from cdmpp.bench.serve import TaskPrograms, _body, in_process
    from cdmpp.measure import schedules
    from cdmpp.program import tvm_env
    from cdmpp.program.inputs import to_json_value
    from cdmpp.zoo import workloads

    mod = workloads.matmul(32, 32, 32)
    schs = schedules.sample_schedules(mod, tvm_env.make_target("llvm", num_cores=2), 4, 0)
    items = [json.dumps(json.dumps({"trace": to_json_value(s.trace.as_json())}, separators=(",", ":"))).encode()
             for s in schs]
    tp = TaskPrograms("matmul", Workload(mod).as_json(), items)
    r = in_process([_body(tp, [0, 1]), _body(tp, [2, 3])], device, None)
    assert r["programs"] == 4 and r["programs_per_s"] > 0
