"""Random valid schedules of the sample workloads."""

def test_every_workload_has_several_distinct_schedules(sampled):
    for name, schs in sampled.items():
        assert len(schs) >= 4, name


def test_random_gpu_schedules_bind_every_loop(tvm):
    """On a GPU an unbound loop runs on the host over device memory and crashes the runner: the random
    schedules of elementwise tasks bind blocks and threads, and a task with a reduction gets none."""
    import random

    from cdmpp.measure.schedules import random_loop_schedule
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    target = tvm_env.make_target("cuda", arch="sm_90")
    mod = workloads.SAMPLES["fused_elementwise"]()
    for seed in range(4):
        sch = random_loop_schedule(mod, random.Random(seed), gpu=True)
        built = tvm.tirx.build(sch.mod, target=target)
        assert [m.kind for m in built.imports] == ["cuda"]
        assert "TVMBackendParallelLaunch" not in built.inspect_source("ll")
    assert random_loop_schedule(workloads.SAMPLES["matmul"](), random.Random(0), gpu=True) is None
