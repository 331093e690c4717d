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
