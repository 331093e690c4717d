"""The compact AST: one leaf per stored buffer."""

from cdmpp.program.compact_ast import build_compact_ast
from cdmpp.program.features import featurize
from cdmpp.program.inputs import load_program
from tests.programs import concat_and_empty


def test_sibling_stores_into_one_buffer_are_one_leaf(tvm):
    """A concat: two loops store into C. TVM gives one row per stored buffer (the last store's), so
    the compact AST has one leaf, at the second store."""
    concat, _, _ = concat_and_empty(tvm)
    prog = load_program(concat)
    feats = featurize(prog)
    assert feats.n_leaves == 1
    ast = build_compact_ast(prog.mod)
    stores = [i for i, n in enumerate(ast.nodes) if n.kind == "store"]
    assert len(stores) == 2 and list(feats.positions) == [stores[1]]


def test_loop_tokens_of_a_tiled_matmul_match_its_compact_ast(cpu_target):
    """``ProgramFeatures.loops`` lists the compact AST's loops and scopes in pre-order (kind, log2(extent
    + 1), position), and the loops above the matmul's update store multiply to its 128³ iterations."""
    import numpy as np
    import pytest

    from cdmpp.measure.schedules import sample_schedules
    from cdmpp.program.compact_ast import END, TOKEN_KINDS
    from cdmpp.program.features import compact_ast_of
    from cdmpp.zoo.workloads import matmul

    sch = sample_schedules(matmul(), cpu_target, 1, seed=3)[0]
    prog = load_program(sch.mod, cpu_target)
    feats = featurize(prog)
    ast = compact_ast_of(prog, expected_leaves=feats.n_leaves)
    loops = [(pos, n) for pos, n in enumerate(ast.nodes) if n.kind not in ("store", END)]
    assert feats.loops.dtype == np.float32 and feats.loops.shape == (len(loops), 3)
    assert len(loops) == sum(n.kind == END for n in ast.nodes) >= 4  # tiled: i and j split, plus k
    for (pos, n), (kind, log_extent, p) in zip(loops, feats.loops):
        assert TOKEN_KINDS[int(kind)] == n.kind and int(p) == pos
        assert log_extent == pytest.approx(np.log2(n.extent + 1))
    assert not set(feats.loops[:, 2].astype(int).tolist()) & set(feats.positions.tolist())
    stack, trips = [], {}
    for pos, n in enumerate(ast.nodes):
        if n.kind == END:
            stack.pop()
        elif n.kind == "store":
            trips[pos] = int(np.prod(stack))
        else:
            stack.append(n.extent)
    assert max(trips[p] for p in ast.leaf_positions) == 128 ** 3  # the update (into a cache stage, if any)
