"""Random valid schedules of the sample workloads. The GPU tests share a file: a process's first CUDA
target loads TVM's CUDA intrinsics (tens of seconds)."""

import pytest

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

    mod = workloads.SAMPLES["fused_elementwise"]()
    for seed in range(4):
        sch = random_loop_schedule(mod, random.Random(seed), gpu=True)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            outer = [sch.get(loop).thread_binding for loop in sch.get_loops(block)[:2]]
            assert [t.thread_tag if t is not None else None for t in outer] == ["blockIdx.x", "threadIdx.x"], seed
    # one CUDA build (~20 s): seed 3's schedule, which also has a serial loop inside each thread
    built = tvm.tirx.build(sch.mod, target=tvm_env.make_target("cuda", arch="sm_90"))
    assert [m.kind for m in built.imports] == ["cuda"]
    assert "TVMBackendParallelLaunch" not in built.inspect_source("ll")
    assert random_loop_schedule(workloads.SAMPLES["matmul"](), random.Random(0), gpu=True) is None


@pytest.mark.slow
def test_sampled_gpu_schedules_featurize(tvm):
    from cdmpp.measure import schedules
    from cdmpp.program import tvm_env
    from cdmpp.program.features import FEATURE_NAMES, compact_ast_of, featurize
    from cdmpp.program.inputs import load_program
    from cdmpp.zoo import workloads

    target = tvm_env.make_target("cuda")
    schs = schedules.sample_schedules(workloads.matmul(), target, 2, seed=0)
    feats = featurize(schs[0].mod, target)
    assert feats.leaf_features[:, FEATURE_NAMES.index("is_gpu")].min() == 1.0
    assert feats.leaf_features[:, FEATURE_NAMES.index("threadIdx_x_len")].max() > 1.0
    assert compact_ast_of(load_program(schs[0].mod, target), feats.n_leaves).n_leaves == feats.n_leaves
