"""What the compiler made of a schedule: static instruction-class counts of a program's x86 assembly.

TVM's per-store rows describe a schedule as asked (a loop marked ``vectorize``), not what LLVM made of it (the
vector width reached, spills, shuffles). The counts of the built module say that, and as program-level inputs
they take the locked random-new from 34.2 to 22.8 % and cross-model from 55.3 to 37.5 % (reports/assembly-counts.md). Only a build knows them (estimated from the rows they give nothing), and a build
is for one target: a program has one set of counts per ``build_key`` (its target without the thread count),
kept in an ``AssemblyCounts`` folder (``datasets/assembly/<build_key>/*.npz``) that ``cdmpp.records.dataset``
attaches to each measured program (``ProgramFeatures.asm``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

CLASSES = [  # (name, regex on one instruction line "mnemonic operands"); counts are static (a loop body once)
    ("all", r"."),
    ("fma_zmm", r"^vfn?m(add|sub)\w*ps\b.*%zmm"), ("fma_ymm", r"^vfn?m(add|sub)\w*ps\b.*%ymm"),
    ("fma_xmm", r"^vfn?m(add|sub)\w*ps\b.*%xmm"), ("fma_scalar", r"^vfn?m(add|sub)\w*ss\b"),
    ("arith_zmm", r"^v(add|sub|mul|div|max|min)ps\b.*%zmm"), ("arith_ymm", r"^v(add|sub|mul|div|max|min)ps\b.*%ymm"),
    ("arith_xmm", r"^v(add|sub|mul|div|max|min)ps\b.*%xmm"), ("arith_scalar", r"^v(add|sub|mul|div|max|min)ss\b"),
    ("mov_zmm", r"^vmov\w*\b.*%zmm"), ("mov_ymm", r"^vmov\w*\b.*%ymm"), ("mov_xmm", r"^vmov(ups|aps|dqu\w*|dqa\w*)\b.*%xmm"),
    ("mov_scalar", r"^vmovss\b"), ("broadcast", r"^vbroadcast"), ("gather", r"^v(p)?gather"),
    ("shuffle", r"^v(perm|shuf|insert|extract|punpck|unpck|blend|palignr|pshuf|movsh|movsl|movhl|movlh)"),
    ("spill", r"\(%rsp\)|\(%rbp\)"), ("branch", r"^j[a-z]+\b"), ("call", r"^call"),
    ("int", r"^(add|sub|imul|lea|inc|dec|cmp|test)[lq]?\b"),
]
COUNT_NAMES = [n for n, _ in CLASSES] + ["blocks"]  # the columns of a program's counts
N_COUNTS = len(COUNT_NAMES)
N_INPUTS = 2 * N_COUNTS - 2  # count_inputs: every count's log1p, each class's share of all instructions
_COMPILED = [re.compile(p) for _, p in CLASSES]


def instruction_counts(asm: str) -> tuple[np.ndarray, np.ndarray]:
    """``COUNT_NAMES`` over one module's assembly (instructions per class, basic blocks), and the same classes over
    its innermost loops' instructions (a backward jump's span holding no other: where a program spends its
    time; their number in place of basic blocks)."""
    instrs, labels, jumps = [], {}, []
    for line in asm.splitlines():
        s = line.strip()
        if s.endswith(":") and not s.startswith("#"):
            labels[s[:-1]] = len(instrs)
        elif s and not s.startswith((".", "#")):
            m = re.match(r"^j[a-z]+\s+(\.LBB\w+)", s)
            if m:
                jumps.append((len(instrs), m.group(1)))
            instrs.append(s)
    loops: dict[int, int] = {}
    for at, name in jumps:
        start = labels.get(name, at + 1)
        if start <= at:  # a backward jump: one loop per header, to its last back-edge
            loops[start] = max(loops.get(start, at), at)
    inner = [(a, b) for a, b in loops.items()
             if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops.items())]
    in_inner = np.zeros(len(instrs), bool)
    for a, b in inner:
        in_inner[a:b + 1] = True
    whole, innermost = np.zeros(N_COUNTS), np.zeros(N_COUNTS)
    whole[-1] = sum(name.startswith(".LBB") for name in labels)
    innermost[-1] = len(inner)
    for s, inside in zip(instrs, in_inner):
        hits = np.array([bool(rx.search(s)) for rx in _COMPILED], float)
        whole[:-1] += hits
        if inside:
            innermost[:-1] += hits
    return whole, innermost


def count_inputs(counts: np.ndarray | None) -> np.ndarray:
    """A program's model inputs from its counts (``N_INPUTS``): log1p of each count, and each class's share of all
    instructions (vectorization reached, spills); NaN where the program was not built (``counts`` None)."""
    if counts is None:
        return np.full(N_INPUTS, np.nan)
    c = np.asarray(counts, dtype=np.float64)
    return np.concatenate([np.log1p(c), c[1:-1] / max(c[0], 1.0)])


# CPUs whose builds give every program the counts of another's, measured (experiments/asm_same_counts.py: 500 and
# 200 programs, all 21 counts equal; the other pairs differ, e.g. rocketlake prefers ymm where znver4 takes zmm):
# their programs are built once, under that CPU's key
SAME_COUNTS = {"znver5": "znver4", "core-avx2": "x86-64-v3"}


def build_key(target: dict) -> str:
    """Which build a device's programs share: its target's kind, CPU and attributes, not its thread count (the
    1- and 2-thread devices of a chip run one build; CPUs of ``SAME_COUNTS`` too). E.g. ``llvm-znver4``."""
    mcpu = target.get("mcpu", "")
    parts = [target.get("kind", "llvm"), SAME_COUNTS.get(mcpu, mcpu)]
    attrs = target.get("mattr") or []
    parts += sorted(attrs) if isinstance(attrs, (list, tuple)) else [str(attrs)]
    return "-".join(p.strip("+").replace(",", "-") for p in parts if p)


def build_counts(mod, target) -> tuple[np.ndarray, np.ndarray]:
    """``instruction_counts`` (the whole module's, its innermost loops') of ``mod`` built by ``tvm.compile`` for
    ``target`` (an x86 LLVM target: the classes are x86 mnemonics). Raises what the build raises."""
    import tvm

    return instruction_counts(tvm.compile(mod, target=target).mod.inspect_source("asm"))


def with_counts(features, mod, target):
    """``features`` (``ProgramFeatures``) with the counts of ``mod`` built for ``target`` (a dict or ``Target``) as
    ``asm``; as they are (``asm`` None: not built) where the build fails. How a prediction gets the counts a model
    trained with them reads: each asked program is built once for the device's target (~0.3 s)."""
    import dataclasses

    import tvm

    try:
        counts = build_counts(mod, target if isinstance(target, tvm.target.Target) else tvm.target.Target(target))[0]
    except Exception:  # noqa: BLE001 - a program that does not build is predicted without counts (flagged)
        return features
    return dataclasses.replace(features, asm=counts)


class AssemblyCounts:
    """The counts built so far, per build key: ``root/<build_key>/*.npz``, each file ``hashes`` (program hashes)
    and ``counts [n, N_COUNTS]`` and/or ``inner`` (the innermost loops', NaN where not kept; read only by a study's
    ``TrainConfig.assembly_inner``). Files are parts written by separate build jobs; a program built twice keeps its
    first file's counts (same build)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._tables: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def table(self, key: str, field: str = "counts") -> dict[str, np.ndarray]:
        """Program hash → counts (``field`` "inner": the innermost loops') of one build key (read once; empty where
        nothing was built for it)."""
        if (key, field) not in self._tables:
            out: dict[str, np.ndarray] = {}
            for path in sorted((self.root / key).glob("*.npz")) if (self.root / key).is_dir() else []:
                with np.load(path, allow_pickle=False) as z:
                    if field not in z.files:
                        continue
                    if z[field].shape[1:] != (N_COUNTS,):
                        raise ValueError(f"{path}: {field} of shape {z[field].shape}, expected [n, {N_COUNTS}] "
                                         f"(cdmpp.program.assembly.COUNT_NAMES)")
                    for h, c in zip(z["hashes"].tolist(), z[field]):
                        if not np.isnan(c).any():
                            out.setdefault(str(h), c)
            self._tables[(key, field)] = out
        return self._tables[(key, field)]

    def inner_table(self, key: str) -> dict[str, np.ndarray]:
        """Program hash → its innermost loops' counts, where a build kept them."""
        return self.table(key, "inner")

    def get(self, program_hash: str, key: str) -> np.ndarray | None:
        return self.table(key).get(program_hash)
