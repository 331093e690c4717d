"""``Predictor``: programs in any accepted form + a device id → latency with a 90 % interval.

The one way in to prediction: the CLI, notebooks, the HTTP service (``cdmpp.service.engine``, a thin
adapter that adds a prediction cache and request deadlines) and the MetaSchedule cost model
(``cdmpp.predict.cost_model``) all call a ``Predictor``; ``cdmpp.predict.client.Client`` is the same
``predict`` over HTTP, and ``Predictor.load(url)`` returns one. A ``Predictor`` resolves each device
once (``cdmpp.predict.devices``: target, target kind and specs from the device table), featurizes and
caches in one place (``cdmpp.predict.featurize.FeatureCache``), then runs the trained ensemble, and says
for each prediction whether it lies outside what the model was trained on (``Prediction.ood``).

Text and JSON (TVMScript, workload+trace) may come from anywhere and TVMScript is parsed by running
Python, so ``predict`` parses them in a sandbox worker (``cdmpp.sandbox.pool``) unless the caller passes
``trusted=True``; TVM objects (PrimFunc, IRModule, Schedule) were built in this process and stay here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from cdmpp import defaults
from cdmpp.predict.devices import Device, Devices, UnknownDeviceError
from cdmpp.predict.featurize import FeatureCache
from cdmpp.predict.prediction import Prediction

__all__ = ["Device", "Prediction", "Predictor", "UnknownDeviceError", "target_kind_problem"]


_GPU_BINDING_COLS = slice(50, 56)  # blockIdx_{x,y,z}_len, threadIdx_{x,y,z}_len: log2(extent + 1), 1 when unbound


def target_kind_problem(features, kind: str) -> str | None:
    """Why a featurized program cannot run on a device of target ``kind``, or None: a GPU program binds
    blockIdx/threadIdx (TVM refuses to build one that does not), a CPU program binds neither. A number
    for such a pair would be no latency at all (a CPU schedule on an H100 came out at 9 ns)."""
    rows = np.asarray(features.leaf_features, dtype=np.float64)
    bound = rows.size and bool((rows[:, _GPU_BINDING_COLS] > 1.0 + 1e-6).any())
    if kind == "cuda" and not bound:
        return "binds no GPU threads (blockIdx/threadIdx): a CPU schedule cannot run on a CUDA device"
    if kind != "cuda" and bound:
        return "binds GPU threads (blockIdx/threadIdx): a GPU schedule cannot run on a CPU device"
    return None


# Out-of-distribution flags (``Prediction.ood``): why a prediction deserves less trust than the model's
# validation error suggests.
DEVICE_UNTRAINED = "device_untrained"  # the device had no training data (predicted from its specs only)
FEATURES_OUT_OF_RANGE = "features_out_of_range"  # leaf features outside the training values move the prediction
# the model reads built programs' instruction counts (``TrainConfig.assembly_counts``) and this one was not built for
# the device's target (its build failed, or it was featurized without ``Predictor.build_target``, as a tuner's
# candidates are): its prediction goes without them
ASSEMBLY_NOT_BUILT = "assembly_not_built"
RISK_FACTOR = 1.1  # out-of-range inputs flag a prediction when holding them at the training range moves it this much


class Predictor:
    """A loaded model plus featurization. Thread-safe for concurrent ``predict`` calls.

    ``devices``: the device table whose devices the model never saw are predicted from their specs;
    ``cache_size``: programs whose features are kept (``FeatureCache``)."""

    def __init__(self, model, path: str | os.PathLike | None = None, cache_size: int = 100_000,
                 devices: str | os.PathLike | None = defaults.DEVICES):
        self.model = model
        self.path = str(path) if path else None
        self.features = FeatureCache(cache_size)
        self._devices = Devices(model, devices)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, **kwargs) -> "Predictor":
        """Load a checkpoint folder (default: the model shipped with cdmpp); ``kwargs`` as the constructor's.

        An ``http://`` or ``https://`` URL instead returns a ``cdmpp.predict.client.Client`` of that cdmpp
        server (``kwargs`` as ``Client``'s: ``token``, ``timeout``, ...): the same ``predict`` over HTTP."""
        if isinstance(path, str) and path.startswith(("http://", "https://")):
            from cdmpp.predict.client import Client

            return Client(path, **kwargs)
        from cdmpp.model.kinds import load_model

        path = Path(path) if path else defaults.MODEL
        return cls(load_model(path), path, **kwargs)

    # ---- what the model knows -------------------------------------------------------------------
    @property
    def version(self) -> str:
        s = self.model.summary
        return str(s.get("model_version") or s.get("name") or "unversioned")

    def device_table(self):
        """The device table (``cdmpp.devices.table.DeviceTable``) read once; empty when there is none."""
        return self._devices.table()

    def devices(self) -> list[str]:
        """Every device this predictor answers for: the model's and the device table's."""
        return self._devices.ids()

    def device(self, device: str | Device) -> Device:
        """``device`` resolved once: target, target kind, specs (``cdmpp.predict.devices``). A device of
        the table the model never saw joins it from its specs. Raises ``UnknownDeviceError``."""
        return self._devices.get(device)

    def device_info(self, device: str) -> dict:
        return dict(self.device(device).info)

    def model_for(self, device: str | Device):
        """The ``TrainedModel`` that predicts ``device`` (a checkpoint of one model per kind of code holds two)."""
        return self.model.part_for(self.device(device).id)  # resolving it put a new device in its kind's part

    def target_kind(self, device: str | Device) -> str:
        """The target kind ``device`` runs ("llvm" or "cuda"), from its target in the device table."""
        return self.device(device).kind

    def build_target(self, device: str | Device) -> dict | None:
        """The target to build each program for before predicting it on ``device`` (its own), when the model that
        predicts it reads the built programs' instruction counts (``TrainConfig.assembly_counts``); else None."""
        dev = self.device(device)
        counted = bool(self.model_for(dev).config.get("assembly_counts"))
        return dict(dev.target) if counted and dev.kind == "llvm" and dev.target else None

    def trained_on(self, device: str | Device) -> bool:
        """Whether the model saw measurements of ``device`` (else its predictions rest on specs alone)."""
        if isinstance(device, Device):
            return device.trained
        train = self.model.summary.get("train_devices")
        return True if train is None else device in train

    def ood_flags(self, features: Sequence, device: str | Device, target_kind: str | None = None
                  ) -> list[tuple[str, ...]]:
        """Out-of-distribution flags per program. Features are out of range when a leaf value lies outside
        the training leaves' [min, max] of its column (checkpoints that record it), or, for older
        checkpoints, differs from a column that was constant in training or is not finite: values the model
        certainly never saw. (A z-score rule flagged half of ordinary programs: rare binary columns.)"""
        return [flags for flags, _ in self._ood(features, self.device(device))]

    def _ood(self, features: Sequence, device: Device) -> list[tuple[tuple[str, ...], np.ndarray]]:
        """Per program: (flags, boolean mask of its leaf values outside the training range)."""
        common = []
        if not device.trained:
            common.append(DEVICE_UNTRAINED)
        model = self.model_for(device)
        norm, counted = model.feature_normalizer, bool(model.config.get("assembly_counts"))
        lo, hi = getattr(norm, "min_", None), getattr(norm, "max_", None)
        if lo is None or hi is None:  # the column's one training value, where it had only one
            const = norm.inv_scale_ == 0
            center = np.where(norm.log_cols_, np.expm1(np.abs(norm.center_)) * np.sign(norm.center_), norm.center_)
            lo = hi = None
        out = []
        for f in features:
            x = np.asarray(f.leaf_features, dtype=np.float64)
            with np.errstate(all="ignore"):
                if lo is not None:
                    tol = 1e-5 * (1.0 + np.abs(hi.astype(np.float64)))
                    far = (x < lo - tol) | (x > hi + tol)
                else:
                    far = const & (np.abs(x - center) > 1e-3 * (1.0 + np.abs(center)))
                far = far | ~np.isfinite(x)
            flags = common + ([FEATURES_OUT_OF_RANGE] if far.any() else [])
            if counted and getattr(f, "asm", None) is None:
                flags.append(ASSEMBLY_NOT_BUILT)
            out.append((tuple(flags), far))
        return out

    def _at_risk(self, features: Sequence, device: Device, seconds: np.ndarray) -> list[bool]:
        """Whether each flagged program's prediction moves by more than ``RISK_FACTOR`` when its out-of-range
        values are held at the training range: a value beyond it the model does not lean on (an allocation
        size of 0, as Ansor-lowered programs have) is no reason to distrust the answer."""
        import copy

        model = self.model_for(device)
        norm = model.feature_normalizer
        lo, hi = getattr(norm, "min_", None), getattr(norm, "max_", None)
        if lo is None or hi is None or not features:
            return [True] * len(features)
        clipped = []
        for f in features:
            g = copy.copy(f)
            g.leaf_features = np.clip(np.nan_to_num(np.asarray(f.leaf_features, np.float64)), lo, hi).astype(np.float32)
            clipped.append(g)
        held = model.predict(clipped, device.id)[0]
        ratio = np.abs(np.log(np.maximum(held, 1e-30) / np.maximum(seconds, 1e-30)))
        return list(ratio > np.log(RISK_FACTOR))

    # ---- featurization with a cache ---------------------------------------------------------------
    def featurize(self, programs: Sequence, target: Any = "llvm", trusted: bool = False, workload: Any = None,
                  **options) -> list:
        """ProgramFeatures for each program (``target``: a kind, "llvm"/"cuda", or a TVM target); a program
        seen before (same text, or the same structural hash) is featurized once.

        Text and dict items are parsed in a sandbox worker unless ``trusted``; a bad one raises
        ``ProgramError`` with ``errors`` = ``[{"index", "reason"}]``. ``options``: those of
        ``FeatureCache.featurize`` (the service's sandbox, deadline, TVMScript policy, counters).
        """
        return self.features.featurize(programs, target, trusted, workload, **options)

    def featurize_candidates(self, context, candidates) -> list:
        """Features of a MetaSchedule tuner's candidates (None for one that fails), cached likewise."""
        return self.features.candidates(context, candidates)

    # ---- prediction -----------------------------------------------------------------------------
    def predict(self, programs: Sequence, device: str | Device, target: str | None = None, workload: Any = None,
                order: bool = False, build: bool = True, *, trusted: bool = False) -> list[Prediction]:
        """Latency (seconds) with a 90 % interval and OOD flags for each program on ``device``.

        Programs: PrimFunc, IRModule, Schedule, TVMScript text or workload+trace JSON (see
        ``cdmpp.program.inputs``); text and JSON are parsed in a sandbox worker unless ``trusted=True`` (say so
        only for text you wrote or generated yourself). ``target``: "llvm"/"cuda", default the device's.
        ``workload``: the unscheduled module (``Workload.as_json()``) shared by trace items that leave it out.
        ``order=True``: seconds that order the programs of one task best (a compiler's search; see
        ``TrainedModel.predict``), not the best estimate of each program's latency.
        ``build=False``: the programs predicted unbuilt, as a tuner's candidates are (a model that reads built
        programs' counts goes without them, flagged ``assembly_not_built``; no ~0.3 s build per new program).
        Raises ``UnknownDeviceError`` or ``cdmpp.program.inputs.ProgramError``.
        """
        dev = self.device(device)
        kind = target or dev.kind
        feats = self.featurize(programs, kind, trusted, workload, build=self.build_target(dev) if build else None)
        return self.predict_features(feats, dev, kind, order)

    def predict_seconds(self, programs: Sequence, device: str | Device, trusted: bool = False) -> np.ndarray:
        return np.array([p.seconds for p in self.predict(programs, device, trusted=trusted)])

    def predict_features(self, features: Sequence, device: str | Device, target_kind: str | None = None,
                         order: bool = False) -> list[Prediction]:
        """Predictions for featurized programs; ``target_kind`` (the programs' target) must be the device's;
        ``order`` as in ``predict``. A program the device cannot run (no computation, GPU threads on a CPU
        or none on a GPU) raises ``ProgramError`` naming every such item."""
        dev = self.device(device)
        if not features:
            return []
        from cdmpp.program.inputs import ProgramError
        from cdmpp.sandbox.wire import NO_COMPUTATION

        if target_kind is not None and target_kind != dev.kind:
            err = ProgramError(f"target {target_kind!r} does not run on {dev.id!r} (a {dev.kind} device)")
            err.errors = [{"index": i, "reason": str(err)} for i in range(len(features))]
            raise err
        errors = [(i, NO_COMPUTATION if f.n_leaves == 0 else target_kind_problem(f, dev.kind))
                  for i, f in enumerate(features)]
        errors = [(i, r) for i, r in errors if r]
        if errors:
            err = ProgramError(f"program {errors[0][0]}: {errors[0][1]}")
            err.errors = [{"index": i, "reason": r} for i, r in errors]
            raise err
        mean, lo, hi = self.model_for(dev).predict(list(features), dev.id, order=order)
        found = self._ood(features, dev)
        far = [i for i, (flags, _) in enumerate(found) if FEATURES_OUT_OF_RANGE in flags]
        risky = dict(zip(far, self._at_risk([features[i] for i in far], dev, mean[far])))
        from cdmpp.program.features import FEATURE_NAMES

        out = []
        for i, (m, a, b) in enumerate(zip(mean, lo, hi)):
            flags, mask = found[i]
            names: tuple[str, ...] = ()
            if i in risky and not risky[i]:
                flags = tuple(x for x in flags if x != FEATURES_OUT_OF_RANGE)
            elif i in risky:
                names = tuple(FEATURE_NAMES[c] for c in np.nonzero(mask.any(axis=0))[0])
            out.append(Prediction(float(m), float(a), float(b), flags, names))
        return out
