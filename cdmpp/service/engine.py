"""The CPU-bound half of a predict request: wire items → features → predictions, over one ``Predictor``.

A thin adapter: the ``Predictor`` resolves the device and featurizes (its ``FeatureCache`` keys text and
JSON items by a digest of the item as sent, so a re-asked program costs no parsing, and sends every item
to sandbox workers, never parsing it in this process). What the service adds: a per-device cache of
the prediction itself (the model is fixed for the life of the server, so a re-asked program costs a hash
and a lookup: no featurizing, no model), the operator's TVMScript policy, request deadlines and
cancellation, bad items named by their index in the request, and counters for /metrics.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from cdmpp.lru import LRU
from cdmpp.predict.featurize import FeatureStats, item_key, workload_digest
from cdmpp.predict.predictor import Device, Prediction, Predictor, UnknownDeviceError
from cdmpp.program.inputs import TARGET_KINDS, ProgramError
from cdmpp.sandbox.pool import Sandbox
from cdmpp.sandbox.wire import Cancelled, is_tvmscript


NONFINITE_PREDICTION = "the model's prediction for this program is not a finite number"


class BadPrograms(ValueError):
    """Some items of a batch are not usable programs; ``errors`` holds ``(index, reason)`` pairs."""

    def __init__(self, errors: list[tuple[int, str]], total: int):
        self.errors, self.total = errors, total
        shown = "; ".join(f"program {i}: {r}" for i, r in errors[:5])
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} of {total} programs are invalid: {shown}{more}")




@dataclass
class EngineStats(FeatureStats):
    """Counters for /metrics (monotone; read without the lock, so values may be a moment stale)."""

    prediction_hits: int = 0
    programs_predicted: int = 0
    model_seconds: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)


class PredictEngine:
    """Thread-safe batch prediction with a prediction cache (LRU, ``cache_size`` entries per engine) over
    ``predictor``, whose feature cache it shares."""

    def __init__(self, predictor: Predictor, cache_size: int = 50_000, sandbox: Sandbox | None = None,
                 allow_tvmscript: bool = False):
        self.predictor = predictor
        self.sandbox = sandbox or Sandbox(1, kinds=tuple({predictor.device(d).kind for d in predictor.devices()}))
        self.allow_tvmscript = allow_tvmscript
        self.cache_size = cache_size
        self.stats = EngineStats()
        self._preds = LRU(cache_size)  # (item key, device, order) -> Prediction
        self._lock = threading.Lock()

    def _target(self, device: Device, target: str | None) -> str:
        kind = device.kind if target is None else target.strip()
        if kind not in TARGET_KINDS:
            raise ProgramError(f"target {target!r} is not accepted: expected one of {', '.join(TARGET_KINDS)} "
                               "(options such as -mcpu come from the device, not the request)")
        return kind

    def predict(self, programs: Sequence[Any], device: str | Device, target: str | None = None, workload: Any = None,
                cancel: threading.Event | None = None, deadline: float | None = None,
                order: bool = False, build: bool = True) -> list[Prediction]:
        """Predictions for wire-format items (TVMScript text or workload+trace dicts) on ``device``
        (``order``, ``build``: as in ``Predictor.predict``).

        A program already predicted on ``device`` is answered from the prediction cache. Raises
        ``UnknownDeviceError``, ``ProgramError`` (bad target), ``BadPrograms`` (bad items), ``Cancelled``
        (``cancel`` was set or the monotonic ``deadline`` passed: the workers still busy on it are killed).
        """
        p = self.predictor
        dev = p.device(device)
        kind = self._target(dev, target)
        odd = [(i, "not a program: expected text or a JSON object") for i, it in enumerate(programs)
               if not isinstance(it, (str, dict))]
        if odd:  # anything else would be taken for a TVM object and featurized in this process
            raise BadPrograms(odd, len(programs))
        shared = workload_digest(workload)
        keys = [item_key(kind, item, shared) for item in programs]
        build_for = p.build_target(dev) if build else None
        built = build_for is not None  # in the cache key only where the model reads builds
        out: list = [None] * len(programs)
        todo: list[int] = []
        with self._lock:
            for i, k in enumerate(keys):
                hit = self._preds.get((k, dev.id, order, built))
                if hit is None:
                    todo.append(i)
                else:
                    out[i] = hit
            self.stats.prediction_hits += len(programs) - len(todo)
            self.stats.programs_predicted += len(programs)
        if not todo:
            return out
        try:
            feats = p.featurize([programs[i] for i in todo], kind, workload=workload, tvmscript=self.allow_tvmscript,
                                sandbox=self.sandbox, deadline=deadline, cancel=cancel, stats=self.stats,
                                keys=[keys[i] for i in todo], build=build_for)
        except ProgramError as e:
            if getattr(e, "errors", None) is None:
                raise
            raise BadPrograms([(todo[x["index"]], x["reason"]) for x in e.errors], len(programs)) from None
        _check(cancel)
        t0 = time.perf_counter()
        preds = p.predict_features(feats, dev, kind, order)
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
                    self._preds.put((keys[i], dev.id, order, built), pr)
        return out

    @staticmethod
    def _code(programs: Sequence[Any]) -> set[int]:
        """Positions of TVMScript items: their features come from workers that ran request code."""
        return {i for i, it in enumerate(programs) if is_tvmscript(it)}

    def cached(self, programs: Sequence[Any], device: str | Device, target: str | None = None, workload: Any = None,
               order: bool = False, build: bool = True) -> list[Prediction | None] | None:
        """Each program's cached prediction, None where there is none: a hash and a lookup per item, no
        sandbox, no model, so the server answers a wholly cached request without queueing it behind new
        work, and weighs the rest by its new programs (``cdmpp.service.lanes``). Bad devices and targets
        are ``predict``'s to report (None). Counted in the stats only when every program was cached."""
        try:
            dev = self.predictor.device(device)
            kind = self._target(dev, target)
        except (UnknownDeviceError, ProgramError):
            return None
        shared = workload_digest(workload)
        built = build and self.predictor.build_target(dev) is not None
        keys = [(item_key(kind, item, shared), dev.id, order, built) for item in programs]
        with self._lock:
            out = [self._preds.get(k) for k in keys]
            if any(x is None for x in out):
                return out
            self.stats.prediction_hits += len(programs)
            self.stats.programs_predicted += len(programs)
        return out

    def cache_len(self) -> int:
        """Programs in the feature cache (the predictor's, which this engine fills)."""
        return len(self.predictor.features)

    def close(self) -> None:
        self.sandbox.close()


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("request timed out")
