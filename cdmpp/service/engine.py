"""The CPU-bound half of a predict request: wire items → programs → features → predictions.

Why a layer over ``Predictor``: the ``Predictor`` caches features by *structural* hash, so it must
parse every program first, and parsing is the expensive part (TVMScript ~60 ms alone, ~140 ms of
thread time in a busy server; a workload+trace ~5 ms), against ~5 ms to extract features and ~0.2 ms
of model time. A compiler re-asks the same candidates many times, byte for byte; so ``PredictEngine``
keys its caches by a digest of the item as sent (plus target): features (shared across devices) and,
per device, the prediction itself, so a re-asked program costs a hash and a lookup: no parsing, no
model. It also finds the bad items of a batch: each is parsed on its own (a ``ProgramError`` names the
item), features are extracted for the batch at once and item by item only when the batch fails.
Every item is parsed and featurized in a sandbox worker (``cdmpp.sandbox.pool``), never in this process.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from cdmpp.lru import LRU
from cdmpp.predict.predictor import Prediction, Predictor, UnknownDeviceError
from cdmpp.program.inputs import TARGET_KINDS, ProgramError
from cdmpp.sandbox.pool import Sandbox
from cdmpp.sandbox.wire import Cancelled, TVMSCRIPT_OFF, is_tvmscript


NONFINITE_PREDICTION = "the model's prediction for this program is not a finite number"


class BadPrograms(ValueError):
    """Some items of a batch are not usable programs; ``errors`` holds ``(index, reason)`` pairs."""

    def __init__(self, errors: list[tuple[int, str]], total: int):
        self.errors, self.total = errors, total
        shown = "; ".join(f"program {i}: {r}" for i, r in errors[:5])
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} of {total} programs are invalid: {shown}{more}")




@dataclass
class EngineStats:
    """Counters for /metrics (monotone; read without the lock, so values may be a moment stale)."""

    prediction_hits: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    programs_featurized: int = 0
    programs_predicted: int = 0
    parse_seconds: float = 0.0
    featurize_seconds: float = 0.0
    model_seconds: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class PredictEngine:
    """Thread-safe batch prediction with a request-level feature cache (LRU, ``cache_size`` entries).

    The cached ``ProgramFeatures`` objects are the ones the ``Predictor``'s own cache holds, so the two
    caches share memory.
    """

    def __init__(self, predictor: Predictor, cache_size: int = 50_000, sandbox: Sandbox | None = None,
                 allow_tvmscript: bool = False):
        self.predictor = predictor
        self.sandbox = sandbox or Sandbox(1, kinds=tuple({predictor.target_kind(d) for d in predictor.devices()}))
        self.allow_tvmscript = allow_tvmscript
        self.cache_size = cache_size
        self.stats = EngineStats()
        self._cache = LRU(cache_size)  # item digest -> ProgramFeatures
        self._preds = LRU(cache_size)  # (digest, device, order) -> Prediction
        self._lock = threading.Lock()

    def predict(self, programs: Sequence[Any], device: str, target: str | None = None, workload: Any = None,
                cancel: threading.Event | None = None, deadline: float | None = None,
                order: bool = False) -> list[Prediction]:
        """Predictions for wire-format items (TVMScript text or workload+trace dicts) on ``device``
        (``order``: as in ``Predictor.predict``).

        A program already predicted on ``device`` is answered from the prediction cache (the model is
        fixed for the life of the server, so the answer cannot change). Raises ``UnknownDeviceError``,
        ``ProgramError`` (bad target), ``BadPrograms`` (bad items), ``Cancelled`` (``cancel`` was set or
        the monotonic ``deadline`` passed: the workers still busy on it are killed).
        """
        p = self.predictor
        if device not in p.devices():
            raise UnknownDeviceError(device, p.devices())
        kind = p.target_kind(device) if target is None else target.strip()
        if kind not in TARGET_KINDS:
            raise ProgramError(f"target {target!r} is not accepted: expected one of {', '.join(TARGET_KINDS)} "
                               "(options such as -mcpu come from the device, not the request)")
        shared = _digest(_json_bytes(workload)) if workload is not None else b""
        keys = [self._key(kind, item, shared) for item in programs]
        dev = device.encode()
        out: list = [None] * len(programs)
        todo: list[int] = []
        with self._lock:
            for i, k in enumerate(keys):
                hit = self._preds.get((k, dev, order))
                if hit is None:
                    todo.append(i)
                else:
                    out[i] = hit
            self.stats.prediction_hits += len(programs) - len(todo)
            self.stats.programs_predicted += len(programs)
        if not todo:
            return out
        feats = self.features([programs[i] for i in todo], [keys[i] for i in todo], todo, len(programs),
                              kind, workload, cancel, deadline)
        _check(cancel)
        t0 = time.perf_counter()
        preds = p.predict_features(feats, device, kind, order)
        bad = [(i, NONFINITE_PREDICTION) for i, pr in zip(todo, preds)
               if not all(math.isfinite(v) for v in (pr.seconds, pr.lo90, pr.hi90))]
        if bad:  # never cached: the same request gets the same 422
            raise BadPrograms(bad, len(programs))
        code = self._code(programs) if self.allow_tvmscript else set()
        with self._lock:
            self.stats.model_seconds += time.perf_counter() - t0
            for i, pr in zip(todo, preds):
                out[i] = pr
                if i not in code:  # from a worker that ran TVMScript: never for other callers
                    self._preds.put((keys[i], dev, order), pr)
        return out

    @staticmethod
    def _code(programs: Sequence[Any]) -> set[int]:
        """Positions of TVMScript items: their features come from workers that ran request code."""
        return {i for i, it in enumerate(programs) if is_tvmscript(it)}

    def cached(self, programs: Sequence[Any], device: str, target: str | None = None, workload: Any = None,
               order: bool = False) -> list[Prediction | None] | None:
        """Each program's cached prediction, None where there is none: a hash and a lookup per item, no
        sandbox, no model, so the server answers a wholly cached request without queueing it behind new
        work, and weighs the rest by its new programs (``cdmpp.service.lanes``). Bad devices and targets
        are ``predict``'s to report (None). Counted in the stats only when every program was cached."""
        p = self.predictor
        kind = p.target_kind(device) if target is None and device in p.devices() else (target or "").strip()
        if device not in p.devices() or kind not in TARGET_KINDS:
            return None
        shared = _digest(_json_bytes(workload)) if workload is not None else b""
        keys = [(self._key(kind, item, shared), device.encode(), order) for item in programs]
        with self._lock:
            out = [self._preds.get(k) for k in keys]
            if any(x is None for x in out):
                return out
            self.stats.prediction_hits += len(programs)
            self.stats.programs_predicted += len(programs)
        return out

    def features(self, programs: Sequence[Any], keys: list[bytes], indices: list[int], total: int, kind: str,
                 workload: Any = None, cancel: threading.Event | None = None, deadline: float | None = None) -> list:
        """``ProgramFeatures`` per item: from the digest cache, else parsed and featurized in the sandbox.
        ``indices`` are the items' positions in the request (``total`` items), for error messages."""
        out: list = [None] * len(programs)
        todo: list[int] = []
        with self._lock:
            for j, k in enumerate(keys):
                f = self._cache.get(k)
                if f is None:
                    todo.append(j)
                else:
                    out[j] = f
            self.stats.cache_hits += len(programs) - len(todo)
            self.stats.cache_misses += len(todo)
        if not todo:
            return out
        _check(cancel)
        items, where = [programs[j] for j in todo], [indices[j] for j in todo]
        if not self.allow_tvmscript:  # refused here, before any worker sees it
            errors = [(i, TVMSCRIPT_OFF) for i, it in zip(where, items) if is_tvmscript(it)]
            if errors:
                raise BadPrograms(errors, total)
        feats, errors, parse_s, feat_s = self._run(items, where, kind, workload, deadline, cancel)
        if errors:
            raise BadPrograms(sorted(errors), total)
        with self._lock:
            self.stats.parse_seconds += parse_s
            self.stats.featurize_seconds += feat_s
            self.stats.programs_featurized += len(todo)
            for j, f, it in zip(todo, feats, items):
                out[j] = f
                if not is_tvmscript(it):  # features of a worker that ran TVMScript stay with this request
                    self._cache.put(keys[j], f)
        return out

    def _run(self, items: list, where: list[int], kind: str, workload: Any, deadline, cancel):
        """``Sandbox.run``, with TVMScript items in workers of their own: a worker that ran request code
        may have rewritten itself, so it must not featurize (cacheable) items of the other kind; the
        sandbox retires it after its job."""
        code = [j for j, it in enumerate(items) if is_tvmscript(it)] if self.allow_tvmscript else []
        if not code or len(code) == len(items):
            return self.sandbox.run(items, where, kind, workload, bool(code), deadline, cancel)
        feats: list = [None] * len(items)
        errors: list = []
        parse_s = feat_s = 0.0
        rest = sorted(set(range(len(items))) - set(code))
        for js, tvmscript in ((rest, False), (code, True)):
            f, e, p, t = self.sandbox.run([items[j] for j in js], [where[j] for j in js], kind, workload,
                                          tvmscript, deadline, cancel)
            errors += e
            parse_s, feat_s = parse_s + p, feat_s + t
            for j, x in zip(js, f):
                feats[j] = x
        return ([] if errors else feats), errors, parse_s, feat_s

    @staticmethod
    def _key(kind: str, item: Any, shared_workload: bytes) -> bytes:
        """Digest of an item as sent: equal bytes → equal program, so a hit needs no parsing at all."""
        if isinstance(item, str):
            return _digest(kind.encode(), b"s", item.encode())
        if isinstance(item, dict):
            if "workload" in item or not shared_workload:
                return _digest(kind.encode(), b"d", _json_bytes(item))
            return _digest(kind.encode(), b"w", shared_workload, _json_bytes(item))
        return _digest(kind.encode(), b"?", repr(item).encode())

    def cache_len(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        self.sandbox.close()


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("request timed out")
