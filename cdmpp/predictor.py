"""``Predictor``: programs in any accepted form + a device id → latency with a 90 % interval.

The one object that the CLI, the HTTP service, the MetaSchedule cost model and notebooks call. It
featurizes (with an in-memory cache keyed by program hash), then runs the trained ensemble.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

DEFAULT_MODEL = Path(__file__).resolve().parent / "models" / "default"


class UnknownDeviceError(KeyError):
    def __init__(self, device: str, known: Sequence[str]):
        super().__init__(device)
        self.device, self.known = device, list(known)

    def __str__(self) -> str:
        return f"unknown device {self.device!r}; known devices: {', '.join(self.known)}"


@dataclass
class Prediction:
    seconds: float
    lo90: float
    hi90: float


class Predictor:
    """A loaded model plus featurization. Thread-safe for concurrent ``predict`` calls."""

    def __init__(self, model, path: str | os.PathLike | None = None, cache_size: int = 100_000):
        self.model = model
        self.path = str(path) if path else None
        self._cache: OrderedDict[str, object] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._featurizer = None

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "Predictor":
        """Load a checkpoint folder (default: the model shipped with cdmpp)."""
        from cdmpp.checkpoint import TrainedModel

        path = Path(path) if path else DEFAULT_MODEL
        if not (path / "predictor.json").exists():
            raise FileNotFoundError(f"no cdmpp checkpoint at {path} (expected predictor.json + weights.safetensors)")
        return cls(TrainedModel.load(path), path)

    # ---- what the model knows -------------------------------------------------------------------
    @property
    def version(self) -> str:
        s = self.model.summary
        return str(s.get("model_version") or s.get("name") or "unversioned")

    def devices(self) -> list[str]:
        return sorted(self.model.device_specs.table)

    def device_info(self, device: str) -> dict:
        if device not in self.model.device_specs.table:
            raise UnknownDeviceError(device, self.devices())
        known = self.model.summary.get("devices")
        info = dict(known.get(device, {})) if isinstance(known, dict) else {}  # fit() stores a plain list
        info.setdefault("specs", self.model.device_specs.table[device])
        return info

    def target_kind(self, device: str) -> str:
        target = self.device_info(device).get("target") or {}
        return "cuda" if (target.get("kind") == "cuda" or "/cuda" in device) else "llvm"

    # ---- featurization with a cache ---------------------------------------------------------------
    def featurize(self, programs: Sequence, target: str = "llvm") -> list:
        """ProgramFeatures for each program; repeated programs (same structural hash) are featurized once."""
        from cdmpp.features import Featurizer, program_hash
        from cdmpp.program import Program, load_program

        progs = [p if isinstance(p, Program) else load_program(p, target) for p in programs]
        hashes = [program_hash(p.mod) for p in progs]
        out: list = [None] * len(progs)
        todo = []
        with self._lock:
            for i, h in enumerate(hashes):
                f = self._cache.get(h)
                if f is not None:
                    self._cache.move_to_end(h)
                    out[i] = f
                else:
                    todo.append(i)
            if self._featurizer is None:
                self._featurizer = Featurizer()
        if todo:
            feats = self._featurizer([progs[i] for i in todo])
            with self._lock:
                for i, f in zip(todo, feats):
                    out[i] = f
                    self._cache[hashes[i]] = f
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return out

    # ---- prediction -----------------------------------------------------------------------------
    def predict_features(self, features: Sequence, device: str) -> list[Prediction]:
        if device not in self.model.device_specs.table:
            raise UnknownDeviceError(device, self.devices())
        if not features:
            return []
        mean, lo, hi = self.model.predict(list(features), device)
        return [Prediction(float(m), float(a), float(b)) for m, a, b in zip(mean, lo, hi)]

    def predict(self, programs: Sequence, device: str) -> list[Prediction]:
        """Latency (seconds) with a 90 % interval for each program on ``device``.

        Programs: PrimFunc, IRModule, Schedule, TVMScript text or workload+trace JSON (see
        ``cdmpp.program``). Raises ``UnknownDeviceError`` or ``cdmpp.program.ProgramError``.
        """
        if device not in self.model.device_specs.table:
            raise UnknownDeviceError(device, self.devices())
        return self.predict_features(self.featurize(programs, self.target_kind(device)), device)

    def predict_seconds(self, programs: Sequence, device: str) -> np.ndarray:
        return np.array([p.seconds for p in self.predict(programs, device)])
