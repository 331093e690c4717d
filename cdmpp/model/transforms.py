"""The fitted input/label transforms a trained predictor carries, each fitted on training data only.

* ``LogLatency``: latency seconds <-> standardized log seconds, the space the network predicts in.
* ``FeatureNormalizer``: per-feature scaling of leaf features (heavy-tailed, partly log-scaled already).
* ``DeviceSpecs``: a device table (id -> spec dict, e.g. ``DeviceSpec.specs()`` of ``cdmpp.devices.spec``)
  and the normalization of its spec vectors.

All three follow scikit-learn conventions (``fit`` returns self, learned state ends in ``_``) and
serialize to plain JSON dicts, so a checkpoint holds no pickles.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from cdmpp.devices.spec import SPEC_FIELDS as DEVICE_SPEC_KEYS  # the spec names of the device table


class LogLatency:
    """Latency seconds <-> standardized log seconds, the space the network predicts in (the paper's Box-Cox
    at lambda = 0: what the shipped recipe kept, reports/study-issue19.md).

    Latencies span 1e-7..10 s; they are first divided by their geometric mean (``scale_``).
    ``inverse_transform`` clips to [min/1000, max*1000] of the training labels: no honest prediction lives
    further out, and one wild member must not overflow.
    """

    def fit(self, seconds) -> "LogLatency":
        y = np.asarray(seconds, dtype=np.float64)
        if len(y) < 2 or np.any(~np.isfinite(y)) or np.any(y <= 0):
            raise ValueError("LogLatency needs at least two finite positive latencies")
        self.scale_ = float(np.exp(np.mean(np.log(y))))
        t = np.log(y / self.scale_)
        self.mean_, self.std_ = float(t.mean()), float(max(t.std(), 1e-12))
        self.min_, self.max_ = float(y.min()), float(y.max())
        return self

    def transform(self, seconds) -> np.ndarray:
        return (np.log(np.asarray(seconds, dtype=np.float64) / self.scale_) - self.mean_) / self.std_

    def inverse_transform(self, z) -> np.ndarray:
        t = np.asarray(z, dtype=np.float64) * self.std_ + self.mean_
        lo, hi = self.min_ / 1000.0, self.max_ * 1000.0
        y = np.exp(np.clip(t, math.log(lo / self.scale_), math.log(hi / self.scale_)))
        return np.clip(y * self.scale_, lo, hi)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("scale_", "mean_", "std_", "min_", "max_")}

    @classmethod
    def from_dict(cls, d: dict) -> "LogLatency":
        obj = cls()
        for k, v in d.items():
            setattr(obj, k, float(v))
        return obj


class FeatureNormalizer:
    """Per-feature scaling of leaf features, fitted on the training leaves.

    Columns whose training values exceed ``log_above`` in magnitude are not log-scaled yet (raw counts,
    bytes): they get sign(x)*log1p(|x|) first. Then mean/std standardization, and a clip to +-``clip`` so
    one absurd value cannot saturate attention. Constant columns map to 0.
    """

    def __init__(self, log_above: float = 50.0, clip: float = 10.0):
        self.log_above = log_above
        self.clip = clip

    def fit(self, leaves: np.ndarray) -> "FeatureNormalizer":
        x = np.asarray(leaves, dtype=np.float64)
        self.min_, self.max_ = x.min(axis=0).astype(np.float32), x.max(axis=0).astype(np.float32)  # for OOD flags
        self.log_cols_ = np.abs(x).max(axis=0) > self.log_above
        x = self._log(x)
        center, spread = x.mean(axis=0), x.std(axis=0)
        self.center_ = center.astype(np.float32)
        self.inv_scale_ = np.where(spread > 1e-9, 1.0 / np.maximum(spread, 1e-9), 0.0).astype(np.float32)
        return self

    def fit_chunks(self, chunks) -> "FeatureNormalizer":
        """``fit`` on leaves too many to hold in float64 at once: ``chunks()`` yields them in row chunks
        (called three times: extremes, means, spreads). Given one chunk it computes what ``fit`` does,
        operation for operation."""
        lo = hi = amax = None
        n = 0
        for c in chunks():
            x = np.asarray(c, dtype=np.float64)
            n += len(x)
            if not len(x):
                continue
            parts = (x.min(axis=0), x.max(axis=0), np.abs(x).max(axis=0))
            lo, hi, amax = parts if lo is None else (np.minimum(lo, parts[0]), np.maximum(hi, parts[1]),
                                                     np.maximum(amax, parts[2]))
        self.min_, self.max_ = lo.astype(np.float32), hi.astype(np.float32)
        self.log_cols_ = amax > self.log_above
        center = sum(self._log(np.asarray(c, dtype=np.float64)).sum(axis=0) for c in chunks()) / n
        spread = np.sqrt(sum(((self._log(np.asarray(c, dtype=np.float64)) - center) ** 2).sum(axis=0)
                             for c in chunks()) / n)
        self.center_ = center.astype(np.float32)
        self.inv_scale_ = np.where(spread > 1e-9, 1.0 / np.maximum(spread, 1e-9), 0.0).astype(np.float32)
        return self

    def _log(self, x: np.ndarray) -> np.ndarray:
        if not self.log_cols_.any():
            return x
        return np.where(self.log_cols_, np.copysign(np.log1p(np.abs(x)), x), x)

    def transform(self, leaves: np.ndarray) -> np.ndarray:
        x = np.asarray(leaves, dtype=np.float32)
        if x.shape[-1] != len(self.center_):
            raise ValueError(f"leaf features have {x.shape[-1]} columns, the normalizer was fitted on {len(self.center_)}: "
                             "features from another featurizer version?")
        x = self._log(x)
        x = (x - self.center_) * self.inv_scale_
        return np.clip(x, -self.clip, self.clip, out=x)

    def to_dict(self) -> dict:
        return dict(log_above=self.log_above, clip=self.clip, log_cols_=self.log_cols_.tolist(),
                    center_=self.center_.tolist(), inv_scale_=self.inv_scale_.tolist(), min_=self.min_.tolist(),
                    max_=self.max_.tolist())

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureNormalizer":
        obj = cls(d["log_above"], d["clip"])
        obj.log_cols_ = np.asarray(d["log_cols_"], dtype=bool)
        obj.center_ = np.asarray(d["center_"], dtype=np.float32)
        obj.inv_scale_ = np.asarray(d["inv_scale_"], dtype=np.float32)
        obj.min_ = np.asarray(d["min_"], dtype=np.float32)
        obj.max_ = np.asarray(d["max_"], dtype=np.float32)
        return obj


class DeviceSpecs:
    """Device table plus normalization of spec vectors: log1p of each spec, standardized over the
    training devices. With a single training device the spread is 0 and its scale falls back to 1,
    so a new device still maps to a distinct vector. Missing specs count as the training mean (0)."""

    def __init__(self, table=None, keys: tuple[str, ...] = DEVICE_SPEC_KEYS):
        if hasattr(table, "ids") and hasattr(table, "get"):  # a cdmpp.devices.table.DeviceTable
            table = {i: table.get(i) for i in table.ids()}
        self.table = {name: dict(spec.specs() if hasattr(spec, "specs") else spec) for name, spec in (table or {}).items()}
        self.keys = tuple(keys)

    def raw_vector(self, spec: dict[str, float]) -> np.ndarray:
        return np.array([math.log1p(max(float(spec[k]), 0.0)) if k in spec else np.nan for k in self.keys])

    def fit(self, devices) -> "DeviceSpecs":
        missing = [d for d in devices if d not in self.table]
        if missing:
            raise KeyError(f"devices {sorted(set(missing))} have no entry in the device table")
        raw = np.stack([self.raw_vector(self.table[d]) for d in sorted(set(devices))])
        with warnings.catch_warnings():  # a spec no training device has: all-NaN column -> mean 0, scale 1
            warnings.simplefilter("ignore", RuntimeWarning)
            self.mean_ = np.nan_to_num(np.nanmean(raw, axis=0))
            std = np.nan_to_num(np.nanstd(raw, axis=0))
        self.std_ = np.where(std > 1e-6, std, 1.0)
        return self

    def add(self, name: str, spec: dict[str, float]) -> None:
        self.table[name] = dict(spec)

    def vector(self, name: str) -> np.ndarray:
        if name not in self.table:
            raise KeyError(f"device {name!r} is not in the model's device table; add its spec first "
                           "(TrainedModel.add_device(name, spec))")
        v = (self.raw_vector(self.table[name]) - self.mean_) / self.std_
        return np.nan_to_num(v).astype(np.float32)

    def matrix(self, names) -> tuple[np.ndarray, dict[str, int]]:
        """Spec vectors of the distinct ``names`` and a name -> row index map."""
        uniq = list(dict.fromkeys(names))
        return np.stack([self.vector(n) for n in uniq]), {n: i for i, n in enumerate(uniq)}

    @property
    def dim(self) -> int:
        return len(self.keys)

    def to_dict(self) -> dict:
        return dict(table=self.table, keys=list(self.keys), mean_=self.mean_.tolist(), std_=self.std_.tolist())

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceSpecs":
        obj = cls(d["table"], tuple(d["keys"]))
        obj.mean_, obj.std_ = np.asarray(d["mean_"]), np.asarray(d["std_"])
        return obj
