"""``compact_ast.walk`` (one fast pass for the compact AST and the FLOPs) against the plain walks it
replaced, kept here as the reference: same nodes, leaf positions and FLOP count on sampled programs."""

import pytest

from cdmpp.program.compact_ast import END, Node, lower_for_features, walk

_NOT_FLOPS = frozenset({"if_then_else", "likely", "reinterpret", "tvm_access_ptr", "call_extern", "call_pure_extern",
                        "call_llvm_intrin", "call_llvm_pure_intrin", "ret", "undef"})


def reference_flops(mod) -> float:
    from tvm import s_tir, tirx

    arith = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.FloorDiv, tirx.Mod, tirx.FloorMod, tirx.Min, tirx.Max)
    total = 0.0

    def is_float(x):
        return str(getattr(x, "ty", getattr(x, "dtype", ""))).removeprefix("T.").startswith(("float", "bfloat"))

    def count(v, ext):
        n = 1.0
        for h in v:
            n *= ext[h]
        return n

    def expr(x, ext):
        kind = type(x).__name__
        if isinstance(x, arith):
            (va, fa), (vb, fb) = expr(x.a, ext), expr(x.b, ext)
            v = va | vb
            return v, fa + fb + (count(v, ext) if is_float(x) else 0.0)
        if kind == "Var":
            h = x.__chandle__()
            return (frozenset((h,)) if h in ext else frozenset()), 0.0
        if kind in ("TensorLoad", "BufferLoad"):
            v = frozenset()
            for i in x.indices:
                v = v | expr(i, ext)[0]
            return v, 0.0
        if kind == "Call":
            kids, op = list(x.args), str(getattr(x.op, "name", "")).rsplit(".", 1)[-1]
        elif isinstance(x, tirx.Select):
            kids, op = [x.condition, x.true_value, x.false_value], None
        elif isinstance(x, tirx.Let):
            kids, op = [x.value, x.body], None
        elif hasattr(x, "a"):
            kids, op = [x.a] + ([x.b] if hasattr(x, "b") else []), None
        elif hasattr(x, "value") and not isinstance(x, (tirx.IntImm, tirx.FloatImm)):
            kids, op = [x.value], None
        else:
            return frozenset(), 0.0
        v, f = frozenset(), 0.0
        for k in kids:
            vk, fk = expr(k, ext)
            v, f = v | vk, f + fk
        if op is not None and op not in _NOT_FLOPS and is_float(x):
            f += count(v, ext)
        return v, f

    def visit(stmt, mult, ext):
        nonlocal total
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, mult, ext)
        elif isinstance(stmt, s_tir.SBlockRealize):
            visit(stmt.block, mult, ext)
        elif isinstance(stmt, s_tir.SBlock):
            inner = {}
            for iv in stmt.iter_vars:
                e = iv.dom.extent
                inner[iv.var.__chandle__()] = float(e.value) if isinstance(e, tirx.IntImm) else 1.0
            visit(stmt.body, mult * count(frozenset(ext), ext), inner)
        elif isinstance(stmt, tirx.BufferStore):
            total += mult * expr(stmt.value, ext)[1]
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case, mult, ext)
            if stmt.else_case is not None:
                visit(stmt.else_case, mult, ext)
        elif getattr(stmt, "body", None) is not None:
            visit(stmt.body, mult, ext)

    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            visit(func.body, 1.0, {})
    return total


def reference_ast(mod) -> tuple[list, list, list]:
    from tvm import s_tir, tirx

    first, last, names, nodes = {}, {}, {}, []
    kinds = ("serial", "parallel", "vectorized", "unrolled", "thread")

    def visit(stmt):
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, tirx.For):
            kind = int(stmt.kind)
            extent = stmt.extent.value if isinstance(stmt.extent, tirx.IntImm) else -1
            if isinstance(stmt.extent, tirx.IntImm) and extent <= 0:
                return
            if kind == 0 and extent == 1 and not stmt.annotations:
                visit(stmt.body)
                return
            name = stmt.thread_binding.thread_tag if kind == 4 and stmt.thread_binding is not None else stmt.loop_var.name
            nodes.append(Node(kinds[kind], extent, str(name)))
            visit(stmt.body)
            nodes.append(Node(END))
        elif isinstance(stmt, tirx.BufferStore):
            if isinstance(stmt.value, (tirx.IntImm, tirx.FloatImm)):
                return
            key = stmt.buffer.__chandle__()
            names[key] = stmt.buffer.name
            first.setdefault(key, len(first))
            last[key] = len(nodes)
            nodes.append(Node("store", 1, str(stmt.buffer.name)))
        elif isinstance(stmt, s_tir.SBlockRealize):
            visit(stmt.block)
        elif isinstance(stmt, s_tir.SBlock):
            if stmt.init is not None:
                visit(stmt.init)
            visit(stmt.body)
        elif isinstance(stmt, tirx.AttrStmt) and str(stmt.attr_key) in ("thread_extent", "virtual_thread"):
            iv = stmt.node
            tag = iv.thread_tag if hasattr(iv, "thread_tag") else str(stmt.attr_key)
            nodes.append(Node("scope", stmt.value.value if isinstance(stmt.value, tirx.IntImm) else -1, str(tag)))
            visit(stmt.body)
            nodes.append(Node(END))
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case)
            if stmt.else_case is not None:
                visit(stmt.else_case)
        elif hasattr(stmt, "body") and stmt.body is not None:
            visit(stmt.body)

    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            visit(func.body)
    order = sorted(first, key=first.get)
    return nodes, [last[b] for b in order], [names[b] for b in order]


@pytest.mark.parametrize("name", ["matmul", "conv2d", "softmax", "layer_norm", "fused_elementwise"])
def test_walk_matches_the_reference_walks(sampled, name):
    from tvm.s_tir import Schedule

    from cdmpp.zoo import workloads

    schs = sampled[name]
    mods = [workloads.SAMPLES[name]()] + [s.mod for s in schs]
    if name == "layer_norm":  # the mean inlined: its expression recurs in the variance and the output
        s = Schedule(mods[0])
        s.compute_inline(s.get_sblock("X_mean"))
        mods.append(s.mod)
    for mod in mods:
        for m in (mod, lower_for_features(mod)):
            ast, flops = walk(m)
            assert flops == reference_flops(m)
            assert (ast.nodes, ast.leaf_positions, ast.leaf_buffers) == reference_ast(m)
            assert walk(m, flops=False)[0].nodes == ast.nodes and walk(m, ast=False) == (None, flops)
