"""The peer methods train, predict and adapt."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cdmpp.evaluation import splits
from tests.data import ROOT


def test_peers_train_and_predict_finite(real):
    from cdmpp.evaluation.methods.mlp import TensetMLP
    from cdmpp.evaluation.methods.xgb import MetaScheduleXGB, XGBRegressorPeer

    sp = splits.random_split(real[1], seed=0)
    for peer in (MetaScheduleXGB(), XGBRegressorPeer(n_estimators=200), TensetMLP(epochs=3)):
        pred = peer.fit(sp.train, sp.val, time_budget_s=20).predict(sp.test)
        assert pred.shape == (len(sp.test),) and np.all(np.isfinite(pred)), peer.label
        if peer.predicts == "seconds":
            assert np.all(pred > 0)
        adapted = peer.adapt(sp.val[:5]).predict(sp.test[:7])
        assert adapted.shape == (7,) and np.all(np.isfinite(adapted))


def test_xgb_regressor_sees_device_specs(real):
    """Trained on two devices, the regressor needs to know which one a program runs on (as cdmpp does)."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.program.features import N_FEATURES
    from cdmpp.evaluation.methods.xgb import XGBRegressorPeer
    from cdmpp.model.transforms import DeviceSpecs

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    programs = [p for p in real[1].programs if p.device in table]
    peer = XGBRegressorPeer(n_estimators=20, device_table=table).fit(programs)
    x = peer.pooled(programs[:3])
    assert x.shape == (3, N_FEATURES + DeviceSpecs().dim)
    assert np.allclose(x[:, N_FEATURES:], DeviceSpecs(table).raw_vector(table[programs[0].device]), equal_nan=True)
    with pytest.raises(KeyError, match="no-such-device"):
        peer.predict([dataclasses.replace(programs[0], device="no-such-device")])


def test_every_method_offers_the_method_interface():
    from cdmpp.evaluation.methods.cdmpp_model import CDMPP
    from cdmpp.evaluation.methods.mlp import TensetMLP
    from cdmpp.model.pooled_gbt import PooledGBT
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, TwinRatio, TwinRoofline
    from cdmpp.evaluation.methods.xgb import MetaScheduleXGB, XGBRegressorPeer

    for cls in (CDMPP, MetaScheduleXGB, XGBRegressorPeer, TensetMLP, PooledGBT, TwinRatio, TwinAmdahl, TwinRoofline):
        for name in ("fit", "predict", "predict_interval", "adapt", "describe"):
            assert callable(getattr(cls, name)), (cls.__name__, name)
        assert cls.predicts in ("seconds", "score") and 0 < cls.budget_weight <= 1


def test_pooled_gbt_targets(real):
    """The pooled GBT on log(latency / FLOPs), log(latency / roofline bound) and log latency: finite
    positive latencies, the roofline scale is a time no program beats by much (on the real device
    table), and on plain latency no prediction leaves the training labels' range."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.model.pooled_gbt import PooledGBT

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    sp = splits.random_split(real[1], seed=0)
    for target in ("flops", "roofline", "latency"):
        gbt = PooledGBT(table, n_estimators=50, target=target).fit(sp.train, sp.val)
        pred = gbt.predict(sp.test)
        assert np.all(np.isfinite(pred)) and np.all(pred > 0), target
        assert np.all(np.isfinite(gbt.adapt(sp.val[:5], rounds=3).predict(sp.test[:7])))
    y = np.array([p.seconds for p in sp.train])
    assert np.all((pred >= y.min()) & (pred <= y.max()))
    # the MAPE loss: at least as good on validation MAPE as the L2 fit it starts beside
    def val_mape(g):
        return np.mean(np.abs(g.predict(sp.val) / np.array([p.seconds for p in sp.val]) - 1.0))

    l2 = PooledGBT(table, n_estimators=200, target="latency").fit(sp.train, sp.val)
    mape = PooledGBT(table, n_estimators=200, target="latency", loss="mape").fit(sp.train, sp.val)
    assert np.all(np.isfinite(mape.predict(sp.test))) and val_mape(mape) <= val_mape(l2) + 0.02
    with pytest.raises(ValueError, match="loss"):
        PooledGBT(table, loss="huber")
    bound = PooledGBT(table, target="roofline").scale(sp.test)
    assert np.all(bound > 0)
    assert np.mean(np.array([p.seconds for p in sp.test]) >= 0.5 * bound) > 0.99
    with pytest.raises(ValueError, match="target"):
        PooledGBT(table, target="bytes")


def _amdahl_program(ops_parallel: float, ops_serial: float, seconds: float, h: str, extent: int = 0):
    """A two-leaf program (one leaf under a parallel loop of ``extent``, 0: not known) as the twin
    methods see it."""
    from types import SimpleNamespace

    from cdmpp.program.features import FEATURE_NAMES, N_FEATURES

    rows = np.zeros((2, N_FEATURES), np.float32)
    rows[:, FEATURE_NAMES.index("float_mad")] = np.log2([ops_parallel + 1, ops_serial + 1])
    rows[0, FEATURE_NAMES.index("parallel_num")] = 1
    rows[0, FEATURE_NAMES.index("parallel_prod")] = np.log2(extent + 1)
    return SimpleNamespace(features=SimpleNamespace(leaf_features=rows, positions=np.arange(2), n_leaves=2,
                                                   program_hash=h), seconds=seconds)


def test_twin_amdahl_follows_amdahls_law():
    """2 threads -> 1: the work is the 2-thread label less one fork/join per parallel leaf, its parallel
    share sped up 2x; a fork/join-bound kernel runs faster on 1 thread; the fork/join cost comes from the
    source programs' lower envelope, and target shots change nothing."""
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, parallel_share

    o = 1e-6
    cases = [(3e9, 1e9, 4e-3), (1e9, 0.0, 1e-3), (0.0, 1e6, 2e-5), (1e3, 1e3, 1e-7)]  # ops, ops, 1-thread seconds
    target, twins = [], {}
    for i, (par, ser, t1) in enumerate(cases):
        f = par / (par + ser)
        twins[str(i)] = t1 * (1 - f + f / 2) + o  # every program has one parallel leaf (with or without ops)
        target.append(_amdahl_program(par, ser, t1, str(i)))
    assert np.allclose(parallel_share(target)[:, 0], [0.75, 1.0, 0.0, 0.5], atol=1e-6)
    source = [_amdahl_program(1e3, 0.0, o * (1 + j / 100), f"s{j}") for j in range(200)]  # fork/join-bound
    model = TwinAmdahl(twins, source_threads=2, target_threads=1).fit(source)
    assert model.overhead_ == pytest.approx(o, rel=0.02)
    model.overhead_ = o
    assert np.allclose(model.predict(target), [t for _, _, t in cases], rtol=1e-4)
    assert model.predict(target)[3] < twins["3"]  # faster on 1 thread: its 2-thread time is mostly fork/join
    assert model.adapt(target[:2]) is model


def test_twin_amdahl_counts_rounds_of_a_parallel_loop():
    """A parallel loop of extent 3 runs in 2 rounds on 2 threads (1.5x), extent 4 in 2 (2x), extent 1
    in 1 (no speedup): the 1-thread prediction follows."""
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, time_per_work

    target = [_amdahl_program(1e9, 0.0, 1.0, str(e), extent=e) for e in (3, 4, 1)]
    assert np.allclose(time_per_work(target, 2), [2 / 3, 1 / 2, 1.0], rtol=1e-6)
    twins = {"3": 2 / 3, "4": 0.5, "1": 1.0}
    model = TwinAmdahl(twins, source_threads=2, target_threads=1)
    model.overhead_ = 0.0
    assert np.allclose(model.predict(target), [1.0, 1.0, 1.0], rtol=1e-6)


def test_twin_ratio_corrects_its_prior_not_the_twin():
    """With a prior (Amdahl's law), the shots' ratio is taken to the prior's prediction: shots 10 % slower
    than Amdahl says make every prediction Amdahl x 1.1, whatever the twin's own label."""
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, TwinRatio

    programs = [_amdahl_program(1e9 * (i + 1), 1e8, 1e-3 * (i + 1), str(i)) for i in range(4)]
    twins = {str(i): 7e-4 * (i + 1) for i in range(4)}
    amdahl = TwinAmdahl(twins, source_threads=2, target_threads=1)
    amdahl.overhead_ = 0.0
    shots = [_amdahl_program(1e9 * (i + 1), 1e8, 1.1 * s, str(i)) for i, s in enumerate(amdahl.predict(programs))]
    model = TwinRatio(twins, prior=amdahl).fit(shots[:3])
    assert np.allclose(model.predict(programs), 1.1 * amdahl.predict(programs), rtol=1e-6)
    assert not np.allclose(TwinRatio(twins).fit(shots[:3]).predict(programs), model.predict(programs))


def test_twin_ratio_physics_inputs_carry_what_the_priors_predict():
    """With physics inputs the ratio GBT also reads each prior's log ratio to the twin's label and the
    parallel share, so it can follow Amdahl's law where the law holds whichever base it corrects."""
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, TwinRatio, parallel_share, physics_features

    programs = [_amdahl_program(1e9 * (i + 1), 1e8 * (i % 3), 1e-3, str(i)) for i in range(4)]
    twins = {str(i): 7e-4 * (i + 1) for i in range(4)}
    amdahl = TwinAmdahl(twins, source_threads=2, target_threads=1)
    amdahl.overhead_ = 0.0
    x = TwinRatio(twins, prior=amdahl, inputs="physics")._x(programs)
    bare = physics_features(programs, twins)
    assert x.shape == (4, bare.shape[1] + 3)
    assert np.allclose(x[:, :bare.shape[1]], bare)
    assert np.allclose(x[:, -3], np.log(amdahl.predict(programs) / np.array(list(twins.values()))), atol=1e-6)
    assert np.allclose(x[:, -2:], parallel_share(programs), atol=1e-6)
    assert TwinRatio(twins, inputs="physics")._x(programs).shape == bare.shape  # no prior: nothing to add


def test_twin_ratio_picks_among_priors_by_cross_validation():
    """Two priors, the shots exactly the second one's prediction: the cross-validation takes the second as
    the base; without shots the first one is the base."""
    from types import SimpleNamespace

    from cdmpp.evaluation.methods.twin_ratio import TwinRatio

    programs = [_amdahl_program(1e9, 1e8, 1e-3, str(i)) for i in range(32)]
    twins = {str(i): 1e-3 for i in range(32)}
    first = SimpleNamespace(predict=lambda ps: np.array([2e-3 * (1 + int(p.features.program_hash) % 5) for p in ps]))
    second = SimpleNamespace(predict=lambda ps: np.array([1e-3 * (1 + int(p.features.program_hash) % 3) for p in ps]),
                             describe=lambda: "second")
    shots = [_amdahl_program(1e9, 1e8, s, str(i)) for i, s in enumerate(second.predict(programs))]
    model = TwinRatio(twins, prior=[first, second])
    model._x = lambda ps: np.random.default_rng(len(ps)).normal(size=(len(ps), 5))
    model.fit(shots)
    assert [(m.base, m.rounds, m.weight) for m in model.members_] == [(1, None, 1.0)] and model.describe().startswith("second")
    assert np.allclose(model.predict(programs), second.predict(programs))
    assert np.allclose(TwinRatio(twins, prior=[first, second]).fit([]).predict(programs), first.predict(programs))


def test_twin_ratio_averages_bases_whose_errors_cancel():
    """Two priors wrong by the same factor in opposite directions, program by program, which no input
    explains: neither corrected base comes close, their geometric mean at equal weights is exact."""
    from types import SimpleNamespace

    from cdmpp.evaluation.methods.twin_ratio import TwinRatio

    truth = np.array([1e-3 * (1 + i % 7) for i in range(32)])
    off = np.exp(0.5 * (-1.0) ** np.arange(32))
    programs = [_amdahl_program(1e9, 1e8, s, str(i)) for i, s in enumerate(truth)]
    twins = {str(i): 1.7 * s for i, s in enumerate(truth)}
    up = SimpleNamespace(predict=lambda ps: np.array([truth[int(p.features.program_hash)] * off[int(p.features.program_hash)] for p in ps]))
    down = SimpleNamespace(predict=lambda ps: np.array([truth[int(p.features.program_hash)] / off[int(p.features.program_hash)] for p in ps]))
    model = TwinRatio(twins, prior=[up, down], bags=1)
    model._x = lambda ps: np.random.default_rng(len(ps)).normal(size=(len(ps), 5))
    model.fit(programs)
    assert sorted((m.base, m.weight) for m in model.members_) == [(0, 0.5), (1, 0.5)]
    assert np.allclose(model.predict(programs), truth, rtol=1e-6)


def test_twin_ratio_corrects_the_twin_when_the_shots_say_it_beats_the_prior():
    """Shots exactly 1.3x their twin's label, which Amdahl's law gets wrong by varying amounts: the
    cross-validation picks the twin as the base, and the prediction is the twin's label x 1.3."""
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, TwinRatio

    programs = [_amdahl_program(1e9, 1e8 * (1 + i % 5), 1e-3, str(i)) for i in range(32)]
    twins = {str(i): 1e-3 * (1 + i / 7) for i in range(32)}
    amdahl = TwinAmdahl(twins, source_threads=2, target_threads=1)
    amdahl.overhead_ = 0.0
    shots = [_amdahl_program(1e9, 1e8 * (1 + i % 5), 1.3 * twins[str(i)], str(i)) for i in range(32)]
    model = TwinRatio(twins, prior=amdahl)
    model._x = lambda ps: np.random.default_rng(len(ps)).normal(size=(len(ps), 5))
    model.fit(shots)
    assert [(m.base, m.rounds, m.weight) for m in model.members_] == [("twin", 0, 1.0)]
    assert np.allclose(model.predict(programs), [1.3 * twins[str(i)] for i in range(32)])


def test_twin_ratio_boosts_only_where_cross_validation_says_it_helps():
    """Shots whose log ratio is noise leave the base uncorrected; a ratio that a column explains gets trees."""
    from cdmpp.evaluation.methods.twin_ratio import TwinRatio

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 20))
    model = TwinRatio({})

    def rounds(r):
        [(base, n, weight)] = model._select(x, {"twin": r}, 0)
        return n

    assert rounds(rng.normal(scale=0.05, size=64)) is None
    assert rounds(0.7 * np.sign(x[:, 3]) + rng.normal(scale=0.01, size=64)) > 0


def test_twin_ratio_takes_a_correction_only_beyond_one_standard_error():
    """A correction whose cross-validated gain hangs on four shots (the base uncorrected is 1.0 worse on
    them, 0.05 better on the other 60) keeps the base as is; the same mean gain on every shot takes it."""
    from cdmpp.evaluation.methods.twin_ratio import TwinRatio

    model = TwinRatio({})
    as_is = np.r_[np.full(4, 1.1), np.full(60, 0.1)]  # each shot's held-out APE
    lucky = np.r_[np.full(4, 0.1), np.full(60, 0.15)]
    steady = as_is - (as_is - lucky).mean()
    for candidate, expected in ((lucky, None), (steady, 0)):  # held-out log errors with those APEs (over-predictions)
        model._cv_log_ratio = lambda x, r, state, c=candidate: {None: np.log1p(as_is), 0: np.log1p(c)}
        assert model._select(np.zeros((64, 1)), {"twin": np.zeros(64)}, 0) == [("twin", expected, 1.0)]


def test_pooled_features_are_each_programs_sum_max_and_log_sum_exp():
    from types import SimpleNamespace

    from cdmpp.model.pooled_gbt import pooled_features

    rng = np.random.default_rng(0)
    leaves = [rng.normal(size=(3, 164)).astype(np.float32), rng.normal(size=(1, 164)).astype(np.float32),
              np.zeros((0, 164), np.float32)]  # a program without stores pools as one zero row
    programs = [SimpleNamespace(features=SimpleNamespace(leaf_features=x, flops=f)) for x, f in zip(leaves, [7.0, 0.0, 1.0])]
    got = pooled_features(programs)
    for row, x, f in zip(got, leaves, [7.0, 0.0, 1.0]):
        r = x.astype(np.float64) if len(x) else np.zeros((1, 164))
        want = np.concatenate([r.sum(0), r.max(0), np.log(np.exp(r).sum(0)), [len(r), np.log2(f + 1.0)]])
        np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-6)


def test_twin_roofline_moves_a_program_with_the_bound_that_limits_it():
    """Across chips a compute-bound program scales with the peaks, a memory-bound one with the bandwidths;
    target shots change nothing."""
    from types import SimpleNamespace

    from cdmpp.evaluation.methods.twin_ratio import TwinRoofline
    from cdmpp.model.network import _UNIQUE_BYTES_COLS
    from cdmpp.program.features import N_FEATURES

    def program(h, flops, unique_bytes):
        rows = np.zeros((1, N_FEATURES), np.float32)
        rows[0, _UNIQUE_BYTES_COLS[0]] = np.log2(unique_bytes + 1)
        return SimpleNamespace(features=SimpleNamespace(leaf_features=rows, flops=flops, program_hash=h))

    source, target = {"peak_gflops": 200.0, "mem_bw_gbs": 30.0}, {"peak_gflops": 1000.0, "mem_bw_gbs": 60.0}
    progs = [program("compute", 1e10, 1e3), program("memory", 0.0, 1e9)]
    model = TwinRoofline({"compute": 0.1, "memory": 0.05}, source, target).fit()
    assert np.allclose(model.predict(progs), [0.1 * 200 / 1000, 0.05 * 30 / 60], rtol=1e-5)
    assert model.adapt(progs) is model


def test_amdahl_transfer_predicts_a_peer_on_the_anchor_and_moves_it():
    """A peer trained on 2 threads answers for 1 thread as cdmpp does: its 2-thread prediction through
    Amdahl's law; its shots reach it moved back to 2 threads."""
    from cdmpp.evaluation.methods.method import Peer
    from cdmpp.evaluation.methods.twin_ratio import AmdahlTransfer
    from cdmpp.model.physics import amdahl_seconds
    from cdmpp.records.dataset import LabeledProgram

    two, one = "chip-2t/llvm-avx512", "chip-1t/llvm-avx512"
    table = {two: {"cores": 2}, one: {"cores": 1}}

    class Constant(Peer):  # SYNTHETIC: 1 ms on 2 threads, 10 ms anywhere else
        def predict(self, programs):
            return np.array([1e-3 if p.device == two else 1e-2 for p in programs])

        def adapt(self, shots):
            self.shots = shots
            return self

    programs = [LabeledProgram(_amdahl_program(3e9, 1e9, 0.0, str(i), extent=e).features, one, 4e-3)
                for i, e in enumerate((4, 3, 1))]
    moved = AmdahlTransfer(Constant(), {two: 1e-6}, table)
    feats = [p.features for p in programs]
    np.testing.assert_allclose(moved.predict(programs), amdahl_seconds([1e-3] * 3, feats, 2, 1, 1e-6))
    adapted = moved.adapt(programs)
    assert [s.device for s in adapted.peer.shots] == [two] * 3
    np.testing.assert_allclose([s.seconds for s in adapted.peer.shots], amdahl_seconds([4e-3] * 3, feats, 1, 2, 1e-6))
