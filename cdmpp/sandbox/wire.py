"""What passes between the sandbox's parent and its workers, and the errors both sides name.

Wire protocol (pipes, 4-byte big-endian length + JSON; no pickle from worker to parent, so a subverted
worker cannot run code in the parent through its answers): parent → ``{"items", "indices", "kind",
"workload", "tvmscript", "build"?}`` (``build``: a CPU target dict to build each program for, when the model reads
the built programs' instruction counts); worker → ``{"feats": [{"rows": base64 float32, "n", "positions", "flops",
"hash", "loops"?: base64 float32 [n_loops, 3], "tensor_flops"?, "asm"?: [N_COUNTS numbers] or null}], "errors":
[[index, reason]], "parse_s", "feat_s", "retiring"}``; before it, when asked to build, ``BUILDING`` (parsing and
featurizing are over, so a CPU limit reached now is the build's). ``loops``, ``tensor_flops`` and ``asm`` are
optional both ways: features without them travel as before."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np


BUILDING = {"phase": "build"}

MAX_MESSAGE = 1 << 30  # bytes of one worker answer (1,024 programs of 100 leaves: ~90 MB)


TVMSCRIPT_OFF = ("TVMScript input is off on this server: it is parsed by running Python. Send the "
                 "MetaSchedule workload + trace form, or start the server with --allow-tvmscript "
                 "(CDMPP_ALLOW_TVMSCRIPT=1) if every caller is trusted")


NO_COMPUTATION = ("program computes nothing: no buffer store is left to featurize (only loops that never run "
                  "or constant stores), so there is no latency to predict")


class Cancelled(RuntimeError):
    """The request was cancelled or ran past its deadline; its busy workers were killed."""



def is_tvmscript(item: Any) -> bool:
    """A text item that is not JSON: TVMScript (the only wire form that is evaluated as Python)."""
    return isinstance(item, str) and not item.lstrip().startswith("{")


NONFINITE = ("program's features are not finite numbers (a loop extent, buffer size or FLOP count overflows), "
             "so the model cannot predict it")


def nonfinite(f) -> str | None:
    """Why ``f`` (ProgramFeatures) cannot go to a model or a cache, if it cannot: NaN or inf anywhere."""
    loops, tensor = getattr(f, "loops", None), getattr(f, "tensor_flops", None)
    if not (np.isfinite(f.flops) and np.isfinite(f.leaf_features).all()
            and (loops is None or np.isfinite(loops).all()) and (tensor is None or np.isfinite(tensor))):
        return NONFINITE
    return None


def decode_features(f: dict):
    """ProgramFeatures from a worker's answer, checked as untrusted input: types, shapes, sizes. (Finite
    values are checked by the caller with ``nonfinite``, to name the item.)"""
    from cdmpp.program.features import N_FEATURES, ProgramFeatures

    if not isinstance(f, dict) or not isinstance(f.get("n"), int) or not isinstance(f.get("hash"), str) \
            or not isinstance(f.get("flops"), (int, float)) or not isinstance(f.get("positions"), list):
        raise ValueError("feature record of the wrong types")
    n = int(f["n"])
    rows = np.frombuffer(base64.b64decode(f["rows"], validate=True), dtype="<f4")
    if n < 0 or rows.size != n * N_FEATURES:
        raise ValueError(f"feature rows of {rows.size} values for {n} leaves")
    pos = np.asarray(f["positions"], dtype=np.int64)
    if pos.shape != (n,):
        raise ValueError("positions do not match the leaves")
    loops = None
    if f.get("loops") is not None:
        loops = np.frombuffer(base64.b64decode(f["loops"], validate=True), dtype="<f4")
        if loops.size % 3:
            raise ValueError(f"loop tokens of {loops.size} values: expected 3 per loop")
        loops = loops.reshape(-1, 3).astype(np.float32)
    tensor = f.get("tensor_flops", 0.0)
    if not isinstance(tensor, (int, float)) or not tensor >= 0.0 or tensor > f["flops"]:  # NaN FLOPs: nonfinite
        raise ValueError("tensor-core FLOPs that are not a number between 0 and the program's FLOPs")
    return ProgramFeatures(rows.reshape(n, N_FEATURES).astype(np.float32), pos, float(f["flops"]),
                           str(f["hash"])[:64], loops, float(tensor), decode_counts(f.get("asm")))


MAX_COUNT = 1e9  # instructions of one class in one built program: far above any real build's


def decode_counts(asm) -> np.ndarray | None:
    """A worker's instruction counts of a built program (``cdmpp.program.assembly``), checked as untrusted input:
    None (not built), or ``N_COUNTS`` whole numbers in [0, ``MAX_COUNT``]."""
    from cdmpp.program.assembly import N_COUNTS

    if asm is None:
        return None
    if not isinstance(asm, list) or len(asm) != N_COUNTS or not all(isinstance(x, (int, float)) for x in asm):
        raise ValueError(f"instruction counts that are not a list of {N_COUNTS} numbers")
    c = np.asarray(asm, dtype=np.float64)
    if not (np.all(c >= 0) and np.all(c <= MAX_COUNT) and np.all(c == np.round(c))):
        raise ValueError(f"instruction counts that are not whole numbers in [0, {MAX_COUNT:.0e}]")
    return c


def encode_features(f) -> dict:
    out = {"rows": base64.b64encode(np.ascontiguousarray(f.leaf_features, dtype="<f4").tobytes()).decode(),
           "n": f.n_leaves, "positions": [int(p) for p in f.positions], "flops": f.flops, "hash": f.program_hash,
           "tensor_flops": f.tensor_flops or 0.0}
    loops = getattr(f, "loops", None)
    if loops is not None:
        out["loops"] = base64.b64encode(np.ascontiguousarray(loops, dtype="<f4").tobytes()).decode()
    asm = getattr(f, "asm", None)
    if asm is not None:
        out["asm"] = [float(x) for x in asm]
    return out
