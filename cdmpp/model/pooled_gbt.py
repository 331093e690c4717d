"""``PooledGBT``, the strongest peer (issue 19): XGBoost on leaves pooled by sum, max and log-sum-exp,
plus leaf count, log FLOPs, threads and device specs, predicting log(latency / FLOPs) with early stopping
on validation. It lives with the model because the shipped recipe blends it into cdmpp's prediction;
the evaluation uses it as a peer. The leaf pooling and the boosting deadline here serve the other
peers too."""

from __future__ import annotations

import copy
import tempfile
import time
from typing import Sequence

import numpy as np

from cdmpp.program.assembly import N_INPUTS, count_inputs
from cdmpp.program.features import N_FEATURES


def roofline_seconds(features: Sequence, peak_gflops, mem_bw_gbs, work=None) -> np.ndarray:
    """Per program (``ProgramFeatures``), its roofline bound on a device: max(FLOPs / peak, unique bytes /
    bandwidth) in seconds, at least 1 ns. ``peak_gflops`` and ``mem_bw_gbs``: one number, or one per program.
    ``work``: ``program_work(features)`` when the caller bounds the same programs on several devices."""
    flops, unique = program_work(features) if work is None else work
    peak = np.asarray(peak_gflops, dtype=np.float64) * 1e9
    bw = np.asarray(mem_bw_gbs, dtype=np.float64) * 1e9
    return np.maximum(np.maximum(flops / peak, unique / bw), 1e-9)


def program_work(features: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Per program, its FLOPs and the unique bytes its stores touch (TVM's per-store counts, summed)."""
    from cdmpp.model.network import _UNIQUE_BYTES_COLS

    flops = np.array([f.flops for f in features], dtype=np.float64)
    unique = np.array([float((np.exp2(program_rows(f)[:, _UNIQUE_BYTES_COLS].astype(np.float64)) - 1.0).sum())
                       for f in features])
    return flops, unique


def program_rows(features) -> np.ndarray:
    """A program's feature rows; a program without stores gets one zero row so it still gets a score."""
    f = np.asarray(features.leaf_features, dtype=np.float32)
    return f if len(f) else np.zeros((1, f.shape[1] if f.ndim == 2 else N_FEATURES), np.float32)


def summed_rows(features: Sequence) -> np.ndarray:
    """Per program (``ProgramFeatures``), its leaf rows summed and its leaf count: TVM XGBModel's
    ``PackSum`` view, the input of the cost model's per-task correction and of the XGBoost peer."""
    return np.stack([np.append(program_rows(f).sum(axis=0), f.n_leaves) for f in features]).astype(np.float32)


def deadline_callback(deadline: float):
    """An XGBoost callback that stops boosting at a wall-clock deadline (keeps the trees so far)."""
    from xgboost.callback import TrainingCallback

    class _Deadline(TrainingCallback):
        def after_iteration(self, model, epoch, evals_log) -> bool:
            return time.monotonic() > deadline

    return _Deadline()


def pooled_features(programs: Sequence) -> np.ndarray:
    """Per program: sum, max and log-sum-exp of its leaf rows, leaf count and log2 FLOPs (device-free).
    All programs at once (one array of every row, reduced per program): a cost model pools thousands."""
    if not len(programs):
        return np.zeros((0, 3 * N_FEATURES + 2), np.float32)
    rows = [program_rows(p.features) for p in programs]
    counts = np.array([len(r) for r in rows])
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return pool_rows(np.concatenate(rows), offsets, np.array([p.features.flops for p in programs], dtype=np.float64))


def programs_count_inputs(programs: Sequence) -> np.ndarray:
    """``count_inputs`` of each program's built counts (NaN rows where a program was not built): what a GBT that
    reads the assembly counts appends to ``pooled_features``."""
    rows = [count_inputs(getattr(p.features, "asm", None)) for p in programs]
    return (np.stack(rows) if rows else np.zeros((0, N_INPUTS))).astype(np.float32)


def pool_rows(rows: np.ndarray, offsets: np.ndarray, flops: np.ndarray) -> np.ndarray:
    """``pooled_features`` of programs packed as ``rows`` (program i: ``offsets[i]:offsets[i+1]``, at least one
    row each) and their FLOPs: the same numbers from a pack or a chunk of a feature store."""
    flat = np.asarray(rows).astype(np.float64)
    starts, counts = offsets[:-1], np.diff(offsets)
    m = np.maximum.reduceat(flat, starts, axis=0)
    lse = m + np.log(np.add.reduceat(np.exp(flat - np.repeat(m, counts, axis=0)), starts, axis=0))
    flops = np.log2(np.asarray(flops, dtype=np.float64) + 1.0)
    return np.hstack([np.add.reduceat(flat, starts, axis=0), m, lse, counts[:, None], flops[:, None]]).astype(np.float32)


def store_count_inputs(store, a: int, b: int) -> np.ndarray:
    """``count_inputs`` of a feature store's programs ``a:b``, from the assembly columns of its stats (NaN where a
    program was not built), so a store and the same programs in memory give the GBT the same inputs."""
    from cdmpp.model.network import N_ROOFLINE_STATS, N_STATS

    if store.stats is None or store.stats.shape[1] < N_STATS:
        raise ValueError(f"{store.path}: its stats have no assembly counts (written before them): write the store again")
    x = np.array(store.stats[a:b, N_ROOFLINE_STATS:N_STATS - 1], dtype=np.float32)
    x[store.stats[a:b, N_STATS - 1] == 0] = np.nan
    return x


class PooledGBT:
    """XGBoost on pooled leaves + program size + device specs → log(latency / FLOPs) (issue 19's peer).

    The FLOP-normalized target lets the trees learn efficiency instead of size; the device specs
    (raw, log1p) include the thread count, so one model serves every device.
    """

    label = "pooled GBT"  # the row name in reports (an evaluation ``Method``)
    predicts = "seconds"
    budget_weight = 0.3
    booster_params = dict(subsample=0.9, colsample_bytree=0.7, min_child_weight=2)

    def __init__(self, device_table: dict, max_depth: int = 8, learning_rate: float = 0.05, n_estimators: int = 4000,
                 nthread: int = 1, random_state: int = 0, target: str = "flops", loss: str = "l2",
                 assembly_counts: bool = False, **booster_params):
        from cdmpp.model.transforms import DeviceSpecs

        if target not in ("flops", "roofline", "latency"):
            raise ValueError(f"target = {target!r}: expected flops, roofline or latency")
        if loss not in ("l2", "mape"):
            raise ValueError(f"loss = {loss!r}: expected l2 or mape")
        self.specs = DeviceSpecs(device_table)
        self.max_depth, self.learning_rate, self.n_estimators = max_depth, learning_rate, n_estimators
        self.nthread, self.random_state, self.target, self.loss = nthread, random_state, target, loss
        self.assembly_counts = assembly_counts  # the built programs' count_inputs as inputs too (NaN: not built)
        self.booster_params = {**self.booster_params, **booster_params}  # any other XGBRegressor setting

    def inputs(self, programs: Sequence) -> np.ndarray:
        dev = np.stack([self.specs.raw_vector(self.specs.table[p.device]) for p in programs])
        x = [pooled_features(programs), dev.astype(np.float32)]
        if self.assembly_counts:
            x.append(programs_count_inputs(programs))
        return np.hstack(x)

    def scale(self, programs) -> np.ndarray:
        """What the latency is divided by: FLOPs + 1, or (``target="roofline"``) the device's roofline
        bound max(FLOPs / peak, unique bytes / bandwidth) in seconds, which stays a measure of the work
        for programs with few or no FLOPs (data movement: concatenate, pad, transpose), or
        (``target="latency"``) nothing: plain log latency, log FLOPs being only an input. With programs
        at ~0 FLOPs beside ~10⁹, a FLOP-normalized target has two scales, and trees that put a program
        in the other one's leaf predict it thousands of times off; plain latency keeps every
        prediction within the training labels' range."""
        flops = np.array([p.features.flops for p in programs], dtype=np.float64)
        if self.target == "latency":
            return np.ones(len(programs))
        if self.target == "flops":
            return flops + 1.0
        specs = [self.specs.table[p.device] for p in programs]
        return roofline_seconds([p.features for p in programs], [s.get("peak_gflops", 1.0) for s in specs],
                                [s.get("mem_bw_gbs", 1.0) for s in specs])

    def _target(self, programs) -> np.ndarray:
        return np.log(np.array([p.seconds for p in programs]) / self.scale(programs))

    def fit(self, train, val: Sequence | None = None, time_budget_s: float | None = None,
            unbuilt_copies: np.ndarray | None = None) -> "PooledGBT":
        """Fit on labelled programs ``train`` or on a ``FeatureStore`` (its rows pooled chunk by chunk into
        XGBoost's quantized matrix: no matrix of every program's inputs); early stopping on ``val``.
        ``unbuilt_copies``: a mask of the training programs fitted a second time without their assembly counts
        (``TrainConfig.assembly_unbuilt_copies``)."""
        from cdmpp.model.feature_store import FeatureStore

        if isinstance(train, FeatureStore):
            return self._fit_store(train, val, time_budget_s, unbuilt_copies)
        if unbuilt_copies is not None:
            train = [*train, *(p.without_counts() for p, c in zip(train, unbuilt_copies) if c)]
        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        evals = [(self.inputs(val), self._target(val))] if val else None
        objective = {}
        if self.loss == "mape":  # the reported metric itself, as cdmpp's recipe trains
            objective = dict(objective=_mape_objective, eval_metric=_mape_metric,
                             base_score=float(np.median(self._target(train))))
        self.model_ = self._regressor(deadline, bool(evals), **objective)
        self.model_.fit(self.inputs(train), self._target(train), eval_set=evals, verbose=False)
        return self._keep_best(self.model_.get_booster())

    def _regressor(self, deadline: float, early_stopping: bool, **objective):
        import xgboost as xgb

        return xgb.XGBRegressor(
            n_estimators=self.n_estimators, learning_rate=self.learning_rate, max_depth=self.max_depth,
            tree_method="hist", n_jobs=self.nthread, random_state=self.random_state,
            early_stopping_rounds=100 if early_stopping else None, callbacks=[deadline_callback(deadline)],
            **{**self.booster_params, **objective})

    def _keep_best(self, booster) -> "PooledGBT":
        # keep only the trees up to the best validation round, so trees added by ``adapt`` count
        best = getattr(booster, "best_iteration", None)
        self.booster_ = booster[: best + 1] if best is not None else booster
        return self

    def _fit_store(self, store, val: Sequence | None, time_budget_s: float | None,
                   unbuilt_copies: np.ndarray | None = None) -> "PooledGBT":
        """What ``fit`` does with the regressor's own parameters, its training matrix XGBoost's external-memory
        one: the store's chunks (``store_inputs``) quantized into pages in a temporary folder (``$TMPDIR``) and
        read back from there while boosting, so the quantized data (~1 KB a program) is not held in memory. The
        same cuts and trees as a ``QuantileDMatrix`` of the same chunks (tests/model/test_feature_store.py)."""
        import xgboost as xgb

        if self.target != "latency" or self.loss != "l2":
            raise ValueError(f"a pooled GBT fits from a feature store with target='latency', loss='l2' (the blend's), "
                             f"not target={self.target!r}, loss={self.loss!r}")
        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        reg = self._regressor(deadline, bool(val))
        with tempfile.TemporaryDirectory(prefix="cdmpp-gbt-pages-") as pages:
            dtrain = xgb.ExtMemQuantileDMatrix(_data_iter(lambda: self.store_inputs(store, unbuilt_copies), f"{pages}/page"),
                                               nthread=self.nthread, max_bin=reg.max_bin)
            evals = [(xgb.QuantileDMatrix(self.inputs(val), self._target(val), ref=dtrain, nthread=self.nthread,
                                          max_bin=reg.max_bin), "validation_0")] if val else []
            booster = xgb.train(reg.get_xgb_params(), dtrain, reg.get_num_boosting_rounds(), evals=evals,
                                early_stopping_rounds=reg.early_stopping_rounds, verbose_eval=False,
                                callbacks=reg.callbacks)
            del dtrain, evals  # XGBoost removes its pages when the matrix goes, before their folder does
        return self._keep_best(booster)

    def store_inputs(self, store, unbuilt_copies: np.ndarray | None = None):
        """``(inputs, log seconds)`` of a ``FeatureStore``'s programs, chunk by chunk: the numbers ``inputs``
        and the latency target give the same programs in memory; then, in a second pass, the ``unbuilt_copies``
        (a mask) with their counts absent: the rows ``fit`` makes in memory, in the same order (the same cuts)."""
        dev = np.stack([self.specs.raw_vector(self.specs.table[d]) for d in store.devices]).astype(np.float32)
        copies = np.asarray(unbuilt_copies, bool) if unbuilt_copies is not None and self.assembly_counts else None
        for unbuilt in (False, True) if copies is not None and copies.any() else (False,):
            for a, b, rows, offsets in store.program_chunks():
                pick = copies[a:b] if unbuilt else slice(None)
                if unbuilt and not pick.any():
                    continue
                x = np.hstack([pool_rows(rows, offsets, store.flops[a:b]), dev[store.device[a:b]]])
                if self.assembly_counts:
                    x = np.hstack([x, store_count_inputs(store, a, b)])
                x, y = x[pick], np.log(store.seconds[a:b])[pick]
                if unbuilt:
                    x[:, -N_INPUTS:] = np.nan
                yield x, y

    def predict(self, programs: Sequence) -> np.ndarray:
        import xgboost as xgb

        return self.scale(programs) * np.exp(self.booster_.predict(xgb.DMatrix(self.inputs(programs))).astype(np.float64))

    def describe(self) -> str:
        return (f"pooled leaves + device specs -> log latency ({self.target} target, {self.loss} loss); "
                f"{self.booster_.num_boosted_rounds()} trees")

    def predict_interval(self, programs: Sequence):
        return self.predict(programs), None, None

    def adapt(self, shots: Sequence, rounds: int | None = None) -> "PooledGBT":
        """k-shot: ``rounds`` more shallow trees on the measured target programs, on top of the source model;
        by default ``adapt_rounds`` of the number of shots."""
        import xgboost as xgb

        rounds = adapt_rounds(len(shots)) if rounds is None else rounds
        new = copy.copy(self)
        params = dict(eta=self.learning_rate, max_depth=3, nthread=self.nthread, seed=self.random_state,
                      tree_method="hist")
        new.booster_ = xgb.train(params, xgb.DMatrix(self.inputs(shots), label=self._target(shots)), rounds,
                                 xgb_model=self.booster_.copy())
        return new


def _data_iter(make, cache_prefix: str | None = None):
    """An ``xgboost.DataIter`` over ``make()``'s ``(x, y)`` chunks, restartable: XGBoost passes over the data
    more than once (quantile sketch, then the quantized matrix). ``cache_prefix``: where an external-memory
    matrix writes its pages."""
    import xgboost as xgb

    class Chunks(xgb.DataIter):
        def __init__(self):
            self.it = None
            super().__init__(cache_prefix=cache_prefix)

        def next(self, input_data) -> bool:
            if self.it is None:
                self.it = make()
            chunk = next(self.it, None)
            if chunk is None:
                return False
            input_data(data=chunk[0], label=chunk[1])
            return True

        def reset(self) -> None:
            self.it = None

    return Chunks()


def adapt_rounds(k: int, most: int = 50) -> int:
    """Trees ``PooledGBT.adapt`` adds for ``k`` shots: half a tree per shot, at most ``most``. Fifty depth-3
    trees on 16 shots fit them and carry their noise to the whole device (reports/study-issue19.md, round 24)."""
    return int(min(most, max(1, k // 2)))


def _mape_objective(target: np.ndarray, predicted: np.ndarray):
    """|exp(d) - 1| with d = predicted - target in log space (the APE): gradient sign(d) e^d; the
    Hessian e^d is exact where d > 0 and keeps Newton steps short on the concave side d < 0."""
    e = np.exp(np.clip(predicted - target, -20.0, 20.0))
    return np.sign(predicted - target) * e, e


def _mape_metric(target: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(np.exp(np.clip(predicted - target, -20.0, 20.0)) - 1.0)))
