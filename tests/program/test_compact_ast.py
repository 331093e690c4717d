"""The compact AST: one leaf per stored buffer."""

from cdmpp.program.compact_ast import build_compact_ast
from cdmpp.program.features import featurize
from cdmpp.program.inputs import load_program


def _concat_and_empty(tvm):
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def concat(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32"), C: T.Buffer((32,), "float32")):
        for i in range(16):
            with T.sblock("a"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] + T.float32(1)
        for i in range(16):
            with T.sblock("b"):
                vi = T.axis.spatial(16, i)
                C[vi + 16] = B[vi] * T.float32(2)

    @T.prim_func(s_tir=True)
    def never_runs(A: T.Buffer((16,), "float32"), C: T.Buffer((16,), "float32")):
        for i in range(0):
            with T.sblock("a"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] + T.float32(1)

    @T.prim_func(s_tir=True)
    def negative_extent(A: T.Buffer((16,), "float32"), C: T.Buffer((16,), "float32")):
        for i in range(-5):
            with T.sblock("a"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] + T.float32(1)
        for i in range(16):
            with T.sblock("b"):
                vi = T.axis.spatial(16, i)
                C[vi] = A[vi] * T.float32(2)

    return concat, never_runs, negative_extent


def test_sibling_stores_into_one_buffer_are_one_leaf(tvm):
    """A concat: two loops store into C. TVM gives one row per stored buffer (the last store's), so
    the compact AST has one leaf, at the second store."""
    concat, _, _ = _concat_and_empty(tvm)
    prog = load_program(concat)
    feats = featurize(prog)
    assert feats.n_leaves == 1
    ast = build_compact_ast(prog.mod)
    stores = [i for i, n in enumerate(ast.nodes) if n.kind == "store"]
    assert len(stores) == 2 and list(feats.positions) == [stores[1]]
