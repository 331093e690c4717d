"""The XGBoost peers, fed the same ``PerStoreFeature`` rows cdmpp's featurizer stores.

* ``MetaScheduleXGB`` — MetaSchedule's own ``XGBModel`` (TVM 0.27). It learns, per group (a tuning task
  on one device), the throughput relative to the group's best program, with its pack-sum objective (one
  score per row, summed per program). Its scores order programs within a task but are not latencies, so
  it is reported on the ranking metrics only.
* ``XGBRegressorPeer`` — an ``xgboost.XGBRegressor`` on the same rows pooled the way ``XGBModel`` pools
  them (summed over a program's rows) plus the device's specs (the inputs cdmpp gets), predicting log
  latency: the XGBoost baseline for MAPE/RMSE.
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from typing import Sequence

import numpy as np

from cdmpp.model.pooled_gbt import deadline_callback, program_rows, summed_rows
from cdmpp.evaluation.methods.method import Peer


class MetaScheduleXGB(Peer):
    """TVM MetaSchedule's ``XGBModel``, trained through its own ``_train`` on precomputed features.

    ``XGBModel.update`` would extract the same ``PerStoreFeature`` rows from rebuilt schedules, label
    each program ``min cost of its group / cost`` and call ``_train``; we do exactly that without
    rebuilding (the rows are stored in the dataset). Groups are (device, task): MetaSchedule groups by
    the task's module, and a model serving several devices must not mix their latencies.
    ``_train`` boosts up to 10,000 rounds with early stopping on *training* p-RMSE, as in tuning;
    ``max_seconds`` caps it (the rounds so far are kept).
    """

    label = "xgb (TVM XGBModel, ranking)"
    predicts = "score"  # higher = faster; not a latency

    def __init__(self, nthread: int = 1, seed: int = 43):
        self.nthread = nthread
        self.seed = seed

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "MetaScheduleXGB":
        self.train_ = list(train)
        self._train(time_budget_s)
        return self

    def _train(self, time_budget_s: float | None) -> None:
        from cdmpp.program import tvm_env

        tvm_env.setup()
        import xgboost as xgb
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig, XGBModel

        self.model_ = XGBModel(config=XGBConfig(nthread=self.nthread, seed=self.seed), num_warmup_samples=0,
                               adaptive_training=False)
        groups: dict[tuple, list] = defaultdict(list)
        for s in self.train_:
            groups[(s.device, s.task)].append(s)
        xs, ys = [], []
        for members in groups.values():  # as XGBModel.update: label = group's min cost / cost
            costs = np.array([s.seconds for s in members], dtype=np.float32)
            xs += [program_rows(s.features) for s in members]
            ys.append(costs.min() / costs)
        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        real_train = xgb.train

        def capped_train(*args, callbacks=None, **kwargs):  # add the deadline to XGBModel's own callbacks
            return real_train(*args, callbacks=[*(callbacks or []), deadline_callback(deadline)], **kwargs)

        xgb.train = capped_train
        try:
            self.model_._train(xs=xs, ys=np.concatenate(ys))
        finally:
            xgb.train = real_train
        self.n_rounds_ = int(self.model_.booster.num_boosted_rounds())

    def predict(self, programs: Sequence) -> np.ndarray:
        """Scores (higher = predicted faster), comparable within one task and device."""
        return np.asarray(self.model_._predict(xs=[program_rows(p.features) for p in programs]), dtype=np.float64)

    def describe(self) -> str:
        return f"relative-throughput scores within a task: ranking metrics only; {self.n_rounds_} boosting rounds"

    def adapt(self, shots: Sequence, time_budget_s: float | None = None) -> "MetaScheduleXGB":
        """k-shot: add the measured target programs as new groups and retrain, as ``XGBModel.update`` does."""
        new = copy.copy(self)
        new.train_ = [*self.train_, *shots]
        new._train(time_budget_s)
        return new


class XGBRegressorPeer(Peer):
    """``xgboost.XGBRegressor`` on per-program sums of the TVM feature rows → log latency.

    With ``device_table`` ({device: spec dict}) each program also gets its device's specs (log1p, as
    cdmpp's device encoder sees them): without them a model trained on several devices cannot tell a
    program's 1-thread latency from its 2-thread one. Boosting stops early on validation RMSE (never
    on test); ``time_budget_s`` caps it.
    """

    label = "xgb-regressor (TVM features + device specs)"

    def __init__(self, n_estimators: int = 3000, learning_rate: float = 0.05, max_depth: int = 8,
                 nthread: int = 1, random_state: int = 0, device_table: dict | None = None):
        from cdmpp.model.transforms import DeviceSpecs

        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.nthread = nthread
        self.random_state = random_state
        self.specs = DeviceSpecs(device_table) if device_table else None

    def pooled(self, programs: Sequence) -> np.ndarray:
        x = summed_rows([p.features for p in programs])[:, :-1]
        if self.specs is None:
            return x
        try:
            dev = np.stack([self.specs.raw_vector(self.specs.table[p.device]) for p in programs])
        except KeyError as e:
            raise KeyError(f"device {e.args[0]!r} has no entry in the device table") from None
        return np.hstack([x, dev])

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "XGBRegressorPeer":
        import xgboost as xgb

        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        x, y = self.pooled(train), np.log([s.seconds for s in train])
        evals = [(self.pooled(val), np.log([s.seconds for s in val]))] if val else None
        self.model_ = xgb.XGBRegressor(
            n_estimators=self.n_estimators, learning_rate=self.learning_rate, max_depth=self.max_depth,
            subsample=0.9, colsample_bytree=0.9, tree_method="hist", n_jobs=self.nthread,
            random_state=self.random_state, early_stopping_rounds=100 if evals else None,
            callbacks=[deadline_callback(deadline)])
        self.model_.fit(x, y, eval_set=evals, verbose=False)
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        return np.exp(self.model_.predict(self.pooled(programs)).astype(np.float64))

    def describe(self) -> str:
        n = getattr(self.model_, "best_iteration", None)
        specs = " + device specs" if self.specs is not None else ""
        return f"sum-pooled rows{specs} -> log latency; {n + 1 if n is not None else '?'} trees (early stopping on val)"

    def adapt(self, shots: Sequence, rounds: int = 50, time_budget_s: float | None = None) -> "XGBRegressorPeer":
        """k-shot: boost ``rounds`` more trees on the measured target programs, on top of the source model."""
        import xgboost as xgb

        new = copy.copy(self)
        new.model_ = xgb.XGBRegressor(n_estimators=rounds, learning_rate=self.learning_rate, max_depth=self.max_depth,
                                      tree_method="hist", n_jobs=self.nthread, random_state=self.random_state)
        new.model_.fit(self.pooled(shots), np.log([s.seconds for s in shots]), xgb_model=self.model_.get_booster())
        return new


