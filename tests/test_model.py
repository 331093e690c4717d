"""Mechanics of the predictor: padding, positional encoding, discrepancies, sampling, transforms,
checkpoints and a short training run.

All programs here are SYNTHETIC random arrays shaped like ``ProgramFeatures`` (leaf features,
pre-order positions); they test the learning machinery, not accuracy on real tensor programs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cdmpp.adapt import cmd, discrepancy, mmd
from cdmpp.model import CDMPPModel, PackedPrograms, collate, sinusoidal_encoding
from cdmpp.sampling import KMeansSampler, RandomSampler
from cdmpp.train import BoxCox, FeatureNormalizer, Sample, TrainConfig, TrainedModel, finetune, fit

torch.set_num_threads(1)
F = 12
DEVICES = {
    "cpu-a": dict(clock_ghz=2.0, cores=2, simd_width_bits=256, l1d_kb=32, l2_kb=512, l3_kb=8192, mem_bw_gbs=20, peak_gflops=64),
    "cpu-b": dict(clock_ghz=3.0, cores=8, simd_width_bits=512, l1d_kb=48, l2_kb=2048, l3_kb=32768, mem_bw_gbs=80, peak_gflops=900),
}


@dataclass
class FakeProgram:
    """Stand-in for cdmpp.features.ProgramFeatures (same attribute names)."""

    leaf_features: np.ndarray
    positions: np.ndarray
    flops: float = 0.0
    program_hash: str = ""


def random_program(rng, n_leaves=None) -> FakeProgram:
    n = int(n_leaves or rng.integers(1, 7))
    return FakeProgram(rng.normal(size=(n, F)).astype(np.float32), np.sort(rng.choice(200, n, replace=False)))


def synthetic_samples(n, rng, device="cpu-a"):
    """SYNTHETIC: latency = 1e-4 s x sum over leaves of exp(0.8·x0 - 0.5·x1) x device factor, x small noise."""
    factor = {"cpu-a": 1.0, "cpu-b": 0.25}[device]
    out = []
    for _ in range(n):
        p = random_program(rng)
        per_leaf = np.exp(0.8 * p.leaf_features[:, 0] - 0.5 * p.leaf_features[:, 1])
        seconds = 1e-4 * factor * per_leaf.sum() * np.exp(0.02 * rng.normal())
        out.append(Sample(p, device, float(seconds), task=f"t{rng.integers(10)}"))
    return out


def small_model(use_pe=True, seed=0) -> CDMPPModel:
    torch.manual_seed(seed)
    return CDMPPModel(F, 8, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.1, use_pe=use_pe).eval()


def test_sinusoidal_encoding_formula():
    pe = sinusoidal_encoding(torch.tensor([0, 3, 7]), 6)
    assert pe.shape == (3, 6)
    assert torch.allclose(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    assert torch.isclose(pe[1, 2], torch.sin(torch.tensor(3.0) / 10000 ** (2 / 6)))
    assert torch.isclose(pe[2, 5], torch.cos(torch.tensor(7.0) / 10000 ** (4 / 6)))
    assert sinusoidal_encoding(torch.tensor([[1, 2]]), 5).shape == (1, 2, 5)


def test_sinusoidal_encoding_matches_numpy_reference():
    from cdmpp.positional import preorder_encoding

    pos = np.array([0, 5, 17, 250])
    assert np.allclose(sinusoidal_encoding(torch.from_numpy(pos), 32).numpy(), preorder_encoding(pos, 32), atol=1e-5)


def test_padding_does_not_change_prediction():
    rng = np.random.default_rng(0)
    short, long = random_program(rng, 2), random_program(rng, 9)
    model, dev = small_model(), torch.zeros(1, 8)
    with torch.inference_mode():
        alone = model(*collate([short]), dev)
        padded = model(*collate([short, long]), dev.expand(2, 8))
    x, pos, mask = collate([short, long])
    assert x.shape == (2, 9, F) and mask[0].sum() == 2 and not mask[0, 2:].any()
    assert torch.allclose(alone[0], padded[0], atol=1e-5)


def test_empty_program_gets_one_zero_leaf():
    x, pos, mask = collate([FakeProgram(np.zeros((0, F), np.float32), np.zeros(0, np.int64))])
    assert x.shape == (1, 1, F) and mask.all()


def test_positional_encoding_acts_only_through_positions():
    rng = np.random.default_rng(1)
    p = random_program(rng, 5)
    moved = FakeProgram(p.leaf_features, p.positions + 37)
    dev = torch.zeros(1, 8)
    with torch.inference_mode():
        for use_pe, should_change in ((False, False), (True, True)):
            m = small_model(use_pe)
            a, b = m(*collate([p]), dev), m(*collate([moved]), dev)
            assert (not torch.allclose(a, b, atol=1e-5)) == should_change
    # same weights, PE switched off at run time: identical to a model built without PE
    m_pe, m_no = small_model(True), small_model(False)
    m_pe.use_pe = False
    with torch.inference_mode():
        assert torch.allclose(m_pe(*collate([p]), dev), m_no(*collate([p]), dev))


def test_packed_subset_and_means():
    rng = np.random.default_rng(2)
    progs = [random_program(rng) for _ in range(10)]
    pack = PackedPrograms.from_programs(progs)
    sub = pack.subset(np.array([7, 2]))
    assert np.array_equal(sub.leaves[: len(progs[7].positions)], progs[7].leaf_features)
    assert np.allclose(pack.program_means()[3], progs[3].leaf_features.mean(0), atol=1e-6)


@pytest.mark.parametrize("name", ["cmd", "mmd"])
def test_discrepancy_zero_for_identical_and_grows_with_shift(name):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    y = torch.randn(256, 16, generator=g)
    fn = discrepancy(name)
    assert fn(x, x).item() == pytest.approx(0.0, abs=1e-6)
    values = [fn(x, y + shift).item() for shift in (0.0, 0.5, 2.0)]
    assert values[0] < values[1] < values[2]
    assert discrepancy("none")(x, y + 3).item() == 0.0
    with pytest.raises(ValueError):
        discrepancy("coral")


def test_cmd_has_gradient():
    x = torch.randn(64, 8, requires_grad=True)
    cmd(x, torch.randn(64, 8) + 1).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert mmd(x, x.detach() + 1).item() > 0


def test_kmeans_sampler_picks_distinct_nearest_and_is_deterministic():
    rng = np.random.default_rng(0)
    centers = np.array([[0, 0], [10, 0], [0, 10], [10, 10]], float)
    X = np.concatenate([c + rng.normal(scale=0.5, size=(50, 2)) for c in centers])
    s = KMeansSampler(4, random_state=0).fit(X)
    assert len(set(s.indices_.tolist())) == 4
    for c in s.cluster_centers_:  # every centroid's pick is its nearest row (clusters are well separated)
        nearest = np.argmin(((X - c) ** 2).sum(1))
        assert nearest in s.indices_
    assert np.array_equal(s.indices_, KMeansSampler(4, random_state=0).fit(X).indices_)
    assert len(set(KMeansSampler(30, random_state=1).fit(X).indices_.tolist())) == 30
    assert np.array_equal(KMeansSampler(500).fit(X).indices_, np.arange(len(X)))
    r = RandomSampler(5, random_state=3).fit(X)
    assert len(set(r.indices_.tolist())) == 5
    assert np.array_equal(r.indices_, RandomSampler(5, random_state=3).fit(X).indices_)


def test_boxcox_round_trip_and_json():
    rng = np.random.default_rng(0)
    y = np.exp(rng.uniform(np.log(1e-7), np.log(10), 500))
    bc = BoxCox().fit(y)
    z = bc.transform(y)
    assert abs(z.mean()) < 1e-6 and abs(z.std() - 1) < 1e-6
    assert np.allclose(bc.inverse_transform(z), y, rtol=1e-6)
    bc2 = BoxCox.from_dict(bc.to_dict())
    assert np.allclose(bc2.transform(y), z)
    assert np.all(np.isfinite(bc.inverse_transform(np.array([-50.0, 50.0]))))


def test_feature_normalizer_train_only_and_json():
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=100), rng.lognormal(8, 2, 100), np.ones(100)]).astype(np.float32)
    norm = FeatureNormalizer().fit(x)
    t = norm.transform(x)
    assert norm.log_cols_.tolist() == [False, True, False]
    assert np.allclose(t[:, :2].mean(0), 0, atol=1e-4) and np.all(t[:, 2] == 0)
    assert np.allclose(FeatureNormalizer.from_dict(norm.to_dict()).transform(x), t)
    assert np.all(np.abs(FeatureNormalizer("robust").fit(x).transform(x)) <= 10)


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown training settings"):
        TrainConfig.from_dict({"d_modle": 64})
    with pytest.raises(ValueError, match="da = 'coral'"):
        TrainConfig(da="coral")
    default = TrainConfig.recipe("default")
    no_pe = TrainConfig.recipe("ablation-no-pe")  # inherits everything else through base = "default"
    assert default.use_pe and not no_pe.use_pe and no_pe.d_model == default.d_model
    assert TrainConfig.recipe("ablation-no-da").da == "none" and TrainConfig.recipe("mmd").da == "mmd"


def quick_config(**kw) -> TrainConfig:
    base = dict(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0, epochs=25, batch_size=64,
                lr=3e-4, max_lr=3e-3, lr_cycle_epochs=4, ensemble=2, patience=25, max_minutes=1.0, progress=False)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    train = synthetic_samples(700, rng) + synthetic_samples(300, rng, "cpu-b")
    val = synthetic_samples(200, rng) + synthetic_samples(100, rng, "cpu-b")
    pool = synthetic_samples(100, rng, "cpu-b")
    model = fit(quick_config(da="cmd", da_weight=1.0, ensemble_mode="seeds"), train, val, target_pool=pool,
                device_table=DEVICES)
    return model, train, val


def test_short_fit_beats_constant_predictor(trained):
    model, train, val = trained
    y = np.array([s.seconds for s in val])
    devs = [s.device for s in val]
    mean, lo, hi = model.predict([s.features for s in val], devs)
    constant = np.exp(np.mean(np.log([s.seconds for s in train])))  # best constant in log space
    mape_model = np.mean(np.abs(mean - y) / y)
    mape_const = np.mean(np.abs(constant - y) / y)
    assert mape_model < 0.5 * mape_const, (mape_model, mape_const)
    assert np.all(lo <= mean) and np.all(mean <= hi)
    assert 0.8 <= np.mean((lo <= y) & (y <= hi)) <= 1.0  # calibrated on this very split
    assert model.summary["n_train"] == 1000 and len(model.members) == 2


def test_save_load_round_trip(trained, tmp_path):
    model, _, val = trained
    progs, devs = [s.features for s in val[:50]], [s.device for s in val[:50]]
    model.save(tmp_path / "ckpt")
    assert not list((tmp_path / "ckpt").glob("*.pt")) and (tmp_path / "ckpt" / "predictor.json").exists()
    again = TrainedModel.load(tmp_path / "ckpt")
    for a, b in zip(model.predict(progs, devs), again.predict(progs, devs)):
        assert np.array_equal(a, b)
    assert np.array_equal(model.embed(progs), again.embed(progs))


def test_finetune_on_new_device_reduces_error(trained):
    model, _, _ = trained
    rng = np.random.default_rng(5)
    shots, test = synthetic_samples(30, rng), synthetic_samples(200, rng)
    # SYNTHETIC "cpu-c": same law as cpu-a but 8x slower, specs unlike either training device
    for s in shots + test:
        s.device, s.seconds = "cpu-c", s.seconds * 8
    spec = {**DEVICES["cpu-a"], "clock_ghz": 0.5, "mem_bw_gbs": 2}
    y = np.array([s.seconds for s in test])
    model.add_device("cpu-c", spec)
    before = np.mean(np.abs(model.predict([s.features for s in test], "cpu-c")[0] - y) / y)
    tuned = finetune(model, shots, steps=60, device_table={"cpu-c": spec})
    after = np.mean(np.abs(tuned.predict([s.features for s in test], "cpu-c")[0] - y) / y)
    assert after < before
    assert "finetune" in tuned.summary and "finetune" not in model.summary


def test_target_batches_match_source_leaf_counts():
    from cdmpp.train import _LengthMatcher

    target_lengths = np.array([1, 1, 3, 3, 3, 8, 12])
    m = _LengthMatcher(target_lengths)
    rng = np.random.default_rng(0)
    picks = m.sample(np.array([3, 3, 1, 8, 10, 2, 30]), rng)
    assert target_lengths[picks].tolist()[:4] == [3, 3, 1, 8]
    assert target_lengths[picks[4]] in (8, 12) and target_lengths[picks[5]] in (1, 3) and target_lengths[picks[6]] == 12


def test_snapshot_ensemble_takes_members_from_distinct_cycles():
    rng = np.random.default_rng(3)
    train, val = synthetic_samples(300, rng), synthetic_samples(100, rng)
    cfg = quick_config(ensemble=3, ensemble_mode="snapshots", epochs=8, lr_cycle_epochs=2, patience=8)
    model = fit(cfg, train, val)
    epochs = model.summary["members"][0]["members_from_epochs"]
    assert len(model.members) == 3 and len({e // 2 for e in epochs}) == 3
    z = model.predict_z([s.features for s in val], "cpu-a")
    assert z.shape == (3, 100) and np.all(z.std(axis=0) > 0)


def test_device_specs_no_training_device_varies_along_do_not_move_predictions():
    """Trained on one device, a new device's prediction is the training device's until fine-tuned
    (not a random offset from untrained weights)."""
    rng = np.random.default_rng(3)
    train, val = synthetic_samples(300, rng), synthetic_samples(60, rng)
    model = fit(quick_config(epochs=3, ensemble=1), train, val, device_table={"cpu-a": DEVICES["cpu-a"]})
    model.add_device("cpu-b", DEVICES["cpu-b"])
    progs = [s.features for s in val]
    assert np.allclose(model.predict(progs, "cpu-a")[0], model.predict(progs, "cpu-b")[0])
    shots = synthetic_samples(30, rng, "cpu-b")
    tuned = finetune(model, shots, steps=20, device_table={"cpu-b": DEVICES["cpu-b"]})
    assert not np.allclose(tuned.predict(progs, "cpu-a")[0], tuned.predict(progs, "cpu-b")[0])


def test_new_model_options_train_save_and_load(tmp_path):
    """Sum/attention pooling, program inputs, pooled leaf inputs, roofline offset, FiLM, log label and the L1/MAPE losses
    (issue 19) train, predict finite positive latencies and survive a checkpoint round trip.
    SYNTHETIC programs with 164 columns, so the program inputs (FLOPs, bytes) are computed."""
    rng = np.random.default_rng(3)

    def sample(device):
        n = int(rng.integers(1, 5))
        x = np.abs(rng.normal(size=(n, 164))).astype(np.float32) * 4
        return Sample(FakeProgram(x, np.arange(n)), device, float(1e-5 * np.exp2(x[:, 0]).sum()))

    train = [sample(d) for d in ["cpu-a", "cpu-b"] * 60]
    val = [sample("cpu-a") for _ in range(30)]
    for kw in (dict(pooling="sum", program_inputs=True, loss="l1", label="log"),
               dict(pooling="attention", film=True, roofline=True, label="log", loss="mape"),
               dict(pooled_inputs=True, program_inputs=True, label="log", loss="mape"),
               dict(pooled_inputs=True, label="log", loss="l1")):
        model = fit(quick_config(epochs=3, ensemble=1, **kw), train, val, device_table=DEVICES)
        mean, lo, hi = model.predict([s.features for s in val], "cpu-b")
        assert np.all(np.isfinite(mean)) and np.all(mean > 0) and np.all(lo <= hi)
        model.save(tmp_path / "m")
        again = TrainedModel.load(tmp_path / "m")
        assert np.allclose(again.predict([s.features for s in val], "cpu-b")[0], mean)
        assert finetune(model, val[:8], steps=2).predict([s.features for s in val], "cpu-a")[0].shape == (30,)
    with pytest.raises(ValueError, match="label"):
        TrainConfig(roofline=True)


def test_leaf_flops_counts_a_multiply_add_as_two():
    from cdmpp.model import leaf_flops

    row = np.zeros((1, 164), np.float32)
    row[0, 0] = np.log2(1000 + 1)  # 1000 float multiply-adds
    row[0, 1] = np.log2(10 + 1)  # 10 float add/sub
    assert leaf_flops(row)[0] == pytest.approx(2010, rel=1e-6)


def test_matmul_flops_are_2n3():
    """A real 64x64x64 matmul (TVM featurizer): 2·64³ FLOPs, bytes and unique bytes present."""
    pytest.importorskip("tvm")
    from cdmpp import workloads
    from cdmpp.features import featurize
    from cdmpp.model import PackedPrograms

    f = featurize(workloads.matmul(64, 64, 64))
    stats = PackedPrograms.from_programs([f]).stats[0]
    assert np.exp2(stats[0]) - 1 == pytest.approx(2 * 64**3, rel=0.01)
    assert np.exp2(stats[2]) - 1 == pytest.approx(3 * 64 * 64 * 4, rel=0.01)  # A, B and C once (float32)
