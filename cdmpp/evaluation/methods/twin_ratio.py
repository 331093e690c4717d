"""``TwinRatio``, the seen-programs baseline: the source twin's measured latency times a small GBT of the
log target/source ratio, fitted on the k measured target programs."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from typing import NamedTuple, Sequence

import numpy as np

from cdmpp.model.pooled_gbt import pooled_features, program_rows, program_work, roofline_seconds
from cdmpp.evaluation.methods.method import Peer
from cdmpp.model import physics


def physics_features(programs: Sequence, twins: dict | None = None) -> np.ndarray:
    """A few program-level numbers that set how a latency moves between devices: log2 FLOPs (block
    count), bytes and unique bytes, arithmetic intensity, the largest parallel extent, leaf count,
    and (with ``twins``) log of the twin's measured seconds and its FLOP rate on the source device."""
    from cdmpp.model.network import PackedPrograms

    stats = PackedPrograms.from_programs([p.features for p in programs]).stats
    par = np.array([float(np.exp2(program_rows(p.features)[:, 39].astype(np.float64)).max() - 1.0) for p in programs])
    cols = [stats, stats[:, :1] - stats[:, 2:3], np.log2(1.0 + par)[:, None],
            np.array([[p.features.n_leaves] for p in programs], dtype=np.float64)]
    if twins is not None:
        tw = np.log2(np.array([twins[p.features.program_hash] for p in programs]))
        cols += [tw[:, None], (stats[:, 0] - tw)[:, None]]
    return np.hstack(cols).astype(np.float32)


# what cross-validation on the shots picks from, for each base: no correction (None), the shots' median
# ratio (0 rounds), or the ratio GBT's rounds
ROUND_CHOICES = (None, 0, 10, 30, 100)
# the step of the weights ``TwinRatio`` averages its bases' corrections with
WEIGHT_STEP = 0.1


class Corrected(NamedTuple):
    """One base of a fitted ``TwinRatio``: its log prediction (log base + ``shift``, or + the booster's
    prediction) enters the mean with ``weight``."""

    base: int | str  # a prior's index, or "twin"
    rounds: int | None  # None: uncorrected; 0: shifted by the shots' median log ratio
    weight: float
    shift: float
    booster: object | None


class TwinRatio(Peer):
    """Seen programs: target latency = source twin's label × exp(GBT of the log ratio on k target shots).

    With no shots the ratio is 1 (the twin's label as is). The GBT is small (depth 3) and starts from
    the shots' median log ratio; its number of rounds (0: that median alone; None: no correction) is
    chosen by cross-validation on the shots (``rounds=None``), since a few dozen shots overfit hundreds of
    input columns and a prior that is already right needs no correction. ``inputs``: "pooled" (the pooled
    leaf features), "physics" (``physics_features`` with the twin's latency: a dozen numbers instead of
    ~500, which k shots can fit; with priors, also what they predict) or "both". ``prior``: a fitted
    predictor (``TwinAmdahl``, ``TwinRoofline``, ...) or a list of them, that may replace the twin's label
    as what the ratio corrects, so the shots fit only what the physics leaves over (a few shots cannot
    correct a bare twin label as well as physics does; many can do better; which physics fits depends on
    the two devices). Without shots the first prior is the base.

    With priors there are several bases to correct. Each gets the rounds its cross-validation prefers,
    and the prediction is a weighted geometric mean of the corrected bases, the weights (step
    ``WEIGHT_STEP``) those with the lowest MAPE of the held-out predictions: their errors differ, so a
    mean beats the best of them. The one-standard-error rule keeps the first base uncorrected unless the
    best single correction beats it by more than the standard error of the difference: KMeans shots cover the pool's
    sparse corners, so a few dozen of them can make a correction look better on the shots than it is on
    the programs they were drawn from. ``bags``: so many fits, each with its own folds and subsamples
    (``random_state`` + i), averaged in log space.
    """

    label = "twin-ratio"

    def __init__(self, twins: dict, nthread: int = 1, random_state: int = 0, rounds: int | None = None, embed=None,
                 inputs: str = "pooled", prior=None, bags: int = 3):
        self.twins, self.nthread, self.random_state, self.rounds = twins, nthread, random_state, rounds
        self.priors = list(prior) if isinstance(prior, (list, tuple)) else [] if prior is None else [prior]
        self.embed = embed  # optional programs -> [n, d] extra inputs (e.g. a cdmpp model's embeddings)
        if inputs not in ("pooled", "physics", "both"):
            raise ValueError(f"inputs = {inputs!r}: expected pooled, physics or both")
        self.inputs, self.bags = inputs, bags

    def _base(self, programs, kind: int | str) -> np.ndarray:
        """What the ratio multiplies: the twin's label (``kind`` "twin") or prior ``kind``'s prediction (its index)."""
        if kind != "twin":
            return np.asarray(self.priors[kind].predict(programs), dtype=np.float64)
        return np.array([self.twins[p.features.program_hash] for p in programs])

    def _x(self, programs) -> np.ndarray:
        parts = []
        if self.inputs in ("pooled", "both"):
            parts.append(pooled_features(programs))
        if self.inputs in ("physics", "both"):
            parts.append(physics_features(programs, self.twins))
            if self.priors:
                parts.append(self._prior_inputs(programs))
        if self.embed is not None:
            parts.append(self.embed(programs))
        return np.hstack(parts)

    def _prior_inputs(self, programs) -> np.ndarray:
        """Each prior's log ratio to the twin's label, and the parallel share Amdahl's law reads: the GBT
        can then lean on a prior where it holds (most programs) and leave it where it does not (programs
        of a few microseconds, whose source label is mostly fork/join cost), whichever base it corrects."""
        twin = np.log(self._base(programs, "twin"))
        ratios = [np.log(self._base(programs, i)) - twin for i in range(len(self.priors))]
        return np.column_stack([*ratios, parallel_share(programs)]).astype(np.float32)

    def fit(self, shots: Sequence, val=None, time_budget_s=None) -> "TwinRatio":
        """Fits the ratio on target shots (the twins' labels are the source knowledge). ``members_``: the
        ``Corrected`` bases the prediction averages."""
        first = 0 if self.priors else "twin"
        if not shots:
            self.members_ = [Corrected(first, None, 1.0, 0.0, None)]
            return self
        y = np.log([p.seconds for p in shots])
        kinds = [*range(len(self.priors)), "twin"]
        ratios = {kind: y - np.log(self._base(shots, kind)) for kind in kinds}
        x = self._x(shots) if len(shots) >= 8 else None
        members: list = []
        for bag in range(self.bags):
            state = self.random_state + bag
            if x is None:
                chosen = [(first, 0, 1.0)]
            elif self.rounds is not None:
                chosen = [(first, self.rounds, 1.0)]
            else:
                chosen = self._select(x, ratios, state)
            for kind, rounds, weight in chosen:
                r = ratios[kind]
                shift = 0.0 if rounds is None else float(np.median(r))
                booster = self._booster(rounds, shift, state).fit(x, r) if rounds else None
                members.append(Corrected(kind, rounds, weight / self.bags, shift, booster))
        self.members_ = _merge_fixed(members)
        return self

    def _select(self, x: np.ndarray, ratios: dict, state: int) -> list:
        """[(base, rounds, weight)]: the first base uncorrected unless the best correction by cross-validated
        MAPE on the shots beats it by more than one standard error; then each base with its best rounds, and
        the weights of their geometric mean with the lowest held-out MAPE. The rule judges one correction,
        not the mean: weights chosen on the same held-out errors would flatter the mean, and a dozen shots
        would let it through. Earlier bases, fewer rounds and the first weights win ties."""
        err = {(kind, n): held - r for kind, r in ratios.items() for n, held in self._cv_log_ratio(x, r, state).items()}
        mape = {c: _ape(e).mean() for c, e in err.items()}
        best = {kind: min((c for c in err if c[0] == kind), key=mape.get) for kind in ratios}
        first = next(iter(ratios))
        gain = _ape(err[(first, None)]) - _ape(err[min(err, key=mape.get)])
        if not gain.mean() > gain.std() / np.sqrt(len(gain)):
            return [(first, None, 1.0)]
        errors = np.array([err[best[kind]] for kind in ratios])
        weights = min(_simplex(len(ratios), WEIGHT_STEP), key=lambda w: _ape(w @ errors).mean())
        return [(kind, best[kind][1], float(w)) for kind, w in zip(ratios, weights) if w > 0]

    def _booster(self, rounds: int, base: float, state: int):
        import xgboost as xgb

        return xgb.XGBRegressor(n_estimators=rounds, learning_rate=0.1, max_depth=3, subsample=0.8,
                                min_child_weight=2, tree_method="hist", n_jobs=self.nthread,
                                random_state=state, base_score=base)

    def _cv_log_ratio(self, x: np.ndarray, r: np.ndarray, state: int, folds: int = 4) -> dict:
        """Each shot's log ratio as predicted with it held out of ``folds``-fold cross-validation, for each
        of ``ROUND_CHOICES`` (the same folds for every choice and every base of one ``state``)."""
        fold = np.random.default_rng(state).permutation(len(r)) % folds
        out = {n: np.zeros(len(r)) for n in ROUND_CHOICES}
        for f in range(folds):
            train, held = fold != f, fold == f
            base = float(np.median(r[train]))
            out[0][held] = base
            booster = self._booster(max(ROUND_CHOICES[2:]), base, state).fit(x[train], r[train])
            for n in ROUND_CHOICES[2:]:
                out[n][held] = booster.predict(x[held], iteration_range=(0, n))
        return out

    def predict(self, programs: Sequence) -> np.ndarray:
        x = self._x(programs) if any(m.booster is not None for m in self.members_) else None
        bases = {kind: np.log(self._base(programs, kind)) for kind in {m.base for m in self.members_}}
        log = np.zeros(len(programs))
        for m in self.members_:
            r = m.booster.predict(x).astype(np.float64) if m.booster is not None else m.shift
            log += m.weight * (bases[m.base] + r)
        return np.exp(log)

    def adapt(self, shots: Sequence) -> "TwinRatio":
        return copy.copy(self).fit(shots)

    def describe(self) -> str:
        parts = []
        for m in self.members_:
            name = "the twin's label" if m.base == "twin" else self.priors[m.base].describe()
            fix = (f" x a GBT of the log ratio ({m.rounds} rounds)" if m.booster is not None else
                   "" if m.rounds is None else f" x {np.exp(m.shift):.3f} (median ratio of the shots)")
            parts.append(name + fix if len(self.members_) == 1 else f"{m.weight:.2f} of ({name + fix})")
        return "; ".join(parts) if len(parts) == 1 else "geometric mean: " + "; ".join(parts)


def _ape(log_error: np.ndarray) -> np.ndarray:
    return np.abs(np.expm1(log_error))


def _simplex(n: int, step: float) -> list[np.ndarray]:
    """Every weight vector of ``n`` non-negative multiples of ``step`` summing to 1, the first base's
    largest weights first."""
    m = round(1 / step)
    heads = [h for h in itertools.product(range(m, -1, -1), repeat=n - 1) if sum(h) <= m]
    return [np.array([*h, m - sum(h)]) / m for h in heads]


def _merge_fixed(members: list[Corrected]) -> list[Corrected]:
    """Members without a booster that repeat (the same base and rounds in several bags) as one, their weights summed."""
    merged: list[Corrected] = []
    for m in members:
        same = next((i for i, o in enumerate(merged)
                     if o.booster is None and m.booster is None and (o.base, o.rounds) == (m.base, m.rounds)), None)
        if same is None:
            merged.append(m)
        else:
            merged[same] = merged[same]._replace(weight=merged[same].weight + m.weight)
    return merged


def parallel_share(programs: Sequence) -> np.ndarray:
    """``physics.parallel_share`` of labelled programs."""
    return physics.parallel_share([p.features for p in programs])


def time_per_work(programs: Sequence, threads: int) -> np.ndarray:
    """Per program, its run time on ``threads`` threads as a share of its 1-thread time (``physics.time_share``)."""
    return np.array([physics.time_share(physics.leaf_parallelism(p.features), threads) for p in programs])


class TwinAmdahl(Peer):
    """Seen programs on another thread count of the same CPU: Amdahl's law (``physics.amdahl_seconds``)
    applied to the twin's label, with the fork/join cost ``o`` of a parallel region taken as the source
    device's lower envelope of latency per parallel leaf (``quantile``, 1 %, over its training programs).
    Nothing is fitted on target shots; the twin-ratio GBT learns the same regime only where shots land in it.
    """

    label = "twin-Amdahl"

    def __init__(self, twins: dict, source_threads: int, target_threads: int, floor: float = 0.01,
                 quantile: float = 0.01):
        self.twins, self.source_threads, self.target_threads = twins, int(source_threads), int(target_threads)
        self.floor = floor  # the work left after removing fork/joins is at least this share of the label
        self.quantile = quantile  # of the source's latency per parallel leaf: the fork/join cost ``o``

    def fit(self, source_programs: Sequence, val=None, time_budget_s=None) -> "TwinAmdahl":
        """Estimates ``o`` from the source device's programs (labels and features; no target label). A
        1-thread source shows no fork/join cost, so then ``o`` is 0."""
        if self.source_threads == 1:
            self.overhead_ = 0.0
            return self
        self.overhead_ = physics.fork_join_seconds([p.seconds for p in source_programs],
                                                   [p.features for p in source_programs], self.quantile)
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        src = [self.twins[p.features.program_hash] for p in programs]
        return physics.amdahl_seconds(src, [p.features for p in programs], self.source_threads,
                                      self.target_threads, self.overhead_, self.floor)

    def adapt(self, shots: Sequence) -> "TwinAmdahl":
        return self  # nothing is fitted on target programs

    def describe(self) -> str:
        return (f"the twin's label through Amdahl's law, {self.source_threads} -> {self.target_threads} threads, "
                f"fork/join {1e6 * self.overhead_:.2f} us per parallel leaf")


class TwinRoofline(Peer):
    """Seen programs on another machine: the twin's label times the ratio of the program's roofline bounds
    on the two devices (``roofline_seconds`` from each device's peak FLOP/s and memory bandwidth).

    A compute-bound program moves with the peaks, a memory-bound one with the bandwidths: the physics
    the specs give when the two devices are different chips, beside ``TwinAmdahl``'s thread counts (the
    stronger prior even across chips so far, docs/evaluation.md "Across machines"). Nothing is fitted on
    target shots (``TwinRatio`` with this as its prior corrects it).
    """

    label = "twin-roofline"

    def __init__(self, twins: dict, source_spec: dict, target_spec: dict):
        self.twins, self.source_spec, self.target_spec = twins, source_spec, target_spec

    def fit(self, source_programs: Sequence = (), val=None, time_budget_s=None) -> "TwinRoofline":
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        feats = [p.features for p in programs]
        work = program_work(feats)

        def bound(spec):
            return roofline_seconds(feats, spec["peak_gflops"], spec["mem_bw_gbs"], work)

        src = np.array([self.twins[f.program_hash] for f in feats])
        return src * bound(self.target_spec) / bound(self.source_spec)

    def adapt(self, shots: Sequence) -> "TwinRoofline":
        return self  # nothing is fitted on target programs

    def describe(self) -> str:
        s, t = self.source_spec, self.target_spec
        return (f"the twin's label x the ratio of roofline bounds ({s['peak_gflops']:.0f} -> {t['peak_gflops']:.0f} "
                f"GFLOP/s, {s['mem_bw_gbs']:.0f} -> {t['mem_bw_gbs']:.0f} GB/s)")


class AmdahlTransfer(Peer):
    """A peer trained on source devices, reaching a CPU thread count it never trained on as cdmpp does
    (``TrainedModel.predict``): predicted on the nearest trained device (``physics.anchor_device``) and moved
    by Amdahl's law, its shots learned on that device. Beside cdmpp, so that what the law gains is not
    taken for what the model gains. ``fork_join``: {trained CPU device: seconds} (``physics.fork_join_by_device``)."""

    def __init__(self, peer, fork_join: dict[str, float], device_table: dict):
        self.peer, self.fork_join, self.device_table = peer, fork_join, device_table
        self.label = peer.label + ", Amdahl transfer"

    def fit(self, train: Sequence, val=None, time_budget_s=None) -> "AmdahlTransfer":
        self.peer.fit(train, val, time_budget_s)
        return self

    def _anchor(self, device: str) -> str | None:
        return physics.anchor_device(device, list(self.fork_join), self.device_table)

    def predict(self, programs: Sequence) -> np.ndarray:
        on = [self._anchor(p.device) or p.device for p in programs]
        seconds = self.peer.predict([dataclasses.replace(p, device=a) for p, a in zip(programs, on)])
        return physics.move(seconds, [p.features for p in programs], on, [p.device for p in programs],
                            self.device_table, self.fork_join)

    def adapt(self, shots: Sequence) -> "AmdahlTransfer":
        new = copy.copy(self)
        new.peer = self.peer.adapt(physics.on_anchors(shots, self._anchor, self.device_table, self.fork_join))
        return new

    def describe(self) -> str:
        return f"{self.peer.describe()}; predicted through {sorted(self.fork_join)} and Amdahl's law"
