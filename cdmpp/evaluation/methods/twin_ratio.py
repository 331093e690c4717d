"""``TwinRatio``, the seen-programs baseline: the source twin's measured latency times a small GBT of the
log target/source ratio, fitted on the k measured target programs."""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np

from cdmpp.evaluation.methods.common import pooled_features
from cdmpp.evaluation.methods.method import Peer


class TwinRatio(Peer):
    """Seen programs: target latency = source twin's label × exp(GBT of the log ratio on k target shots).

    With no shots the ratio is 1 (the twin's label as is). The GBT is small (depth 3) and starts from
    the shots' median log ratio, so 16 shots give a sane constant and more shots a program-dependent ratio.
    """

    label = "twin-ratio"

    def __init__(self, twins: dict, nthread: int = 1, random_state: int = 0, rounds: int = 100, embed=None):
        self.twins, self.nthread, self.random_state, self.rounds = twins, nthread, random_state, rounds
        self.embed = embed  # optional programs -> [n, d] extra inputs (e.g. a cdmpp model's embeddings)

    def _twin(self, programs) -> np.ndarray:
        return np.array([self.twins[p.features.program_hash] for p in programs])

    def _x(self, programs) -> np.ndarray:
        x = pooled_features(programs)
        return x if self.embed is None else np.hstack([x, self.embed(programs)])

    def fit(self, shots: Sequence, val=None, time_budget_s=None) -> "TwinRatio":
        """Fits the ratio on target shots (the twins' labels are the source knowledge)."""
        import xgboost as xgb

        self.model_ = None
        self.base_ = 0.0
        if shots:
            r = np.log([p.seconds for p in shots]) - np.log(self._twin(shots))
            self.base_ = float(np.median(r))
            if len(shots) >= 8:
                self.model_ = xgb.XGBRegressor(n_estimators=self.rounds, learning_rate=0.1, max_depth=3,
                                               subsample=0.8, min_child_weight=2, tree_method="hist",
                                               n_jobs=self.nthread, random_state=self.random_state,
                                               base_score=self.base_)
                self.model_.fit(self._x(shots), r)
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        r = self.model_.predict(self._x(programs)).astype(np.float64) if self.model_ is not None else self.base_
        return self._twin(programs) * np.exp(r)

    def adapt(self, shots: Sequence) -> "TwinRatio":
        return copy.copy(self).fit(shots)

    def describe(self) -> str:
        return "the twin's label" + (" x a GBT of the log ratio" if self.model_ is not None else
                                     f" x {np.exp(self.base_):.3f} (median ratio of the shots)")
