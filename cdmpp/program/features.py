"""Leaf features of a scheduled program: one TVM per-store feature row per compact-AST leaf.

``featurize`` returns ``ProgramFeatures``: the leaf feature matrix, each leaf's pre-order position,
the program's FLOP count, a stable hash and the compact AST's loops (for models that read them as tokens). Feature values come from MetaSchedule's own
``PerStoreFeature`` extractor (164 values per row; names and meaning in ``FEATURE_NAMES`` and
docs/features.md); the compact AST (``cdmpp.program.compact_ast``) supplies the positions. Row *i* belongs to
leaf *i* by construction (one leaf per stored buffer, in first-store order); ``featurize`` checks that
the counts agree and raises ``ProgramError`` if they ever do not.

FLOPs (``program_flops``) are counted on the scheduled module's *blocks*, not on its loop nests nor on
TVM's per-store op counts: each floating-point operation of a block counts once per distinct value of
the block iterators it depends on. So a ``compute_at`` tile or a cache stage never multiplies work,
and an expression that ``compute_inline`` leaves inside a reduction but that does not depend on the
reduction (a layer norm's mean inside its variance) counts as LLVM computes it, hoisted; work a
schedule really repeats (an exp inlined into two consumers, an rfactor's final pass) counts. TVM's
op counts multiplied by the loop trip count gave some layer norms 2-3x their FLOPs and data-movement
ops (concatenate: only selects) up to 10^4x (issue 19).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from cdmpp.program import tvm_env
from cdmpp.program.compact_ast import CompactAST, build_compact_ast, lower_for_features, walk
from cdmpp.program.inputs import Program, ProgramError, load_program

FEATURIZER_VERSION = "2"  # 2: FLOPs counted on blocks (program_flops); the rows are those of version 1
ROWS_COMPATIBLE_VERSIONS = ("1",)  # cached rows of these versions are reused; only their FLOPs are recounted


def _feature_names() -> list[str]:
    """Column names of TVM's PerStoreFeature (buffers_per_store=5, 10 intensity samples)."""
    names = [f"{t}_{op}" for t in ("float", "int") for op in
             ("mad", "addsub", "mul", "divmod", "cmp", "math_func", "other_func")]
    names += ["bool_op", "select_op"]
    positions = ["none", "inner_spatial", "middle_spatial", "outer_spatial", "inner_reduce",
                 "middle_reduce", "outer_reduce", "mixed"]
    for ann in ("vec", "unroll", "parallel"):
        names += [f"{ann}_num", f"{ann}_prod", f"{ann}_len"] + [f"{ann}_pos_{p}" for p in positions]
    names += ["is_gpu", "blockIdx_x_len", "blockIdx_y_len", "blockIdx_z_len", "threadIdx_x_len",
              "threadIdx_y_len", "threadIdx_z_len", "vthread_len"]
    for b in range(5):
        names += [f"B{b}_{n}" for n in (
            "acc_read", "acc_write", "acc_readwrite", "bytes", "unique_bytes", "lines", "unique_lines",
            "reuse_loop_multiple_read", "reuse_serial_multiple_read_write", "reuse_none",
            "reuse_dis_iter", "reuse_dis_bytes", "reuse_ct", "bytes_d_reuse_ct",
            "unique_bytes_d_reuse_ct", "lines_d_reuse_ct", "unique_lines_d_reuse_ct", "stride")]
    names += [f"arith_intensity_{i}" for i in range(10)]
    names += ["alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod"]
    names += ["outer_prod", "num_loops", "auto_unroll_max_step"]
    return names


FEATURE_NAMES = _feature_names()
N_FEATURES = len(FEATURE_NAMES)  # 164
_FLOAT_OP_COLUMNS = slice(0, 7)  # float mad/addsub/mul/divmod/cmp/math/other, log2(x+1)-scaled


@dataclass
class ProgramFeatures:
    """What the predictor sees of one program."""

    leaf_features: np.ndarray  # float32 [n_leaves, N_FEATURES]
    positions: np.ndarray  # int64 [n_leaves]: pre-order index of each leaf in the compact AST
    flops: float
    program_hash: str
    # float32 [n_loops, 3]: the compact AST's loops and scopes (kind index, log2(extent + 1), pre-order
    # position; ``CompactAST.loop_tokens``), for models with ``loop_tokens``. None where features were
    # stored without them (older caches and pickles; ``cdmpp.records.dataset.attach_loops`` adds them).
    loops: np.ndarray | None = None
    # FLOPs done by tensor-core intrinsics (part of ``flops``; ``tensor_core_flops``): 0 in CPU code; None where
    # features were cached before they were counted (``cdmpp.records.dataset`` recounts a GPU program's)
    tensor_flops: float | None = 0.0
    # float64 [N_COUNTS]: instruction-class counts of the program built for the target it is asked about
    # (``cdmpp.program.assembly``; one program has one per build key, so ``cdmpp.records.dataset`` gives each
    # measured program a copy with its device's); None where it was not built
    asm: np.ndarray | None = None
    # float64 [N_COUNTS]: the same classes over the build's innermost loops (``assembly.instruction_counts``), for a
    # model trained with them (``TrainConfig.assembly_inner``; a study: reports/assembly-counts.md); None elsewhere
    asm_inner: np.ndarray | None = None

    @property
    def n_leaves(self) -> int:
        return int(self.leaf_features.shape[0])


def program_hash(mod) -> str:
    """Structural hash of the scheduled module: equal programs hash equal across processes."""
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(mod) & (2**64 - 1):016x}"


def flops_from_rows(rows: np.ndarray) -> float:
    """TVM's own count: its per-store float op counts (log2(x+1) undone), which multiply each store's
    ops by the trip count of the loops around it, recomputation and all. Kept for comparison;
    ``ProgramFeatures.flops`` is ``program_flops``."""
    if rows.size == 0:
        return 0.0
    return float(np.rint(np.sum(np.exp2(rows[:, _FLOAT_OP_COLUMNS].astype(np.float64)) - 1.0)))


def program_flops(mod) -> float:
    """Floating-point operations of a (scheduled or not) TIR module, counted per block.

    For every store in a block, every float ``+ - * / min max`` and float math call (exp, rsqrt, ...)
    of the stored value counts once per distinct value of the block iterators it depends on
    (through buffer indices), times the instances of enclosing blocks. A multiply-add is 2. Selects
    (padding, concatenation) and casts are not FLOPs. Where an integer is stored (int8 products summed
    into int32), its integer arithmetic counts the same way: operations beside FLOPs. On an unscheduled workload this is the usual
    count (2*M*N*K for a matmul); a schedule's loops, tiles and cache stages do not change it.
    The walk that counts them (``cdmpp.program.compact_ast.walk``) also builds the compact AST.
    """
    return walk(mod, ast=False)[1]


_MMA_SHAPE = re.compile(r"m(\d+)n(\d+)k(\d+)")
_FRAGMENT_CALLS = ("tvm_fill_fragment", "tvm_load_matrix_sync", "tvm_store_matrix_sync")  # (fragment, m, n, k, ...)
_WMMA_CALLS = ("tvm_mma_sync", "tvm_bmma_sync")  # (the accumulator fragment, ...): its shape from _FRAGMENT_CALLS
_PTX_MMA_CALLS = ("tirx.ptx_legacy.mma", "tirx.ptx.mma")  # warp-wide mma.sync with an "mMnNkK" shape argument
_WARP = 32  # tensor-core intrinsics are warp-wide: the 32 lanes of threadIdx.x make one call


def flops_and_tensor_flops(mod, is_gpu: bool, block_flops: float | None = None) -> tuple[float, float]:
    """``(flops, tensor_flops)`` as ``ProgramFeatures`` holds them: the blocks' FLOPs (``program_flops``, or
    ``block_flops`` where the caller's walk counted them) plus, in GPU code, those of tensor-core intrinsics
    (``tensor_core_flops``), and the latter alone."""
    tensor = tensor_core_flops(mod) if is_gpu else 0.0
    return (program_flops(mod) if block_flops is None else block_flops) + tensor, tensor


def tensor_core_flops(mod) -> float:
    """FLOPs done by tensor-core intrinsics in a (lowered or scheduled) GPU module: 2·m·n·k per warp-wide
    ``tvm_mma_sync`` / ``tvm_bmma_sync`` (m, n, k: the accumulator fragment's shape, from the fragment calls
    that fill, load or store it) and per PTX ``mma`` (its ``mMnNkK`` shape argument), times the instances of the
    loops and thread scopes around the call, a warp's lanes (``threadIdx.x``, 32 of them) counted once. ``walk``
    counts only the values blocks store, and these intrinsics store nothing it sees (a 4096³ fp16 dense on wmma
    counted 0; this counts its 2·4096³)."""
    from tvm import s_tir, tirx

    shapes: dict[str, tuple[int, int, int]] = {}
    calls: list[tuple[object, float]] = []

    def const(x) -> float | None:
        return float(x.value) if isinstance(x, tirx.IntImm) else None

    def threads(tag: str, extent) -> float:
        n = const(extent) or 1.0
        return max(n / _WARP, 1.0) if tag == "threadIdx.x" else n

    def visit(stmt, mult: float) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq[:]:
                visit(s, mult)
        elif isinstance(stmt, tirx.For):
            bound = stmt.thread_binding if int(stmt.kind) == 4 else None  # 4: thread-bound (a scheduled module)
            visit(stmt.body, mult * threads(bound.thread_tag if bound is not None else "", stmt.extent))
        elif isinstance(stmt, tirx.AttrStmt) and str(stmt.attr_key) in ("thread_extent", "virtual_thread"):
            visit(stmt.body, mult * threads(str(getattr(stmt.node, "thread_tag", "")), stmt.value))
        elif isinstance(stmt, s_tir.SBlockRealize):
            visit(stmt.block, mult)
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case, mult)
            if stmt.else_case is not None:
                visit(stmt.else_case, mult)
        elif isinstance(stmt, tirx.Evaluate) and type(stmt.value).__name__ == "Call":
            call = stmt.value
            op = str(getattr(call.op, "name", ""))
            name = op.rsplit(".", 1)[-1]
            if name in _FRAGMENT_CALLS and len(call.args) > 3:
                dims = [const(a) for a in call.args[1:4]]
                if all(dims):
                    shapes[str(call.args[0])] = tuple(int(d) for d in dims)
            elif name in _WMMA_CALLS or op in _PTX_MMA_CALLS:
                calls.append((call, mult))
        elif getattr(stmt, "body", None) is not None:  # Let, Attr, Allocate, DeclBuffer, Assert, While, SBlock
            visit(stmt.body, mult)

    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            visit(func.body, 1.0)
    total = 0.0
    for call, mult in calls:
        if str(call.op.name) in _PTX_MMA_CALLS:
            found = [_MMA_SHAPE.fullmatch(str(a.value)) for a in call.args if type(a).__name__ == "StringImm"]
            shape = next((tuple(int(g) for g in m.groups()) for m in found if m), None)
        else:
            shape = shapes.get(str(call.args[0]))
        if shape:
            total += 2.0 * shape[0] * shape[1] * shape[2] * mult
    return total


class Featurizer:
    """Featurizes batches of programs; keeps one TVM extractor and tuning context per target."""

    def __init__(self, num_threads: int = 1):
        self.num_threads = num_threads
        self._contexts: dict[str, object] = {}
        tvm_env.setup()
        from tvm.s_tir import meta_schedule as ms

        self._ms = ms
        self._extractor = ms.feature_extractor.PerStoreFeature()

    def _context(self, target):
        key = str(target)
        if key not in self._contexts:
            self._contexts[key] = self._ms.TuneContext(target=target, num_threads=self.num_threads)
        return self._contexts[key]

    def __call__(self, programs, target="llvm") -> list[ProgramFeatures]:
        progs = [p if isinstance(p, Program) else load_program(p, target) for p in programs]
        out: list[ProgramFeatures] = []
        by_target: dict[str, list[int]] = {}
        for i, p in enumerate(progs):
            by_target.setdefault(str(p.target), []).append(i)
        result: list[ProgramFeatures | None] = [None] * len(progs)
        for idx in by_target.values():
            rows = self._extract([progs[i] for i in idx])
            for i, r in zip(idx, rows):
                result[i] = self._assemble(progs[i], r)
        out.extend(result)  # type: ignore[arg-type]
        return out

    def from_candidates(self, context, candidates, with_hash: bool = True) -> list[ProgramFeatures]:
        """Features of MetaSchedule ``MeasureCandidate``s inside a tuner: the candidates' own schedules
        (none rebuilt) and the tuning context's thread count, as MetaSchedule's own cost models do.
        ``with_hash=False`` leaves ``program_hash`` empty: scoring a tuner's batch needs no hash, and a
        structural hash costs about as much per program as the model's forward pass."""
        try:
            tensors = self._extractor.extract_from(context, candidates)
        except Exception as e:
            raise ProgramError(f"feature extraction failed: {str(e).strip().splitlines()[-1][:300]}") from None
        return [self._assemble(Program(c.sch.mod, context.target), t.numpy().astype(np.float32), with_hash)
                for c, t in zip(candidates, tensors)]

    def _extract(self, progs: list[Program]) -> list[np.ndarray]:
        ms = self._ms
        from tvm.s_tir import Schedule

        cands = []
        for p in progs:
            try:
                cands.append(ms.MeasureCandidate(Schedule(p.mod), ms.arg_info.ArgInfo.from_prim_func(p.mod["main"])))
            except Exception as e:
                raise ProgramError(f"program is not a valid scheduled PrimFunc: {str(e).strip().splitlines()[-1][:300]}") from None
        try:
            tensors = self._extractor.extract_from(self._context(progs[0].target), cands)
        except Exception as e:
            raise ProgramError(f"feature extraction failed: {str(e).strip().splitlines()[-1][:300]}") from None
        return [t.numpy().astype(np.float32) for t in tensors]

    @staticmethod
    def _assemble(p: Program, rows: np.ndarray, with_hash: bool = True) -> ProgramFeatures:
        ast, flops = walk(p.mod)  # one pass for both: a cost model assembles thousands of programs
        if p.is_gpu or ast.n_leaves != rows.shape[0]:
            ast = compact_ast_of(p, expected_leaves=rows.shape[0])
        flops, tensor = flops_and_tensor_flops(p.mod, p.is_gpu, flops)
        return ProgramFeatures(rows, np.asarray(ast.leaf_positions, dtype=np.int64), flops,
                               program_hash(p.mod) if with_hash else "", ast.loop_tokens(), tensor)


def compact_ast_of(p: Program, expected_leaves: int | None = None) -> CompactAST:
    """The compact AST, walked on the scheduled module when that agrees with TVM's rows (CPU), else on
    the module after TVM's feature passes (which GPU programs always need: thread-binding unification)."""
    if not p.is_gpu:
        ast = build_compact_ast(p.mod)
        if expected_leaves is None or ast.n_leaves == expected_leaves:
            return ast
    ast = build_compact_ast(lower_for_features(p.mod))
    if expected_leaves is not None and ast.n_leaves != expected_leaves:  # as TVM lowers it: unit loops dropped
        ast = build_compact_ast(lower_for_features(p.mod, drop_unit_loops=True))
    if expected_leaves is not None and ast.n_leaves != expected_leaves:
        raise ProgramError(f"compact AST has {ast.n_leaves} leaves but TVM extracted {expected_leaves} feature rows")
    return ast


_DEFAULT: Featurizer | None = None


def featurize(program, target="llvm") -> ProgramFeatures:
    """Featurize one program given in any form ``load_program`` accepts."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Featurizer()
    return _DEFAULT([program], target)[0]
