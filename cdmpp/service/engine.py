"""The CPU-bound half of a predict request: wire items → programs → features → predictions.

Why a layer over ``Predictor``: the ``Predictor`` caches features by *structural* hash, so it must
parse every program first, and parsing is the expensive part (TVMScript ~60 ms alone, ~140 ms of
thread time in a busy server; a workload+trace ~5 ms), against ~5 ms to extract features and ~0.2 ms
of model time. A compiler re-asks the same candidates many times, byte for byte; so ``PredictEngine``
keys its caches by a digest of the item as sent (plus target): features (shared across devices) and,
per device, the prediction itself, so a re-asked program costs a hash and a lookup: no parsing, no
model. It also finds the bad items of a batch: each is parsed on its own (a ``ProgramError`` names the
item), features are extracted for the batch at once and item by item only when the batch fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

from cdmpp.predictor import Prediction, Predictor, UnknownDeviceError
from cdmpp.program import ProgramError


class BadPrograms(ValueError):
    """Some items of a batch are not usable programs; ``errors`` holds ``(index, reason)`` pairs."""

    def __init__(self, errors: list[tuple[int, str]], total: int):
        self.errors, self.total = errors, total
        shown = "; ".join(f"program {i}: {r}" for i, r in errors[:5])
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} of {total} programs are invalid: {shown}{more}")


class SharedWorkloadError(ProgramError):
    """The request's shared ``workload`` does not load (every item using it would fail)."""


class Cancelled(RuntimeError):
    """The request timed out while its work was still queued or running; stop spending CPU on it."""


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

    def __init__(self, predictor: Predictor, cache_size: int = 50_000, featurize_procs: int = 0):
        self.predictor = predictor
        self.pool = FeaturizePool(featurize_procs) if featurize_procs > 0 else None
        self.cache_size = cache_size
        self.stats = EngineStats()
        self._cache: OrderedDict[bytes, object] = OrderedDict()  # item digest -> ProgramFeatures
        self._preds: OrderedDict[tuple[bytes, bytes], Prediction] = OrderedDict()  # (digest, device) -> answer
        self._lock = threading.Lock()
        self._targets: dict[str, object] = {}

    def _target(self, kind: str):
        """``"llvm"``/``"cuda"`` → a full TVM target, built once (building one asks LLVM for the host cpu)."""
        t = self._targets.get(kind)
        if t is None:
            from cdmpp.program import parse_target

            t = self._targets[kind] = parse_target(kind)
        return t

    def predict(self, programs: Sequence[Any], device: str, target: str | None = None, workload: Any = None,
                cancel: threading.Event | None = None) -> list[Prediction]:
        """Predictions for wire-format items (TVMScript text or workload+trace dicts) on ``device``.

        A program already predicted on ``device`` is answered from the prediction cache (the model is
        fixed for the life of the server, so the answer cannot change). Raises ``UnknownDeviceError``,
        ``ProgramError`` (bad target), ``BadPrograms`` (bad items), ``Cancelled`` (``cancel`` was set).
        """
        p = self.predictor
        if device not in p.devices():
            raise UnknownDeviceError(device, p.devices())
        kind = target or p.target_kind(device)
        self._target(kind)  # a bad target fails here, before any work
        shared = _digest(_json_bytes(workload)) if workload is not None else b""
        keys = [self._key(kind, item, shared) for item in programs]
        dev = device.encode()
        out: list = [None] * len(programs)
        todo: list[int] = []
        with self._lock:
            for i, k in enumerate(keys):
                hit = self._preds.get((k, dev))
                if hit is None:
                    todo.append(i)
                else:
                    self._preds.move_to_end((k, dev))
                    out[i] = hit
            self.stats.prediction_hits += len(programs) - len(todo)
            self.stats.programs_predicted += len(programs)
        if not todo:
            return out
        feats = self.features([programs[i] for i in todo], [keys[i] for i in todo], todo, len(programs),
                              kind, workload, cancel)
        _check(cancel)
        t0 = time.perf_counter()
        preds = p.predict_features(feats, device)
        with self._lock:
            self.stats.model_seconds += time.perf_counter() - t0
            for i, pr in zip(todo, preds):
                out[i] = pr
                self._preds[(keys[i], dev)] = pr
            while len(self._preds) > self.cache_size:
                self._preds.popitem(last=False)
        return out

    def features(self, programs: Sequence[Any], keys: list[bytes], indices: list[int], total: int, kind: str,
                 workload: Any = None, cancel: threading.Event | None = None) -> list:
        """``ProgramFeatures`` per item: from the digest cache, else parsed and featurized (batched, in the
        worker processes when there are any). ``indices`` are the items' positions in the request
        (``total`` items), for error messages."""
        out: list = [None] * len(programs)
        todo: list[int] = []
        with self._lock:
            for j, k in enumerate(keys):
                f = self._cache.get(k)
                if f is None:
                    todo.append(j)
                else:
                    self._cache.move_to_end(k)
                    out[j] = f
            self.stats.cache_hits += len(programs) - len(todo)
            self.stats.cache_misses += len(todo)
        if not todo:
            return out
        _check(cancel)
        items, where = [programs[j] for j in todo], [indices[j] for j in todo]
        if self.pool is not None:
            feats, errors, parse_s, feat_s = self.pool.run(items, where, kind, workload, cancel)
        else:
            feats, errors, parse_s, feat_s = featurize_items(items, where, self._target(kind), workload,
                                                             featurize=self.predictor.featurize)
        if errors:
            raise BadPrograms(sorted(errors), total)
        with self._lock:
            self.stats.parse_seconds += parse_s
            self.stats.featurize_seconds += feat_s
            self.stats.programs_featurized += len(todo)
            for j, f in zip(todo, feats):
                out[j] = f
                self._cache[keys[j]] = f
                self._cache.move_to_end(keys[j])
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out

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
        if self.pool is not None:
            self.pool.close()


def featurize_items(items: list, indices: list[int], tgt, workload: Any = None, featurize=None):
    """Parse and featurize request items: ``(features, [(index, reason)], parse s, feature s)``.

    Each item is parsed on its own, so a bad one is named; the request's shared workload is parsed once.
    Features are extracted for the batch at once, item by item only when the batch fails (to name the
    bad ones). ``featurize(programs, target)`` defaults to a ``Featurizer`` of this process.
    """
    from cdmpp.program import load_program

    featurize = featurize or _process_featurizer()
    t0 = time.perf_counter()
    parsed, errors, shared_mod = [], [], None
    for i, item in zip(indices, items):
        try:
            if workload is not None and isinstance(item, str) and item.lstrip().startswith("{"):
                item = _json_item(item)  # a workload+trace object sent as JSON text (see PredictRequest)
            if isinstance(item, dict) and "workload" not in item and workload is not None:
                if shared_mod is None:
                    shared_mod = _load_workload(workload, tgt)
                parsed.append(load_program(_apply_trace(shared_mod, item), tgt))
            else:
                parsed.append(load_program(item, tgt))
        except SharedWorkloadError:
            raise
        except ProgramError as e:
            errors.append((i, str(e)))
        except Exception as e:  # anything TVM raises on odd input is still the input's fault
            errors.append((i, f"program does not load: {_first_line(e)}"))
    t1 = time.perf_counter()
    if errors:
        return [], errors, t1 - t0, 0.0
    try:
        feats = featurize(parsed, tgt)
    except Exception:
        feats = []
        for i, prog in zip(indices, parsed):
            try:
                feats.append(featurize([prog], tgt)[0])
            except ProgramError as e:
                errors.append((i, str(e)))
            except Exception as e:
                errors.append((i, f"feature extraction failed: {_first_line(e)}"))
    return feats, errors, t1 - t0, time.perf_counter() - t1


class FeaturizePool:
    """Parsing and feature extraction in worker processes.

    Why processes: TVM's FFI calls hold the GIL, so threads of one process parse and featurize one
    program at a time (measured: two threads replaying traces take as long as one doing both halves).
    A batch's new programs are split into one chunk per worker. A worker that dies (a program that
    crashes TVM) breaks the pool: it is rebuilt and the batch retried item by item, so the culprit is
    named and the rest still answered.
    """

    def __init__(self, procs: int):
        self.procs = procs
        self._lock = threading.Lock()
        self._pool = self._new_pool()

    def _new_pool(self):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(self.procs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_init, initargs=(os.getpid(),))

    def warm_up(self, item: Any, kind: str) -> None:
        """Start every worker and build its TVM context (the first extraction in a process is slow)."""
        futs = [self._pool.submit(_worker_run, [item], [0], kind, None) for _ in range(self.procs)]
        for f in futs:
            f.result()

    def run(self, items: list, indices: list[int], kind: str, workload: Any, cancel: threading.Event | None):
        from concurrent.futures.process import BrokenProcessPool

        n = min(self.procs, len(items))
        bounds = [round(k * len(items) / n) for k in range(n + 1)]
        chunks = [(items[a:b], indices[a:b]) for a, b in zip(bounds, bounds[1:])]
        try:
            return self._gather(chunks, kind, workload, cancel)
        except BrokenProcessPool:
            self._rebuild()
            return self._one_by_one(items, indices, kind, workload, cancel)

    def _gather(self, chunks, kind, workload, cancel):
        pool = self._pool
        futs = [pool.submit(_worker_run, it, ix, kind, workload) for it, ix in chunks]
        feats, errors, parse_s, feat_s = [], [], 0.0, 0.0
        try:
            for f in futs:
                while True:  # wake up now and then to honour a cancelled request
                    try:
                        r = f.result(timeout=0.25)
                        break
                    except TimeoutError:
                        _check(cancel)
                feats += r[0]
                errors += r[1]
                parse_s += r[2]
                feat_s += r[3]
        finally:
            for f in futs:
                f.cancel()
        return feats, errors, parse_s, feat_s

    def _one_by_one(self, items, indices, kind, workload, cancel):
        from concurrent.futures.process import BrokenProcessPool

        feats, errors, parse_s, feat_s = [], [], 0.0, 0.0
        for item, i in zip(items, indices):
            try:
                r = self._gather([([item], [i])], kind, workload, cancel)
            except BrokenProcessPool:
                self._rebuild()
                errors.append((i, "program crashed the feature extractor"))
                continue
            feats += r[0]
            errors += r[1]
            parse_s += r[2]
            feat_s += r[3]
        return feats, errors, parse_s, feat_s

    def _rebuild(self) -> None:
        with self._lock:
            old, self._pool = self._pool, self._new_pool()
        old.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# ---- worker-process side of FeaturizePool ------------------------------------------------------------
_FEATURIZER = None
_TARGETS: dict[str, Any] = {}


def _worker_init(parent: int) -> None:
    from cdmpp import tvm_env

    def exit_with_parent():  # a server killed with SIGKILL must not leave its workers behind
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True, name="cdmpp-parent-watch").start()
    tvm_env.setup(1)


def _process_featurizer():
    global _FEATURIZER
    if _FEATURIZER is None:
        from cdmpp.features import Featurizer

        _FEATURIZER = Featurizer()
    return _FEATURIZER


def _worker_run(items: list, indices: list[int], kind: str, workload: Any):
    from cdmpp.program import parse_target

    tgt = _TARGETS.get(kind)
    if tgt is None:
        tgt = _TARGETS[kind] = parse_target(kind)
    return featurize_items(items, indices, tgt, workload)


def _json_item(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ProgramError(f"program looks like JSON but does not parse: {e}") from None


def _load_workload(workload: Any, tgt):
    """The shared workload as a one-PrimFunc module (``Workload.as_json()`` or a ``tvm.ir.save_json`` string)."""
    from cdmpp import tvm_env
    from cdmpp.program import load_program

    tvm = tvm_env.setup()
    from tvm.s_tir.meta_schedule.database import Workload

    try:
        mod = tvm.ir.load_json(workload) if isinstance(workload, str) else Workload.from_json(workload).mod
        return load_program(mod, tgt).mod
    except Exception as e:
        raise SharedWorkloadError(f"shared workload does not load: {_first_line(e)}") from None


def _apply_trace(mod, item: dict):
    """The scheduled module of ``item["trace"]`` replayed on the shared workload ``mod``."""
    from cdmpp.program import apply_trace

    if "trace" not in item:
        raise ProgramError("workload+trace program lacks ['trace']")
    return apply_trace(mod, item["trace"])


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("request timed out")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]
