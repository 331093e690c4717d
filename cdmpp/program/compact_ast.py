"""The compact AST of a scheduled program: loops as inner nodes, buffer stores as leaves.

The walk runs on the module *after* MetaSchedule's feature-extraction pass list, so that its store
leaves are the statements TVM's ``PerStoreFeature`` sees. Rules (see docs/features.md):

* inner nodes: ``For`` loops (extent, kind) and ``thread_extent`` scopes; unit-extent serial loops
  without annotations are dropped, as TVM's own feature pass drops them;
* leaves: ``BufferStore`` statements whose value is not a constant (constant init stores are skipped);
* serialization: pre-order; an inner node is followed by its children, then by an ``END`` marker;
  a leaf's *position* is its index in that serialization.

TVM's extractor gives one feature row per distinct stored buffer, in the order of each buffer's first
non-constant store, using the *last* store to that buffer. So cdmpp keeps one leaf per stored buffer:
the last non-constant store to it. Leaves are listed in row order, which makes leaf *i* ↔ row *i*.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdmpp.program import tvm_env

FEATURE_PASSES = (
    "RemoveWeightLayoutRewriteBlock", "LowerCrossThreadReduction", "LowerInitBlock",
    "PlanAndUpdateBufferAllocationLocation", "ConvertBlocksToOpaque", "CompactBufferAllocation",
    "StmtSimplify", "LowerAutoCopy", "UnifyThreadBinding", "LowerMatchBuffer", "StmtSimplify",
)
LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread")
END = "END"


@dataclass
class Node:
    """One token of the serialization: a loop, a scope, a store leaf or the END marker."""

    kind: str  # one of LOOP_KINDS, "scope", "store", END
    extent: int = 1
    name: str = ""  # loop variable, thread tag or stored buffer


@dataclass
class CompactAST:
    nodes: list[Node] = field(default_factory=list)  # pre-order serialization
    leaf_positions: list[int] = field(default_factory=list)  # index into nodes, in feature-row order
    leaf_buffers: list[str] = field(default_factory=list)

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_positions)

    def depth(self) -> int:
        d = best = 0
        for n in self.nodes:
            if n.kind == END:
                d -= 1
            elif n.kind != "store":
                d += 1
                best = max(best, d)
        return best

    def summary(self) -> str:
        """An indented outline, one line per loop or store, for people."""
        lines, d = [], 0
        leaf_at = {p: i for i, p in enumerate(self.leaf_positions)}
        for pos, n in enumerate(self.nodes):
            if n.kind == END:
                d -= 1
                continue
            if n.kind == "store":
                tag = f"leaf {leaf_at[pos]} @ {pos}" if pos in leaf_at else f"(overwritten) @ {pos}"
                lines.append("  " * d + f"store {n.name}  [{tag}]")
            else:
                lines.append("  " * d + f"{n.kind} {n.name} x{n.extent}")
                d += 1
        return "\n".join(lines)


def feature_passes():
    """The pass list TVM's PerStoreFeature applies before extracting (per_store_feature.cc)."""
    tvm = tvm_env.setup()
    import tvm.s_tir.transform as st
    import tvm.tirx.transform as tt

    def make(name):
        if name == "RemoveWeightLayoutRewriteBlock":
            return st.RemoveWeightLayoutRewriteBlock(True)
        return getattr(st, name, None)() if hasattr(st, name) else getattr(tt, name)()

    return tvm.transform.Sequential([make(n) for n in FEATURE_PASSES])


_PASSES = None


def lower_for_features(mod):
    global _PASSES
    if _PASSES is None:
        _PASSES = feature_passes()
    return _PASSES(mod)


def build_compact_ast(lowered_mod) -> CompactAST:
    """Walk a module already passed through ``lower_for_features`` once, in pre-order."""
    tvm = tvm_env.setup()
    from tvm import s_tir, tirx

    ast = CompactAST()
    first_store: dict[object, int] = {}  # buffer → order of its first non-constant store
    last_store: dict[object, int] = {}  # buffer → position of its last non-constant store
    names: dict[object, str] = {}
    nodes = ast.nodes
    For, SeqStmt, BufferStore = tirx.For, tirx.SeqStmt, tirx.BufferStore
    SBlockRealize, SBlock, AttrStmt, IfThenElse = s_tir.SBlockRealize, s_tir.SBlock, tirx.AttrStmt, tirx.IfThenElse
    consts = (tirx.IntImm, tirx.FloatImm)

    def visit(stmt):
        if isinstance(stmt, SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, For):
            kind = int(stmt.kind)
            extent = stmt.extent.value if isinstance(stmt.extent, tirx.IntImm) else -1
            if isinstance(stmt.extent, tirx.IntImm) and extent <= 0:
                return  # a loop that never runs: TVM extracts no row for the stores inside
            if kind == 0 and extent == 1 and not stmt.annotations:
                visit(stmt.body)
                return
            name = stmt.thread_binding.thread_tag if kind == 4 and stmt.thread_binding is not None else stmt.loop_var.name
            nodes.append(Node(LOOP_KINDS[kind], extent, str(name)))
            visit(stmt.body)
            nodes.append(Node(END))
        elif isinstance(stmt, BufferStore):
            if isinstance(stmt.value, consts):
                return
            buf = stmt.buffer
            key = buf.__chandle__()  # the BufferNode, as TVM keys its rows (``buf.data`` is a new object each time)
            names[key] = buf.name
            first_store.setdefault(key, len(first_store))
            last_store[key] = len(nodes)
            nodes.append(Node("store", 1, str(buf.name)))
        elif isinstance(stmt, SBlockRealize):
            visit(stmt.block)
        elif isinstance(stmt, SBlock):
            if stmt.init is not None:
                visit(stmt.init)
            visit(stmt.body)
        elif isinstance(stmt, AttrStmt) and str(stmt.attr_key) in ("thread_extent", "virtual_thread"):
            iv = stmt.node
            tag = iv.thread_tag if hasattr(iv, "thread_tag") else str(stmt.attr_key)
            extent = stmt.value.value if isinstance(stmt.value, tirx.IntImm) else -1
            nodes.append(Node("scope", extent, str(tag)))
            visit(stmt.body)
            nodes.append(Node(END))
        elif isinstance(stmt, IfThenElse):
            visit(stmt.then_case)
            if stmt.else_case is not None:
                visit(stmt.else_case)
        elif hasattr(stmt, "body") and stmt.body is not None:  # Let, Attr, Alloc, Decl, Assert, While
            visit(stmt.body)

    for _, func in lowered_mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            visit(func.body)
    order = sorted(first_store, key=first_store.get)
    ast.leaf_positions = [last_store[b] for b in order]
    ast.leaf_buffers = [names[b] for b in order]
    return ast
