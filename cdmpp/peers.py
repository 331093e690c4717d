"""Peer cost models, trained and evaluated on exactly the splits cdmpp gets (DESIGN.md §5).

* ``MetaScheduleXGB`` — MetaSchedule's own ``XGBModel`` (TVM 0.27), fed the same ``PerStoreFeature``
  rows cdmpp's featurizer stores. It learns, per group (a tuning task on one device), the throughput
  relative to the group's best program, with its pack-sum objective (one score per row, summed per
  program). Its scores order programs within a task but are not latencies, so it is reported on the
  ranking metrics only.
* ``XGBRegressorPeer`` — an ``xgboost.XGBRegressor`` on the same rows pooled the way ``XGBModel``
  pools them (summed over a program's rows) plus the device's specs (the inputs cdmpp gets),
  predicting log latency: the XGBoost baseline for MAPE/RMSE.
* ``TensetMLP`` — Tenset's segment-sum MLP (as ported to ``meta_schedule.cost_model.mlp_model``:
  row MLP → sum over rows → two residual layers → linear), predicting standardized log latency.
  Device-blind, as in Tenset (one model per device).

* ``PooledGBT`` — the strongest peer (issue 19): XGBoost on leaves pooled by sum, max and
  log-sum-exp, plus leaf count, log FLOPs, threads and device specs, predicting log(latency / FLOPs)
  with early stopping on validation.
* ``TwinRatio`` — the seen-programs baseline: the source twin's measured latency times a small GBT of
  the log target/source ratio, fitted on the k measured target programs.

Each peer: ``fit(train, val, time_budget_s)`` → self, ``predict(programs)``, ``adapt(shots)`` for
k-shot transfer; samples are anything with ``features``, ``device``, ``seconds``, ``task``.

XGBoost runs one thread by default: on a 2-core machine shared with a measurement job, OpenMP's
spin-waiting made 2 threads ~18x slower than 1 (200 trees: 9.6 s vs 0.5 s); pass ``nthread`` to change it.
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from typing import NamedTuple, Sequence

import numpy as np

N_FEATURES = 164


def _rows(features) -> np.ndarray:
    """A program's feature rows; a program without stores gets one zero row so it still gets a score."""
    f = np.asarray(features.leaf_features, dtype=np.float32)
    return f if len(f) else np.zeros((1, f.shape[1] if f.ndim == 2 else N_FEATURES), np.float32)


class _Rows(NamedTuple):
    """The two fields ``PackedPrograms`` reads (the MLP ignores positions)."""

    leaf_features: np.ndarray
    positions: np.ndarray


def _deadline_callback(deadline: float):
    """An XGBoost callback that stops boosting at a wall-clock deadline (keeps the trees so far)."""
    from xgboost.callback import TrainingCallback

    class _Deadline(TrainingCallback):
        def after_iteration(self, model, epoch, evals_log) -> bool:
            return time.monotonic() > deadline

    return _Deadline()


class MetaScheduleXGB:
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
        from cdmpp import tvm_env

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
            xs += [_rows(s.features) for s in members]
            ys.append(costs.min() / costs)
        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        real_train = xgb.train

        def capped_train(*args, callbacks=None, **kwargs):  # add the deadline to XGBModel's own callbacks
            return real_train(*args, callbacks=[*(callbacks or []), _deadline_callback(deadline)], **kwargs)

        xgb.train = capped_train
        try:
            self.model_._train(xs=xs, ys=np.concatenate(ys))
        finally:
            xgb.train = real_train
        self.n_rounds_ = int(self.model_.booster.num_boosted_rounds())

    def predict(self, programs: Sequence) -> np.ndarray:
        """Scores (higher = predicted faster), comparable within one task and device."""
        return np.asarray(self.model_._predict(xs=[_rows(p.features) for p in programs]), dtype=np.float64)

    def adapt(self, shots: Sequence, time_budget_s: float | None = None) -> "MetaScheduleXGB":
        """k-shot: add the measured target programs as new groups and retrain, as ``XGBModel.update`` does."""
        new = copy.copy(self)
        new.train_ = [*self.train_, *shots]
        new._train(time_budget_s)
        return new


class XGBRegressorPeer:
    """``xgboost.XGBRegressor`` on per-program sums of the TVM feature rows → log latency.

    With ``device_table`` ({device: spec dict}) each program also gets its device's specs (log1p, as
    cdmpp's device encoder sees them): without them a model trained on several devices cannot tell a
    program's 1-thread latency from its 2-thread one. Boosting stops early on validation RMSE (never
    on test); ``time_budget_s`` caps it.
    """

    label = "xgb-regressor (TVM features + device specs)"
    predicts = "seconds"

    def __init__(self, n_estimators: int = 3000, learning_rate: float = 0.05, max_depth: int = 8,
                 nthread: int = 1, random_state: int = 0, device_table: dict | None = None):
        from cdmpp.transforms import DeviceSpecs

        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.nthread = nthread
        self.random_state = random_state
        self.specs = DeviceSpecs(device_table) if device_table else None

    def pooled(self, programs: Sequence) -> np.ndarray:
        x = np.stack([_rows(p.features).sum(axis=0) for p in programs])
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
            callbacks=[_deadline_callback(deadline)])
        self.model_.fit(x, y, eval_set=evals, verbose=False)
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        return np.exp(self.model_.predict(self.pooled(programs)).astype(np.float64))

    def adapt(self, shots: Sequence, rounds: int = 50, time_budget_s: float | None = None) -> "XGBRegressorPeer":
        """k-shot: boost ``rounds`` more trees on the measured target programs, on top of the source model."""
        import xgboost as xgb

        new = copy.copy(self)
        new.model_ = xgb.XGBRegressor(n_estimators=rounds, learning_rate=self.learning_rate, max_depth=self.max_depth,
                                      tree_method="hist", n_jobs=self.nthread, random_state=self.random_state)
        new.model_.fit(self.pooled(shots), np.log([s.seconds for s in shots]), xgb_model=self.model_.get_booster())
        return new


class TensetMLP:
    """Tenset's segment-sum MLP in plain torch; the settings of TVM's port (hidden 256, Adam 7e-4,
    weight decay 1e-6, batch 128, gradient clip 0.5, 50 epochs, features divided by their column max).

    Differences from the port, on purpose: the column max is fitted on the training split only (the
    port recomputes it on every data loader, test included), the label is standardized log latency
    with MSE (the port learns relative throughput), and the epoch kept is the best on validation MAPE.
    """

    label = "mlp (Tenset segment-sum)"
    predicts = "seconds"

    def __init__(self, hidden_dim: int = 256, lr: float = 7e-4, weight_decay: float = 1e-6, batch_size: int = 128,
                 epochs: int = 50, grad_clip: float = 0.5, random_state: int = 0):
        self.hidden_dim = hidden_dim
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.epochs = epochs
        self.grad_clip = grad_clip
        self.random_state = random_state

    def _pack(self, programs: Sequence):
        from cdmpp.model import PackedPrograms

        rows = [_Rows(r, np.zeros(len(r), np.int64)) for r in (_rows(p.features) for p in programs)]
        return PackedPrograms.from_programs(rows, lambda x: x * self.inv_max_)

    def _forward(self, pack, idx: np.ndarray):
        import torch

        sub = pack.subset(idx)
        return self.net_(torch.from_numpy(sub.lengths), torch.from_numpy(sub.leaves))

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "TensetMLP":
        import torch

        torch.manual_seed(self.random_state)
        rng = np.random.default_rng(self.random_state)
        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        rows = np.concatenate([_rows(s.features) for s in train])
        col_max = np.abs(rows).max(axis=0)
        self.inv_max_ = np.where(col_max > 0, 1.0 / np.maximum(col_max, 1e-30), 0.0).astype(np.float32)
        y = np.log([s.seconds for s in train])
        self.y_mean_, self.y_std_ = float(y.mean()), float(max(y.std(), 1e-6))
        z = torch.tensor((y - self.y_mean_) / self.y_std_, dtype=torch.float32)
        self.net_ = _segment_sum_mlp(rows.shape[1], self.hidden_dim)
        pack = self._pack(train)
        val_pack = self._pack(val) if val else None
        val_y = np.array([s.seconds for s in val]) if val else None
        opt = torch.optim.Adam(self.net_.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        best, self.history_ = (np.inf, None), []
        for epoch in range(self.epochs):
            self.net_.train()
            order = rng.permutation(len(train))
            for start in range(0, len(train), self.batch_size):
                idx = order[start:start + self.batch_size]
                loss = torch.nn.functional.mse_loss(self._forward(pack, idx).reshape(-1), z[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.net_.parameters(), self.grad_clip)
                opt.step()
            if val_pack is not None:
                mape = float(np.mean(np.abs(self._predict_pack(val_pack) - val_y) / val_y))
                self.history_.append(round(mape, 5))
                if mape < best[0]:
                    best = (mape, copy.deepcopy(self.net_.state_dict()))
            if time.monotonic() > deadline:
                break
        if best[1] is not None:
            self.net_.load_state_dict(best[1])
        self.epochs_run_ = epoch + 1
        return self

    def _predict_pack(self, pack) -> np.ndarray:
        import torch

        self.net_.eval()
        out = np.empty(len(pack), np.float64)
        with torch.inference_mode():
            for start in range(0, len(pack), 1024):
                idx = np.arange(start, min(start + 1024, len(pack)))
                out[idx] = self._forward(pack, idx).reshape(-1).numpy()
        return np.exp(out * self.y_std_ + self.y_mean_)

    def predict(self, programs: Sequence) -> np.ndarray:
        return self._predict_pack(self._pack(programs))

    def adapt(self, shots: Sequence, steps: int = 100, lr: float = 1e-4, time_budget_s: float | None = None) -> "TensetMLP":
        """k-shot: ``steps`` Adam steps on the measured target programs (same recipe as cdmpp's fine-tuning)."""
        import torch

        new = copy.copy(self)
        new.net_ = copy.deepcopy(self.net_)
        pack = new._pack(shots)
        z = torch.tensor((np.log([s.seconds for s in shots]) - self.y_mean_) / self.y_std_, dtype=torch.float32)
        opt = torch.optim.Adam(new.net_.parameters(), lr=lr)
        rng = np.random.default_rng(self.random_state + 1)
        new.net_.train()
        for _ in range(steps):
            idx = rng.choice(len(shots), size=min(self.batch_size, len(shots)), replace=False)
            loss = torch.nn.functional.mse_loss(new._forward(pack, idx).reshape(-1), z[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(new.net_.parameters(), self.grad_clip)
            opt.step()
        return new


def _segment_sum_mlp(input_dim: int, hidden_dim: int):
    """Row MLP → sum over each program's rows → two residual ReLU layers → linear (Tenset's SegmentSumMLP)."""
    import torch
    from torch import nn

    class SegmentSumMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU(),
                                         nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
            self.layer0 = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
            self.layer1 = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
            self.decoder = nn.Linear(hidden_dim, 1)

        def forward(self, segment_sizes, rows):
            seg = torch.repeat_interleave(torch.arange(len(segment_sizes)), segment_sizes)
            enc = self.encoder(rows)
            pooled = torch.zeros(len(segment_sizes), enc.shape[1], dtype=enc.dtype).index_add_(0, seg, enc)
            out = self.layer0(pooled) + pooled
            out = self.layer1(out) + out
            return self.decoder(out)

    return SegmentSumMLP()


def pooled_features(programs: Sequence) -> np.ndarray:
    """Per program: sum, max and log-sum-exp of its leaf rows, leaf count and log2 FLOPs (device-free)."""
    out = []
    for p in programs:
        r = _rows(p.features).astype(np.float64)
        m = r.max(axis=0)
        lse = m + np.log(np.exp(r - m).sum(axis=0))
        out.append(np.concatenate([r.sum(axis=0), m, lse, [len(r), np.log2(p.features.flops + 1.0)]]))
    return np.asarray(out, dtype=np.float32)


class PooledGBT:
    """XGBoost on pooled leaves + program size + device specs → log(latency / FLOPs) (issue 19's peer).

    The FLOP-normalized target lets the trees learn efficiency instead of size; the device specs
    (raw, log1p) include the thread count, so one model serves every device.
    """

    label = "pooled GBT"
    predicts = "seconds"

    def __init__(self, device_table: dict, max_depth: int = 8, learning_rate: float = 0.05, n_estimators: int = 4000,
                 nthread: int = 1, random_state: int = 0, target: str = "flops"):
        from cdmpp.transforms import DeviceSpecs

        if target not in ("flops", "roofline"):
            raise ValueError(f"target = {target!r}: expected flops or roofline")
        self.specs = DeviceSpecs(device_table)
        self.max_depth, self.learning_rate, self.n_estimators = max_depth, learning_rate, n_estimators
        self.nthread, self.random_state, self.target = nthread, random_state, target

    def inputs(self, programs: Sequence) -> np.ndarray:
        dev = np.stack([self.specs.raw_vector(self.specs.table[p.device]) for p in programs])
        return np.hstack([pooled_features(programs), dev.astype(np.float32)])

    def scale(self, programs) -> np.ndarray:
        """What the latency is divided by: FLOPs + 1, or (``target="roofline"``) the device's roofline
        bound max(FLOPs / peak, unique bytes / bandwidth) in seconds, which stays a measure of the work
        for programs with few or no FLOPs (data movement: concatenate, pad, transpose)."""
        flops = np.array([p.features.flops for p in programs], dtype=np.float64)
        if self.target == "flops":
            return flops + 1.0
        from cdmpp.model import _UNIQUE_BYTES_COLS

        unique = np.array([float((np.exp2(_rows(p.features)[:, _UNIQUE_BYTES_COLS].astype(np.float64)) - 1.0).sum())
                           for p in programs])
        peak = np.array([float(self.specs.table[p.device].get("peak_gflops", 1.0)) for p in programs]) * 1e9
        bw = np.array([float(self.specs.table[p.device].get("mem_bw_gbs", 1.0)) for p in programs]) * 1e9
        return np.maximum(np.maximum(flops / peak, unique / bw), 1e-9)

    def _target(self, programs) -> np.ndarray:
        return np.log(np.array([p.seconds for p in programs]) / self.scale(programs))

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "PooledGBT":
        import xgboost as xgb

        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        evals = [(self.inputs(val), self._target(val))] if val else None
        self.model_ = xgb.XGBRegressor(
            n_estimators=self.n_estimators, learning_rate=self.learning_rate, max_depth=self.max_depth,
            subsample=0.9, colsample_bytree=0.7, min_child_weight=2, tree_method="hist", n_jobs=self.nthread,
            random_state=self.random_state, early_stopping_rounds=100 if evals else None,
            callbacks=[_deadline_callback(deadline)])
        self.model_.fit(self.inputs(train), self._target(train), eval_set=evals, verbose=False)
        best = getattr(self.model_, "best_iteration", None)
        booster = self.model_.get_booster()
        # keep only the trees up to the best validation round, so trees added by ``adapt`` count
        self.booster_ = booster[: best + 1] if best is not None else booster
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        import xgboost as xgb

        return self.scale(programs) * np.exp(self.booster_.predict(xgb.DMatrix(self.inputs(programs))).astype(np.float64))

    def adapt(self, shots: Sequence, rounds: int = 50) -> "PooledGBT":
        """k-shot: ``rounds`` more shallow trees on the measured target programs, on top of the source model."""
        import xgboost as xgb

        new = copy.copy(self)
        params = dict(eta=self.learning_rate, max_depth=3, nthread=self.nthread, seed=self.random_state,
                      tree_method="hist")
        new.booster_ = xgb.train(params, xgb.DMatrix(self.inputs(shots), label=self._target(shots)), rounds,
                                 xgb_model=self.booster_.copy())
        return new


def physics_features(programs: Sequence, twins: dict | None = None) -> np.ndarray:
    """A few program-level numbers that set how a latency moves between devices: log2 FLOPs (block
    count), bytes and unique bytes, arithmetic intensity, the largest parallel extent, leaf count,
    and (with ``twins``) log of the twin's measured seconds and its FLOP rate on the source device."""
    from cdmpp.model import PackedPrograms

    stats = PackedPrograms.from_programs([p.features for p in programs]).stats
    par = np.array([float(np.exp2(_rows(p.features)[:, 39].astype(np.float64)).max() - 1.0) for p in programs])
    cols = [stats, stats[:, :1] - stats[:, 2:3], np.log2(1.0 + par)[:, None],
            np.array([[p.features.n_leaves] for p in programs], dtype=np.float64)]
    if twins is not None:
        tw = np.log2(np.array([twins[p.features.program_hash] for p in programs]))
        cols += [tw[:, None], (stats[:, 0] - tw)[:, None]]
    return np.hstack(cols).astype(np.float32)


class TwinRatio:
    """Seen programs: target latency = source twin's label × exp(GBT of the log ratio on k target shots).

    With no shots the ratio is 1 (the twin's label as is). The GBT is small (depth 3) and starts from
    the shots' median log ratio, so 16 shots give a sane constant and more shots a program-dependent ratio.
    ``inputs``: "pooled" (the pooled leaf features), "physics" (``physics_features`` with the twin's
    latency: a dozen numbers instead of ~500, which k shots can fit) or "both".
    """

    label = "twin-ratio"
    predicts = "seconds"

    def __init__(self, twins: dict, nthread: int = 1, random_state: int = 0, rounds: int = 100, embed=None,
                 inputs: str = "pooled"):
        self.twins, self.nthread, self.random_state, self.rounds = twins, nthread, random_state, rounds
        self.embed = embed  # optional programs -> [n, d] extra inputs (e.g. a cdmpp model's embeddings)
        if inputs not in ("pooled", "physics", "both"):
            raise ValueError(f"inputs = {inputs!r}: expected pooled, physics or both")
        self.inputs = inputs

    def _twin(self, programs) -> np.ndarray:
        return np.array([self.twins[p.features.program_hash] for p in programs])

    def _x(self, programs) -> np.ndarray:
        parts = []
        if self.inputs in ("pooled", "both"):
            parts.append(pooled_features(programs))
        if self.inputs in ("physics", "both"):
            parts.append(physics_features(programs, self.twins))
        if self.embed is not None:
            parts.append(self.embed(programs))
        return np.hstack(parts)

    def fit(self, shots: Sequence, val=None, time_budget_s=None) -> "TwinRatio":
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


PEERS = {"xgb": (MetaScheduleXGB, XGBRegressorPeer), "mlp": (TensetMLP,)}


def make_peers(names: Sequence[str], nthread: int = 1, seed: int = 0, device_table: dict | None = None) -> list:
    """Peers by short name: ``"xgb"`` gives both XGBoost peers (ranking + regressor), ``"mlp"`` Tenset's MLP.
    ``device_table`` ({device: spec dict}) goes to the peer that can use device specs (the regressor)."""
    out = []
    for name in names:
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}: expected one of {sorted(PEERS)}")
        for cls in PEERS[name]:
            if cls is TensetMLP:
                out.append(cls(random_state=seed))
            elif cls is XGBRegressorPeer:
                out.append(cls(nthread=nthread, device_table=device_table))
            else:
                out.append(cls(nthread=nthread))
    return out
