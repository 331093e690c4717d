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

``walk`` builds the compact AST and counts the program's FLOPs (``features.program_flops``) in one
pass: a cost model does both for every candidate a tuner asks about, and the walk, through TVM's FFI,
is most of what cdmpp adds to TVM's own feature extraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cdmpp.program import tvm_env

FEATURE_PASSES = (
    "RemoveWeightLayoutRewriteBlock", "LowerCrossThreadReduction", "LowerInitBlock",
    "PlanAndUpdateBufferAllocationLocation", "ConvertBlocksToOpaque", "CompactBufferAllocation",
    "StmtSimplify", "LowerAutoCopy", "UnifyThreadBinding", "LowerMatchBuffer", "StmtSimplify",
)
LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread")
TOKEN_KINDS = (*LOOP_KINDS, "scope")  # kind index of a loop token (``CompactAST.loop_tokens``)
_TOKEN_INDEX = {k: i for i, k in enumerate(TOKEN_KINDS)}
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

    def loop_tokens(self) -> np.ndarray:
        """float32 ``[n_loops, 3]``: (kind index in ``TOKEN_KINDS``, log2(extent + 1), pre-order position)
        of every loop and scope, so a model can read the tree itself, not only where the leaves sit in it.
        A symbolic extent (-1) counts as 0."""
        index = _TOKEN_INDEX
        rows = [(index[n.kind], math.log2(max(n.extent, 0) + 1), pos)
                for pos, n in enumerate(self.nodes) if n.kind in index]
        return np.array(rows, dtype=np.float32).reshape(-1, 3)

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


def lower_for_features(mod, drop_unit_loops: bool = False):
    """``mod`` through ``FEATURE_PASSES``; ``drop_unit_loops``: first remove each serial loop of extent 1, as
    TVM's list does (its ``SimplifyForFeatureExtraction``, not exposed to Python). A reduction whose serial part
    has extent 1 then lowers to a cross-thread reduction alone, one store fewer: TVM's rows count that. Off by
    default: the models learned the loops as they stand, and only such programs disagree (``compact_ast_of``)."""
    global _PASSES
    if _PASSES is None:
        _PASSES = feature_passes()
    return _PASSES(_without_unit_loops(mod) if drop_unit_loops else mod)


def _without_unit_loops(mod):
    """``mod`` with every serial loop ``for v in range(1)`` (no annotations) replaced by its body, ``v`` by 0."""
    import tvm_ffi
    from tvm import tirx

    def drop(loop):
        if not (loop.kind == tirx.ForKind.SERIAL and len(loop.annotations) == 0
                and isinstance(loop.min, tirx.IntImm) and loop.min.value == 0
                and isinstance(loop.extent, tirx.IntImm) and loop.extent.value == 1):
            return loop
        var, zero = loop.loop_var, tirx.IntImm(str(loop.extent.ty), 0)
        return tvm_ffi.structural_map(loop.body, [(tirx.Var, lambda v: zero if v.same_as(var) else v)])

    return tvm_ffi.structural_map(mod, [(tirx.For, drop)])


def build_compact_ast(lowered_mod) -> CompactAST:
    """Walk a module already passed through ``lower_for_features`` once, in pre-order."""
    return walk(lowered_mod, flops=False)[0]


_NOT_FLOPS = frozenset({"if_then_else", "likely", "reinterpret", "tvm_access_ptr", "call_extern", "call_pure_extern",
                        "call_llvm_intrin", "call_llvm_pure_intrin", "ret", "undef"})

# node kinds of the walk, by exact Python type (isinstance on TVM's node classes is slow: they are ABCs)
(_SEQ, _FOR, _STORE, _REALIZE, _BLOCK, _ATTR, _IF, _BODY, _NONE) = range(9)
(_ARITH, _VAR, _LOAD, _CALL, _SELECT, _LET, _AB, _A, _VALUE, _LEAF) = range(10)
_STMT_KIND: dict[type, int] = {}
_EXPR_KIND: dict[type, int] = {}
_CONST_KIND: dict[type, int] = {}  # 2: IntImm, 1: FloatImm, 0: neither
_DTYPES: dict[int, tuple[object, str]] = {}  # PrimType handle -> (the type, kept alive; its name)
_CALL_COUNTS: dict[int, tuple[object, bool]] = {}  # op handle -> (the op; is it a FLOP when float?)


def _stmt_kind(stmt) -> int:
    from tvm import s_tir, tirx

    for cls, kind in ((tirx.SeqStmt, _SEQ), (tirx.For, _FOR), (tirx.BufferStore, _STORE),
                      (s_tir.SBlockRealize, _REALIZE), (s_tir.SBlock, _BLOCK), (tirx.AttrStmt, _ATTR),
                      (tirx.IfThenElse, _IF)):
        if isinstance(stmt, cls):
            return kind
    return _BODY if hasattr(stmt, "body") else _NONE


def _expr_kind(x) -> int:
    from tvm import tirx

    name = type(x).__name__
    if isinstance(x, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.FloorDiv, tirx.Mod, tirx.FloorMod, tirx.Min,
                      tirx.Max)):
        return _ARITH
    if name == "Var":
        return _VAR
    if name in ("TensorLoad", "BufferLoad"):
        return _LOAD
    if name == "Call":
        return _CALL
    if isinstance(x, tirx.Select):
        return _SELECT
    if isinstance(x, tirx.Let):
        return _LET
    if hasattr(x, "a"):
        return _AB if hasattr(x, "b") else _A
    if hasattr(x, "value") and not isinstance(x, (tirx.IntImm, tirx.FloatImm)):
        return _VALUE  # Cast, Broadcast
    return _LEAF


def _const_kind(t: type) -> int:
    from tvm import tirx

    return 2 if issubclass(t, tirx.IntImm) else 1 if issubclass(t, tirx.FloatImm) else 0


def _dtype(x) -> str:
    """An expression's type name, e.g. "float32" (from its ``ty``, cached by handle, else its ``dtype``)."""
    ty = getattr(x, "ty", None)
    if ty is None:
        return str(getattr(x, "dtype", "")).removeprefix("T.")
    h = ty.__chandle__()
    hit = _DTYPES.get(h)
    if hit is None:
        hit = _DTYPES[h] = (ty, str(ty).removeprefix("T."))
    return hit[1]


def _is_float(x) -> bool:
    return _dtype(x).startswith(("float", "bfloat"))


def _is_int(x) -> bool:
    return _dtype(x).startswith(("int", "uint"))


def _int_buffer(buf) -> bool:
    """An integer (not boolean) buffer: the integer arithmetic of the values stored in it is work."""
    return str(buf.dtype).startswith(("int", "uint"))


def _call_counts(x) -> bool:
    """Whether a float call of this op is a FLOP (math functions are; selects, casts and intrinsics are not)."""
    op = x.op
    h = op.__chandle__()
    hit = _CALL_COUNTS.get(h)
    if hit is None:
        hit = _CALL_COUNTS[h] = (op, str(getattr(op, "name", "")).rsplit(".", 1)[-1] not in _NOT_FLOPS)
    return hit[1]


def walk(mod, ast: bool = True, flops: bool = True) -> tuple[CompactAST | None, float]:
    """One pre-order pass over a module's statements: its compact AST (``ast``) and its block FLOP
    count (``flops``, see ``cdmpp.program.features.program_flops``), so a cost model walks each
    candidate once. A block's iterators are bits of an int mask, so an expression's iterator set
    costs one ``|``."""
    from tvm import tirx  # a module in hand: TVM is set up (tvm_env.setup costs more than a small walk)

    out = CompactAST() if ast else None
    first_store: dict[object, int] = {}  # buffer → order of its first non-constant store
    last_store: dict[object, int] = {}  # buffer → position of its last non-constant store
    names: dict[object, str] = {}
    nodes = out.nodes if ast else []
    stmt_kinds, expr_kinds, const_kinds = _STMT_KIND, _EXPR_KIND, _CONST_KIND

    def const(x) -> int:
        t = type(x)
        k = const_kinds.get(t)
        if k is None:
            k = const_kinds[t] = _const_kind(t)
        return k

    total = 0.0

    def count(mask: int, ext: list) -> float:
        n, i = 1.0, 0
        while mask:
            if mask & 1:
                n *= ext[i]
            mask >>= 1
            i += 1
        return n

    def expr(x, bits: dict, ext: list, ints: bool = False) -> tuple[int, float]:
        """(the block iterators ``x`` depends on, as a mask; the FLOPs inside ``x``). ``ints``: the value of
        an integer store, whose integer arithmetic is the work (int8 products summed into int32)."""
        t = type(x)
        kind = expr_kinds.get(t)
        if kind is None:
            kind = expr_kinds[t] = _expr_kind(x)
        if kind == _ARITH:
            va, fa = expr(x.a, bits, ext, ints)
            vb, fb = expr(x.b, bits, ext, ints)
            v = va | vb
            return v, fa + fb + (count(v, ext) if _is_float(x) or (ints and _is_int(x)) else 0.0)
        if kind == _VAR:
            return bits.get(x.__chandle__(), 0), 0.0
        if kind == _LOAD:
            v = 0
            for i in x.indices[:]:  # a slice reads an FFI array in one go; iterating it is slower
                v |= bits.get(i.__chandle__(), 0) if expr_kinds.get(type(i)) == _VAR else expr(i, bits, ext)[0]
            return v, 0.0
        if kind == _CALL:
            kids = x.args[:]
        elif kind == _SELECT:
            kids = (x.condition, x.true_value, x.false_value)
        elif kind == _LET:
            kids = (x.value, x.body)
        elif kind == _AB:
            kids = (x.a, x.b)
        elif kind == _A:
            kids = (x.a,)
        elif kind == _VALUE:
            kids = (x.value,)
        else:
            return 0, 0.0
        v, f = 0, 0.0
        for k in kids:
            vk, fk = expr(k, bits, ext, ints)
            v, f = v | vk, f + fk
        if kind == _CALL and _call_counts(x) and _is_float(x):
            f += count(v, ext)
        return v, f

    def visit(stmt, emit: bool, fl: bool, mult: float, bits: dict, ext: list) -> None:
        """``emit``: add nodes to the compact AST (not under a loop that never runs, nor with ``ast`` off);
        ``fl``: count FLOPs (not in a block's init); ``mult``: instances of the enclosing block;
        ``bits``/``ext``: its iterators (handle → bit; extents)."""
        nonlocal total
        t = type(stmt)
        kind = stmt_kinds.get(t)
        if kind is None:
            kind = stmt_kinds[t] = _stmt_kind(stmt)
        if kind == _SEQ:
            for s in stmt.seq[:]:
                visit(s, emit, fl, mult, bits, ext)
        elif kind == _FOR:
            if emit:
                loop_kind = int(stmt.kind)
                e = stmt.extent
                is_int = const(e) == 2
                extent = e.value if is_int else -1
                if is_int and extent <= 0:  # a loop that never runs: TVM extracts no row for the stores inside
                    if not fl:
                        return
                    emit = False
                elif loop_kind != 0 or extent != 1 or stmt.annotations:
                    tb = stmt.thread_binding if loop_kind == 4 else None
                    name = tb.thread_tag if tb is not None else stmt.loop_var.name
                    nodes.append(Node(LOOP_KINDS[loop_kind], extent, str(name)))
                    visit(stmt.body, emit, fl, mult, bits, ext)
                    nodes.append(Node(END))
                    return
            visit(stmt.body, emit, fl, mult, bits, ext)
        elif kind == _STORE:
            value = stmt.value
            if fl:
                total += mult * expr(value, bits, ext, _int_buffer(stmt.buffer))[1]
            if emit and not const(value):
                buf = stmt.buffer
                key = buf.__chandle__()  # the BufferNode, as TVM keys its rows (``buf.data`` is a new object each time)
                names[key] = buf.name
                first_store.setdefault(key, len(first_store))
                last_store[key] = len(nodes)
                nodes.append(Node("store", 1, str(buf.name)))
        elif kind == _REALIZE:
            visit(stmt.block, emit, fl, mult, bits, ext)
        elif kind == _BLOCK:
            if emit and stmt.init is not None:
                visit(stmt.init, True, False, mult, bits, ext)  # its stores are leaves; no FLOPs
            if not (emit or fl):
                return
            inner, inner_ext = {}, []
            if fl:
                for iv in stmt.iter_vars[:]:
                    e = iv.dom.extent
                    inner[iv.var.__chandle__()] = 1 << len(inner_ext)
                    inner_ext.append(float(e.value) if const(e) == 2 else 1.0)
            # a nested block runs once per instance of the enclosing one
            visit(stmt.body, emit, fl, mult * count((1 << len(ext)) - 1, ext), inner, inner_ext)
        elif kind == _ATTR and emit and str(stmt.attr_key) in ("thread_extent", "virtual_thread"):
            iv = stmt.node
            tag = iv.thread_tag if hasattr(iv, "thread_tag") else str(stmt.attr_key)
            v = stmt.value
            nodes.append(Node("scope", v.value if const(v) == 2 else -1, str(tag)))
            visit(stmt.body, emit, fl, mult, bits, ext)
            nodes.append(Node(END))
        elif kind == _IF:
            visit(stmt.then_case, emit, fl, mult, bits, ext)
            if stmt.else_case is not None:
                visit(stmt.else_case, emit, fl, mult, bits, ext)
        elif kind in (_BODY, _ATTR):  # Let, Attr, Alloc, Decl, Assert, While
            body = stmt.body
            if body is not None:
                visit(body, emit, fl, mult, bits, ext)

    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            visit(func.body, ast, flops, 1.0, {}, [])
    if ast:
        order = sorted(first_store, key=first_store.get)
        out.leaf_positions = [last_store[b] for b in order]
        out.leaf_buffers = [names[b] for b in order]
    return out, float(total)
