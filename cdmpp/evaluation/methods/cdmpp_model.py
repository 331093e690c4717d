"""``CDMPP``: the cdmpp predictor (``fit``/``finetune`` of ``cdmpp.model.training``) as a ``Method``, so the
harness treats it, its ablations and the peers alike."""

from __future__ import annotations

import copy
import dataclasses
from typing import Sequence

import numpy as np

from cdmpp.model.training import TrainConfig, checked_finetune, fit


class CDMPP:
    """cdmpp trained with ``config`` (a ``TrainConfig``). ``target_pool``: unlabeled target programs for
    domain adaptation (None: none). ``time_budget_s`` of ``fit`` caps training as ``max_minutes`` does.
    ``resume``: a file the training run is saved to after every epoch and resumed from (``fit``'s)."""

    predicts = "seconds"
    budget_weight = 1.0
    shot_choice = True  # cross-device shots go through ShotChoice (the shipped k-shot path); ``adapt`` fine-tunes

    def __init__(self, config: TrainConfig, device_table: dict, target_pool: Sequence | None = None,
                 label: str = "cdmpp"):
        self.config, self.device_table, self.target_pool, self.label = config, device_table, target_pool, label
        self.resume: str | None = None

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "CDMPP":
        config = dataclasses.replace(self.config, max_minutes=time_budget_s / 60) if time_budget_s else self.config
        self.model_ = fit(config, train, val, target_pool=self.target_pool, device_table=self.device_table,
                          resume=self.resume)
        return self

    def predict_interval(self, programs: Sequence):
        return self.model_.predict([p.features for p in programs], [p.device for p in programs])

    def predict(self, programs: Sequence) -> np.ndarray:
        return self.predict_interval(programs)[0]

    def predict_order(self, programs: Sequence) -> np.ndarray:
        return self.model_.predict([p.features for p in programs], [p.device for p in programs], order=True)[0]

    def predict_interval_and_order(self, programs: Sequence):
        """``predict_interval`` and ``predict_order`` from one pass of the transformer: (mean, lo, hi, order)."""
        (mean, lo, hi), (order, _, _) = self.model_.predict_orders([p.features for p in programs],
                                                                   [p.device for p in programs])
        return mean, lo, hi, order

    def embed(self, features: Sequence) -> np.ndarray:
        return self.model_.embed(features)

    def adapt(self, shots: Sequence) -> "CDMPP":
        new = copy.copy(self)
        new.model_ = checked_finetune(self.model_, shots, self.config, device_table=self.device_table)
        return new

    def describe(self) -> str:
        s, c = self.model_.summary, self.config
        runs = s.get("members", [{}])
        stop = ", ".join(f"stopped by {r.get('stopped')} after {len(r.get('history', []))} epochs" for r in runs)
        da = (f"DA {c.da.upper()} (weight {c.da_weight}) on {s.get('n_target')} unlabeled target programs"
              if self.target_pool and c.da != "none" and s.get("n_target") else "no domain adaptation")
        return f"{da}; {stop}; val MAPE {100 * s['val']['mape']:.1f} %"
