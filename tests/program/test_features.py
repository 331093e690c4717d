"""Leaf features of real TVM programs."""

import subprocess
import sys

import numpy as np
import pytest

from cdmpp.program.compact_ast import END, build_compact_ast, lower_for_features
from cdmpp.program.features import FEATURE_NAMES, N_FEATURES, Featurizer, compact_ast_of, featurize
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


@pytest.mark.slow
def test_gpu_program_featurizes(tvm):
    from cdmpp.measure import schedules
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    target = tvm_env.make_target("cuda")
    schs = schedules.sample_schedules(workloads.matmul(), target, 2, seed=0)
    feats = featurize(schs[0].mod, target)
    assert feats.leaf_features[:, FEATURE_NAMES.index("is_gpu")].min() == 1.0
    assert feats.leaf_features[:, FEATURE_NAMES.index("threadIdx_x_len")].max() > 1.0
    assert compact_ast_of(load_program(schs[0].mod, target), feats.n_leaves).n_leaves == feats.n_leaves


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
