"""Leaf features of real TVM programs."""

import subprocess
import sys

import numpy as np
import pytest

from cdmpp.program.compact_ast import END, build_compact_ast, lower_for_features
from cdmpp.program.features import FEATURE_NAMES, N_FEATURES, Featurizer, featurize
from cdmpp.program.inputs import load_program


def _elementwise_variants():
    from tvm.s_tir import Schedule

    from cdmpp.zoo import workloads

    mod = workloads.fused_elementwise()

    def base():
        s = Schedule(mod)
        loop = s.fuse(*s.get_loops(s.get_sblock("add_relu")))
        outer, inner = s.split(loop, [None, 8])
        return s, outer, inner

    plain = base()[0]
    variants = {}
    s, o, i = base(); s.vectorize(i); variants["vec"] = s
    s, o, i = base(); s.parallel(o); variants["parallel"] = s
    s, o, i = base(); s.unroll(i); variants["unroll"] = s
    return plain, variants


@pytest.mark.parametrize("name", ["matmul", "conv2d", "softmax", "layer_norm", "fused_elementwise"])
def test_leaves_match_feature_rows(sampled, cpu_target, name):
    for sch in sampled[name]:
        prog = load_program(sch.mod, cpu_target)
        feats = featurize(prog)
        assert feats.leaf_features.shape == (feats.n_leaves, N_FEATURES)
        # the rule: one leaf per stored buffer, in first-store order, on the scheduled module and
        # on the module after TVM's own feature passes alike
        ast = build_compact_ast(prog.mod)
        lowered = build_compact_ast(lower_for_features(prog.mod))
        assert ast.n_leaves == lowered.n_leaves == feats.n_leaves
        assert ast.leaf_buffers == lowered.leaf_buffers
        assert all(ast.nodes[p].kind == "store" for p in feats.positions)
        assert np.all(np.diff(feats.positions) != 0)
        opens = sum(n.kind not in ("store", END) for n in ast.nodes)
        assert opens == sum(n.kind == END for n in ast.nodes)


def test_flops_and_hash_of_matmul(cpu_target):
    from cdmpp.zoo import workloads

    feats = featurize(workloads.matmul(64, 64, 64), cpu_target)
    assert feats.flops == 2 * 64**3
    assert len(feats.program_hash) == 16


def test_flops_do_not_depend_on_the_schedule(cpu_target):
    """A matmul is 2*M*N*K FLOPs however it is tiled and cached; a layer norm's mean inlined into its
    variance (recomputed per element in the IR, hoisted by LLVM) is not counted per element;
    TVM's per-store counts get that case wrong (issue 19)."""
    from tvm.s_tir import Schedule

    from cdmpp.program.features import flops_from_rows, program_flops
    from cdmpp.zoo import workloads

    mm = workloads.matmul(64, 48, 32)
    assert program_flops(mm) == 2 * 64 * 48 * 32
    s = Schedule(mm)
    blk = s.get_sblock("matmul")
    cache = s.cache_write(blk, 0, "global")
    i, j, k = s.get_loops(blk)
    i0, i1 = s.split(i, [None, 16])
    j0, j1 = s.split(j, [None, 8])
    k0, k1 = s.split(k, [None, 4])
    s.reorder(i0, j0, k0, i1, k1, j1)
    s.reverse_compute_at(cache, j0)
    s.vectorize(j1)
    s.parallel(i0)
    s.decompose_reduction(blk, k0)
    assert program_flops(s.mod) == 2 * 64 * 48 * 32
    assert featurize(load_program(s.mod, cpu_target)).flops == 2 * 64 * 48 * 32

    rows, cols = 16, 64
    ln = workloads.layer_norm(rows, cols)
    # sum: r*c adds; mean: r divides; variance: 2 subtracts, 1 multiply, 1 add per element; output:
    # subtract, 2 multiplies, 1 add per element and (divide, add, rsqrt) per row
    expected = rows * cols + rows + 4 * rows * cols + 4 * rows * cols + 3 * rows
    assert program_flops(ln) == expected
    s = Schedule(ln)
    s.compute_inline(s.get_sblock("X_mean"))
    # the mean's division now sits in 3 places (twice in the variance, once in the output): once per row
    # each, not once per element
    assert program_flops(s.mod) == expected + 2 * rows
    feats = featurize(load_program(s.mod, cpu_target))
    assert feats.flops == expected + 2 * rows
    assert flops_from_rows(feats.leaf_features) > 1.5 * expected  # TVM's count: the mean per element


def test_two_schedules_give_different_features(sampled):
    for name in ["matmul", "conv2d", "softmax"]:
        mats = [featurize(s.mod).leaf_features for s in sampled[name]]
        for i in range(len(mats)):
            for j in range(i + 1, len(mats)):
                same = mats[i].shape == mats[j].shape and np.array_equal(mats[i], mats[j])
                assert not same, f"{name}: schedules {i} and {j} featurize the same"


def test_annotations_change_only_their_features(tvm):
    plain, variants = _elementwise_variants()
    f0 = featurize(plain.mod).leaf_features[0]
    for prefix, sch in variants.items():
        f = featurize(sch.mod).leaf_features[0]
        changed = {FEATURE_NAMES[j] for j in np.nonzero(f != f0)[0]}
        assert f"{prefix}_num" in changed and f"{prefix}_prod" in changed
        assert all(c.startswith(prefix + "_") for c in changed), changed


@pytest.mark.slow
def test_same_program_same_output_across_processes(sampled):
    sch = sampled["conv2d"][0]
    a, b = featurize(sch.mod), Featurizer()([sch.mod])[0]
    assert a.program_hash == b.program_hash and np.array_equal(a.leaf_features, b.leaf_features)
    code = ("import sys; from cdmpp.program.features import featurize; "
            "f = featurize(sys.stdin.read()); print(f.program_hash, float(f.leaf_features.sum()))")
    out = subprocess.run([sys.executable, "-c", code], input=sch.mod.script(), capture_output=True, text=True, check=True)
    h, total = out.stdout.split()
    assert h == a.program_hash and float(total) == pytest.approx(float(a.leaf_features.sum()), rel=1e-6)


def test_two_thousand_blocks_featurize(tvm, predictor, device):
    from tvm import te

    a = te.placeholder((16,), "float32", name="A")
    x = a
    for k in range(2000):  # a chain of 2,000 stages, each its own block and buffer
        x = (lambda src, k: te.compute((16,), lambda i: src[i] * 2.0, name=f"b{k}"))(x, k)
    func = te.create_prim_func([a, x])
    feats = featurize(func)
    assert feats.n_leaves == 2000 and len(set(feats.positions.tolist())) == 2000
    (p,) = predictor.predict_features([feats], device)
    assert np.isfinite(p.seconds) and p.lo90 <= p.seconds <= p.hi90


def test_integer_work_counts_where_an_integer_value_is_stored_and_index_arithmetic_does_not():
    """An int8 matmul summed into int32 is 2*M*N*K operations (it counted 0: issue 52 item 5); the integer
    arithmetic of indices and of a float program's casts is not work. No zoo task's count changes (all
    1,024 unscheduled tasks checked when this came in), so cached rows and the shipped model stay valid."""
    from tvm import te

    from cdmpp.program import tvm_env
    from cdmpp.program.features import program_flops

    tvm = tvm_env.setup()
    a = te.placeholder((32, 16), "int8", name="A")
    b = te.placeholder((16, 24), "int8", name="B")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((32, 24), lambda i, j: te.sum(a[i, k].astype("int32") * b[k, j].astype("int32"), axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    assert program_flops(mod) == 2 * 32 * 24 * 16
    x = te.placeholder((64,), "float32", name="X")
    y = te.compute((32,), lambda i: x[i * 2 + 1] + x[i * 2], name="Y")  # int index arithmetic, one float add
    assert program_flops(tvm.IRModule({"main": te.create_prim_func([x, y])})) == 32


def test_tensor_core_intrinsics_count_their_flops_once_per_warp():
    """``tvm_mma_sync`` does 2·m·n·k FLOPs per warp (the fragment's shape from the calls that fill, load or store
    it); a warp's 32 lanes are one call. Counted in ``flops`` and in ``tensor_flops``; CPU code has none."""
    from cdmpp.program.features import tensor_core_flops
    from tests.programs import WMMA_TVMSCRIPT

    expected = 2 * 16 ** 3 * 4 * 2
    assert tensor_core_flops(load_program(WMMA_TVMSCRIPT, "cuda").mod) == expected
    f = featurize(WMMA_TVMSCRIPT, "cuda")
    assert f.flops == f.tensor_flops == expected
    sch = load_program(WMMA_TVMSCRIPT.replace("T.tvm_mma_sync(acc.data, 0, a.data, 0, b.data, 0, acc.data, 0)",
                                              'T.ptx_legacy.mma("float16", "m16n8k16", "row", "col", "fp16", "fp16", '
                                              '"fp16", a.data, 0, b.data, 0, acc.data, 0, T.bool(False))'), "cuda")
    assert tensor_core_flops(sch.mod) == 2 * 16 * 8 * 16 * 4 * 2
    from cdmpp.zoo import workloads

    assert featurize(workloads.matmul(64, 64, 64), "llvm").tensor_flops == 0.0


def test_tensor_core_flops_cross_the_sandbox_wire_checked():
    from cdmpp.sandbox.wire import decode_features, encode_features
    from tests.programs import WMMA_TVMSCRIPT

    f = featurize(WMMA_TVMSCRIPT, "cuda")
    assert decode_features(encode_features(f)).tensor_flops == f.tensor_flops
    for bad in (-1.0, 2 * f.flops, float("nan"), "1"):
        with pytest.raises(ValueError, match="tensor-core FLOPs"):
            decode_features({**encode_features(f), "tensor_flops": bad})


def test_a_cross_thread_reduction_with_a_unit_serial_loop_featurizes():
    """TVM drops serial loops of extent 1 before lowering cross-thread reductions (its SimplifyForFeatureExtraction):
    with the loop gone the reduction keeps no in-thread buffer, one store fewer. 25 H100/H200 records of max pools
    did not featurize ("compact AST has 2 leaves but TVM extracted 1 feature rows") until the AST did the same."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup(1)
    from tvm import te

    a = te.placeholder((64, 3, 3), name="a")  # a 3x3 max pool's reduction, fused as MetaSchedule's rule fuses it
    r0, r1 = te.reduce_axis((0, 3), name="r0"), te.reduce_axis((0, 3), name="r1")
    out = te.compute((64,), lambda i: te.max(a[i, r0, r1], axis=[r0, r1]), name="red")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, out])}))
    i, k0, k1 = sch.get_loops(sch.get_sblock("red"))
    _, inner = sch.split(sch.fuse(k0, k1), factors=[1, 32])  # a serial part of extent 1, the rest across threads
    sch.bind(i, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")
    f = featurize(sch.mod, "cuda")
    assert f.n_leaves == 1 and f.flops == 64 * 9
