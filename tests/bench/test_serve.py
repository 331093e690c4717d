"""``cdmpp bench serve``."""


def test_bench_serve_in_process_reference(tvm, device):
    """``cdmpp bench serve --in-process``: the requests' programs parsed, featurized and predicted in this
    process, the reference that the wire path's cost per new program is compared with; asked unbuilt (as the
    cost model asks) unless told to build, and the reference builds what its body asks built."""
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
    unbuilt, built = _body(tp, [0, 1]), _body(tp, [2, 3], build=True)
    assert json.loads(unbuilt.replace(b"__DEVICE__", b"d"))["build"] is False
    assert "build" not in json.loads(built.replace(b"__DEVICE__", b"d"))  # the server's default: built
    r = in_process([unbuilt, built], device, None)
    assert r["programs"] == 4 and r["programs_per_s"] > 0
