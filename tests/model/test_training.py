"""Training and fine-tuning on synthetic programs."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from cdmpp.model.checkpoint import TrainedModel
from cdmpp.model.training import TrainConfig, checked_finetune, finetune, fit, withhold_counts
from cdmpp.records.dataset import LabeledProgram
from tests.model.synthetic import DEVICES, FakeProgram, quick_config, synthetic_samples


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown training settings"):
        TrainConfig.from_dict({"d_modle": 64})
    with pytest.raises(ValueError, match="da = 'coral'"):
        TrainConfig(da="coral")
    for removed in ("ema", "pooling", "loop_tokens", "label"):  # the study's dropped options
        with pytest.raises(ValueError, match="unknown training settings"):
            TrainConfig.from_dict({removed: 0})
    default = TrainConfig.recipe("default")
    no_pe = TrainConfig.recipe("ablation-no-pe")  # inherits everything else through base = "default"
    assert default.model.use_pe
    assert TrainConfig.recipe("ablation-no-da").da == "none" and TrainConfig.recipe("mmd").da == "mmd"
    assert default == TrainConfig()  # the defaults are the shipped recipe
    assert TrainConfig.from_dict(default.to_dict()) == default and default.replace(d_model=64).model.d_model == 64
    assert no_pe.model.use_pe is False and no_pe.model.d_model == default.model.d_model
    counted = default  # the assembly's counts are of x86 builds: a GPU model reads none
    assert counted.for_kind("llvm") is counted and counted.for_kind("") is counted
    gpu = counted.for_kind("cuda")
    assert not gpu.assembly_counts and gpu.assembly_withheld == 0.0 and gpu.epochs == counted.epochs
    assert counted.assembly_counts and counted.assembly_withheld == 0.25 and TrainConfig.recipe("assembly") == default
    assert counted.assembly_unbuilt_copies  # the withheld share is trained on twice, with and without its counts
    plain = TrainConfig.recipe("ablation-no-counts")
    assert not plain.assembly_counts and plain.assembly_withheld == 0.0 and plain.epochs == default.epochs
    with pytest.raises(ValueError, match="assembly_withheld"):
        TrainConfig(assembly_withheld=1.0)


def test_withheld_counts_are_a_seeded_share_of_the_training_programs():
    """``assembly_withheld``: that share of the programs stands unbuilt, drawn with the seed (the same programs each
    run), the others keep their counts, and the programs passed in are left as they were."""
    programs = [LabeledProgram(FakeProgram(np.ones((1, 4), np.float32), np.arange(1), asm=np.full(3, i + 1.0)),
                               "cpu-a", 1e-3) for i in range(2000)]
    kept = withhold_counts(programs, 0.25, seed=7)
    unbuilt = [q.features.asm is None for q in kept]
    assert 0.22 < np.mean(unbuilt) < 0.28
    assert unbuilt == [q.features.asm is None for q in withhold_counts(programs, 0.25, seed=7)]
    assert unbuilt != [q.features.asm is None for q in withhold_counts(programs, 0.25, seed=8)]
    assert all(q.features.asm[0] == i + 1 for i, q in enumerate(kept) if q.features.asm is not None)
    assert all(p.features.asm is not None for p in programs)


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


def test_checked_finetune_keeps_a_fine_tune_only_where_held_out_shots_improve(trained):
    model, _, _ = trained
    rng = np.random.default_rng(6)
    spec = {**DEVICES["cpu-a"], "clock_ghz": 0.5, "mem_bw_gbs": 2}
    slower, noise = synthetic_samples(24, rng), synthetic_samples(24, rng)
    for s in slower:  # SYNTHETIC: cpu-a's law, 8x slower; a fine-tune learns that from any 18 of them
        s.device, s.seconds = "cpu-c", s.seconds * 8
    for s in noise:  # SYNTHETIC: labels unrelated to the programs; nothing to learn, only to overfit
        s.device, s.seconds = "cpu-c", float(np.exp(rng.uniform(-12, 0)))
    tuned = checked_finetune(model, slower, steps=60, device_table={"cpu-c": spec})
    check = tuned.summary["finetune"]["check"]
    assert check["kept"] and check["held_out_log_error"] < check["unadapted_log_error"]
    kept = checked_finetune(model, noise, steps=60, device_table={"cpu-c": spec})
    assert not kept.summary["finetune"]["check"]["kept"]
    base = copy.deepcopy(model)
    base.add_device("cpu-c", spec)
    feats = [s.features for s in noise]
    np.testing.assert_allclose(kept.predict(feats, "cpu-c")[0], base.predict(feats, "cpu-c")[0], rtol=1e-6)


def test_target_batches_match_source_leaf_counts():
    from cdmpp.model.training import _LengthMatcher

    target_lengths = np.array([1, 1, 3, 3, 3, 8, 12])
    m = _LengthMatcher(target_lengths)
    rng = np.random.default_rng(0)
    picks = m.sample(np.array([3, 3, 1, 8, 10, 2, 30]), rng)
    assert target_lengths[picks].tolist()[:4] == [3, 3, 1, 8]
    assert target_lengths[picks[4]] in (8, 12) and target_lengths[picks[5]] in (1, 3) and target_lengths[picks[6]] == 12


def test_device_balance_weights_a_small_device_up_in_the_loss():
    import torch

    from cdmpp.model.training import device_weights, mape_loss

    train = ["cpu-a"] * 90 + ["gpu"] * 10
    assert device_weights(train, train, 0.0) is None  # every program alike: the plain mean
    w = device_weights(train, train, 1.0)  # every device alike
    assert w.mean() == pytest.approx(1.0) and w[:90].sum() == pytest.approx(w[90:].sum())
    half = device_weights(train, ["cpu-a", "gpu", "never-trained"], 0.5)
    assert half[1] / half[0] == pytest.approx(3.0) and half[0] < half[2] < half[1]
    pred, label = torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0])  # APE 0 and e - 1
    assert mape_loss(pred, label, 1.0, torch.tensor([1.0, 3.0])).item() == pytest.approx(0.75 * (np.e - 1))
    rng = np.random.default_rng(5)
    samples = synthetic_samples(120, rng) + synthetic_samples(12, rng, "cpu-b")
    val = synthetic_samples(40, rng) + synthetic_samples(40, rng, "cpu-b")
    model = fit(quick_config(epochs=3, ensemble=1, device_balance=1.0), samples, val, device_table=DEVICES)
    devices = [s.device for s in val]  # the snapshot was picked on the validation MAPE weighted the same way
    seconds = model.label_transform.inverse_transform(model.predict_z([s.features for s in val], devices)[0])
    y = np.array([s.seconds for s in val])
    weighted = np.average(np.abs(seconds - y) / y, weights=device_weights([s.device for s in samples], devices, 1.0))
    assert model.summary["members"][0]["best_val_mape"] == pytest.approx(weighted, rel=1e-4)
    assert weighted != pytest.approx(np.mean(np.abs(seconds - y) / y), rel=1e-3)


def test_snapshot_ensemble_takes_members_from_distinct_cycles():
    rng = np.random.default_rng(3)
    train, val = synthetic_samples(300, rng), synthetic_samples(100, rng)
    cfg = quick_config(ensemble=3, epochs=8, lr_cycle_epochs=2, patience=8)
    model = fit(cfg, train, val)
    epochs = model.summary["members"][0]["members_from_epochs"]
    assert len(model.members) == 3 and len({e // 2 for e in epochs}) == 3
    z = model.predict_z([s.features for s in val], "cpu-a")
    assert z.shape == (3, 100) and np.all(z.std(axis=0) > 0)


def test_program_inputs_train_save_and_load(tmp_path):
    """With TVM's 164 columns the members read the programs' log FLOPs and bytes (``extra_inputs``); such a model
    trains, predicts finite positive latencies and survives a checkpoint round trip and a fine-tune.
    SYNTHETIC programs with 164 columns, so the program inputs (FLOPs, bytes) are computed."""
    rng = np.random.default_rng(3)

    def sample(device):
        n = int(rng.integers(1, 5))
        x = np.abs(rng.normal(size=(n, 164))).astype(np.float32) * 4
        return LabeledProgram(FakeProgram(x, np.arange(n)), device, float(1e-5 * np.exp2(x[:, 0]).sum()))

    train = [sample(d) for d in ["cpu-a", "cpu-b"] * 60]
    val = [sample("cpu-a") for _ in range(30)]
    model = fit(quick_config(epochs=3, ensemble=1, assembly_counts=False), train, val, device_table=DEVICES)
    assert model.members[0].hparams["n_program_inputs"] == 3 and model.program_inputs is not None
    mean, lo, hi = model.predict([s.features for s in val], "cpu-b")
    assert np.all(np.isfinite(mean)) and np.all(mean > 0) and np.all(lo <= hi)
    model.save(tmp_path / "m")
    again = TrainedModel.load(tmp_path / "m")
    assert np.array_equal(again.predict([s.features for s in val], "cpu-b")[0], mean)
    assert finetune(model, val[:8], steps=2).predict([s.features for s in val], "cpu-a")[0].shape == (30,)


def test_assembly_counts_train_save_and_load(tmp_path):
    """With ``assembly_counts`` the members and the blend's GBT read the built programs' instruction counts (a
    program without them marked absent), survive a checkpoint round trip, and their predictions move with the
    counts; a model trained without them ignores them. SYNTHETIC programs and counts: the latency follows a count."""
    from cdmpp.model.network import N_STATS
    from cdmpp.program.assembly import N_COUNTS

    rng = np.random.default_rng(5)

    def sample(device, built=True):
        n = int(rng.integers(1, 4))
        x = np.abs(rng.normal(size=(n, 164))).astype(np.float32) * 4
        asm = rng.integers(1, 200, N_COUNTS).astype(float)
        y = float(1e-6 * asm[1] * (2.0 if device == "cpu-b" else 1.0))
        return LabeledProgram(FakeProgram(x, np.arange(n), asm=asm if built else None), device, y)

    train = [sample(d, built=i % 10 > 0) for i, d in enumerate(["cpu-a", "cpu-b"] * 60)]
    val = [sample("cpu-a") for _ in range(30)]
    model = fit(quick_config(epochs=2, ensemble=1, gbt_blend=True, gbt_max_trees=20, assembly_withheld=0.0), train, val,
                device_table=DEVICES)
    assert model.members[0].hparams["n_program_inputs"] == N_STATS and model.gbt.assembly_counts
    feats = [s.features for s in val]
    mean = model.predict(feats, "cpu-a")[0]
    model.save(tmp_path / "m")
    again = TrainedModel.load(tmp_path / "m")
    assert again.gbt.assembly_counts and np.array_equal(again.predict(feats, "cpu-a")[0], mean)
    other = [copy.copy(f) for f in feats]
    for f in other:
        f.asm = f.asm * 3
    assert not np.allclose(model.predict(other, "cpu-a")[0], mean)
    # a program beyond the training range (a count 10^4 x any trained one) is read at the range's edge: its inputs,
    # and so its prediction, are those of a program at the edge; the "built" flag of 12 absent programs is held at
    # -3 sd (its 0, standardized over 120 programs) rather than far beyond, and nothing exceeds the leaves' 10 sd
    lo, hi = np.asarray(model.program_inputs["lo"]), np.asarray(model.program_inputs["hi"])
    assert np.all(lo >= -10) and np.all(hi <= 10) and np.all(lo[3:] > -10) and np.all(hi[3:] < 10)
    far, edge = copy.copy(feats[0]), copy.copy(feats[0])
    far.asm, edge.asm = feats[0].asm * 1e4, feats[0].asm * 1e5
    z_far, z_edge = (model.extra_inputs(model.pack([f])).numpy() for f in (far, edge))
    assert np.all(z_far <= hi + 1e-6) and np.all(z_far >= lo - 1e-6)
    assert np.array_equal(z_far[0, 3:], z_edge[0, 3:])
    assert model.predict([far], "cpu-a")[0][0] == pytest.approx(model.predict([edge], "cpu-a")[0][0], rel=1e-4)
    plain = fit(quick_config(epochs=1, ensemble=1, assembly_counts=False), train, val, device_table=DEVICES)
    assert plain.members[0].hparams["n_program_inputs"] == 3
    assert np.array_equal(plain.predict(other, "cpu-a")[0], plain.predict(feats, "cpu-a")[0])


def test_innermost_counts_are_inputs_only_of_a_model_trained_with_them(tmp_path):
    """``assembly_inner``: the innermost loops' counts (``asm_inner``) are read after the module's counts; a program
    without them stands as not built there; a model trained without them has neither their columns nor a use for
    them. SYNTHETIC programs and counts: the latency follows an innermost count."""
    from cdmpp.model.network import N_INNER_STATS, N_STATS
    from cdmpp.program.assembly import N_COUNTS

    rng = np.random.default_rng(6)

    def sample():
        n = int(rng.integers(1, 4))
        x = np.abs(rng.normal(size=(n, 164))).astype(np.float32) * 4
        asm, inner = rng.integers(1, 200, N_COUNTS).astype(float), rng.integers(1, 200, N_COUNTS).astype(float)
        return LabeledProgram(FakeProgram(x, np.arange(n), asm=asm, asm_inner=inner), "cpu-a", float(1e-6 * inner[1]))

    train, val = [sample() for _ in range(120)], [sample() for _ in range(30)]
    config = dict(epochs=2, ensemble=1, assembly_withheld=0.0)
    model = fit(quick_config(assembly_inner=True, **config), train, val, device_table=DEVICES)
    assert model.members[0].hparams["n_program_inputs"] == N_INNER_STATS
    model.save(tmp_path / "m")
    feats = [s.features for s in val]
    mean = TrainedModel.load(tmp_path / "m").predict(feats, "cpu-a")[0]
    assert np.array_equal(model.predict(feats, "cpu-a")[0], mean)
    moved = [copy.copy(f) for f in feats]
    for f in moved:
        f.asm_inner = f.asm_inner * 3
    assert not np.allclose(model.predict(moved, "cpu-a")[0], mean)
    unbuilt = [copy.copy(f) for f in feats]
    for f in unbuilt:
        f.asm_inner = None
    absent = model.extra_inputs(model.pack(unbuilt)).numpy()
    assert absent.shape[1] == N_INNER_STATS and np.isfinite(model.predict(unbuilt, "cpu-a")[0]).all()
    plain = fit(quick_config(**config), train, val, device_table=DEVICES)
    assert plain.members[0].hparams["n_program_inputs"] == N_STATS
    assert np.array_equal(plain.predict(moved, "cpu-a")[0], plain.predict(feats, "cpu-a")[0])
    without = [LabeledProgram(dataclasses.replace(s.features, asm_inner=None), s.device, s.seconds) for s in train]
    with pytest.raises(ValueError, match="innermost"):
        fit(quick_config(assembly_inner=True, **config), without, val, device_table=DEVICES)


def test_a_checkpoint_of_an_older_format_says_to_retrain(trained, tmp_path):
    """Format 1 could name options the study dropped (reports/study-issue19.md, "Options removed"): it is
    refused with what to do, not read with a guess."""
    import json

    model, _, _ = trained
    path = model.save(tmp_path / "m") / "predictor.json"
    meta = json.loads(path.read_text())
    assert "ema" not in meta["config"] and "pooling" not in meta["model"]
    meta["format_version"] = 1
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="format 1, this cdmpp reads 2: retrain it"):
        TrainedModel.load(tmp_path / "m")


def test_domain_adaptation_adapts_to_a_new_device_only():
    """A pool of held-out programs on a device with training labels trains exactly as without a pool (towards
    new networks on known devices adaptation cost MAPE); a pool on a device without labels switches it on."""
    rng = np.random.default_rng(6)
    train, val = synthetic_samples(200, rng), synthetic_samples(50, rng)
    known, new = synthetic_samples(50, rng), synthetic_samples(50, rng, "cpu-b")
    cfg = quick_config(epochs=2, ensemble=1)
    same = fit(cfg, train, val, target_pool=known, device_table=DEVICES)
    plain = fit(cfg, train, val, device_table=DEVICES)
    adapted = fit(cfg, train, val, target_pool=new, device_table=DEVICES)
    assert same.summary["n_target"] == 0 and adapted.summary["n_target"] == 50
    feats = [s.features for s in val]
    assert np.allclose(same.predict(feats, "cpu-a")[0], plain.predict(feats, "cpu-a")[0])
    assert not np.allclose(adapted.predict(feats, "cpu-a")[0], plain.predict(feats, "cpu-a")[0])



def test_domain_adaptation_aligns_a_new_gpu_only_with_gpu_programs():
    """A pool on a GPU never trained on is aligned with the training programs of GPU code, never with CPU
    ones: with none among them the pool is dropped (the run trains exactly as without it); with some it adapts."""
    import dataclasses

    rng = np.random.default_rng(7)
    train, val = synthetic_samples(200, rng), synthetic_samples(50, rng)
    pool = [dataclasses.replace(s, device="gpu-new/cuda-sm70") for s in synthetic_samples(50, rng, "cpu-b")]
    gpus = [dataclasses.replace(s, device="gpu-old/cuda-sm37") for s in synthetic_samples(200, rng, "cpu-b")]
    table = {**DEVICES, "gpu-new/cuda-sm70": DEVICES["cpu-b"], "gpu-old/cuda-sm37": DEVICES["cpu-b"]}
    cfg = quick_config(epochs=2, ensemble=1)
    feats = [s.features for s in val]
    cpu_only = fit(cfg, train, val, target_pool=pool, device_table=table)
    plain = fit(cfg, train, val, device_table=table)
    assert cpu_only.summary["n_target"] == 0
    assert np.allclose(cpu_only.predict(feats, "cpu-a")[0], plain.predict(feats, "cpu-a")[0])
    adapted = fit(cfg, train + gpus, val, target_pool=pool, device_table=table)
    unweighted = fit(quick_config(epochs=2, ensemble=1, da_weight=0.0), train + gpus, val, target_pool=pool,
                     device_table=table)  # the same draws of pool programs, no alignment term
    assert adapted.summary["n_target"] == 50
    assert not np.allclose(adapted.predict(feats, "cpu-a")[0], unweighted.predict(feats, "cpu-a")[0])

def test_a_run_collapsed_by_domain_adaptation_trains_again_without_it(monkeypatch, tmp_path):
    """Aligned with programs unlike the training ones, CMD can make the network predict nothing (a held-out
    chip known only from another project's tuning logs: validation MAPE 0.993). The run stops at the first
    such epoch and trains again without a pool: the model is the one trained without it, and says so; a
    resumed fit ends the same way. (Every adapted epoch counts as collapsed here: a real collapse takes
    hundreds of thousands of programs.)"""
    from cdmpp.model import training

    monkeypatch.setattr(training, "COLLAPSED_SHARE", 0.0)
    rng = np.random.default_rng(9)
    train, val, new = synthetic_samples(200, rng), synthetic_samples(50, rng), synthetic_samples(50, rng, "cpu-b")
    cfg = quick_config(epochs=3, ensemble=1)
    plain = fit(cfg, train, val, device_table=DEVICES)
    dropped = fit(cfg, train, val, target_pool=new, device_table=DEVICES, resume=tmp_path / "run.pt")
    collapsed = dropped.summary["da_collapsed"]
    assert len(collapsed["history"]) == 1 and dropped.summary["n_target"] == 0
    assert dropped.summary["members"][0]["stopped"] == "epochs"
    feats = [s.features for s in val]
    assert np.allclose(dropped.predict(feats, "cpu-a")[0], plain.predict(feats, "cpu-a")[0])
    assert (tmp_path / "run.pt").exists() and (tmp_path / "run.pt.no-da").exists()
    again = fit(cfg, train, val, target_pool=new, device_table=DEVICES, resume=tmp_path / "run.pt")
    assert np.allclose(again.predict(feats, "cpu-a")[0], plain.predict(feats, "cpu-a")[0])


def test_the_gbt_blend_ends_gbt_minutes_after_the_transformers_deadline(monkeypatch):
    """The GBT's budget ends max_minutes + gbt_minutes after the fit starts: what runs between the transformer's
    deadline and the GBT (the members' validation predictions, the interval calibration) comes out of its time."""
    import time

    from cdmpp.model import training

    real_blend, real_calibrate, ends = training._add_gbt_blend, TrainedModel.calibrate, []

    def slow_calibrate(self, *args):
        time.sleep(1.0)
        return real_calibrate(self, *args)

    def blend_spy(trained, train_set, val_set, val_pred, seed, budget_s, *rest):
        ends.append(time.monotonic() + budget_s)
        return real_blend(trained, train_set, val_set, val_pred, seed, budget_s, *rest)

    monkeypatch.setattr(TrainedModel, "calibrate", slow_calibrate)
    monkeypatch.setattr(training, "_add_gbt_blend", blend_spy)
    rng = np.random.default_rng(4)
    config = quick_config(gbt_blend=True, ensemble=1, epochs=10_000, patience=10_000, max_minutes=0.04,
                          gbt_minutes=0.25)
    start = time.monotonic()
    fit(config, synthetic_samples(300, rng), synthetic_samples(100, rng), device_table=DEVICES)
    assert ends and ends[0] <= start + 60.0 * (0.04 + 0.25) + 0.3


def test_the_gbt_blend_weights_for_seconds_and_order_are_chosen_on_val_and_survive_a_checkpoint(tmp_path):
    """With ``gbt_blend`` the model's prediction is exp(w log members + (1 - w) log GBT), w chosen on the
    validation split among weights that include 0 and 1 (for seconds, the lowest MAPE, so its validation
    MAPE is at most either part's; for order, the best-ranking one within ``blend_rank_slack`` of it)."""
    import copy

    from cdmpp.model.blend import blend, blend_weight
    from cdmpp.model.checkpoint import TrainedModel

    rng = np.random.default_rng(3)
    train = synthetic_samples(400, rng) + synthetic_samples(200, rng, "cpu-b")
    val = synthetic_samples(150, rng) + synthetic_samples(50, rng, "cpu-b")
    config = quick_config(gbt_blend=True, blend_rank_slack=0.2, ensemble=1, epochs=4)
    model = fit(config, train, val, device_table=DEVICES)
    w, w_order = model.calibration["gbt_weight"], model.calibration["gbt_order_weight"]
    progs, devs, y = [s.features for s in val], [s.device for s in val], np.array([s.seconds for s in val])
    members_only = copy.copy(model)
    members_only.gbt = None
    alone = members_only.predict(progs, devs)[0]
    gbt = model.gbt.predict(val)
    for got, want in zip(model.predict_parts(progs, devs), (alone, gbt)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    mean, lo, hi = model.predict(progs, devs)
    np.testing.assert_allclose(mean, blend(alone, gbt, w), rtol=1e-5)
    assert w == blend_weight(y, alone, gbt)  # seconds: the lowest MAPE
    assert w_order == blend_weight(y, alone, gbt, [f"{s.device}|{s.task}" for s in val], 0.2)  # order: ranking
    other = copy.copy(model)
    other.calibration = {**model.calibration, "gbt_order_weight": 0.5}
    np.testing.assert_allclose(other.predict(progs, devs, order=True)[0], blend(alone, gbt, 0.5), rtol=1e-5)
    np.testing.assert_allclose(other.predict(progs, devs)[0], mean, rtol=1e-6)
    assert np.all(lo <= mean) and np.all(mean <= hi)
    mape = lambda p: float(np.mean(np.abs(p - y) / y))  # noqa: E731
    assert model.summary["val"]["mape"] == pytest.approx(mape(mean), rel=1e-5)
    assert model.calibration["val_log_bias"] == pytest.approx(float(np.median(np.log(mean / y))), abs=1e-5)
    assert mape(mean) <= min(mape(alone), mape(gbt)) + 1e-9
    again = TrainedModel.load(model.save(tmp_path / "ckpt"))
    assert again.calibration["gbt_weight"] == w and again.calibration["gbt_order_weight"] == w_order
    for order in (False, True):
        for a, b in zip(model.predict(progs, devs, order=order), again.predict(progs, devs, order=order)):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    assert not (TrainedModel.load(members_only.save(tmp_path / "plain")).gbt or (tmp_path / "plain" / "gbt.ubj.gz").exists())
    # k-shot on a new device: the blended GBT learns the shots too (trees on top), the source model stays
    shots = [copy.copy(s) for s in val[:20]]
    for s in shots:
        s.device = "cpu-c"
    rounds = model.gbt.booster_.num_boosted_rounds()
    tuned = finetune(model, shots, steps=5, device_table={"cpu-c": {**DEVICES["cpu-a"], "clock_ghz": 0.5}})
    assert tuned.gbt.booster_.num_boosted_rounds() == rounds + 10 and rounds == model.gbt.booster_.num_boosted_rounds()
    assert np.all(np.isfinite(tuned.predict([s.features for s in shots], "cpu-c")[0]))


def test_finetune_steps_are_about_twenty_passes_over_the_shots():
    """A handful of shots gets twenty passes (not a hundred, which overfits them); thousands get the cap."""
    from cdmpp.model.training import finetune_steps

    assert finetune_steps(16, 256) == 20 and finetune_steps(64, 256) == 20
    assert finetune_steps(300, 256) == 24
    assert finetune_steps(2568, 256) == 100


def test_the_blended_gbt_adapts_with_half_a_tree_per_shot():
    """Fifty trees on 16 shots fit their noise; a few thousand shots get the cap."""
    from cdmpp.model.pooled_gbt import adapt_rounds

    assert adapt_rounds(1) == 1 and adapt_rounds(16) == 8 and adapt_rounds(64) == 32 and adapt_rounds(2568) == 50


def test_shots_that_rank_more_tasks_than_validation_choose_the_order_weight():
    """``checked_finetune`` chooses the blend's order weight again on the shots, by validation's rule and on
    predictions the shots did not train, when they rank at least as many tasks as validation did; the
    seconds weight stays validation's."""
    from cdmpp.model.blend import blend_weight

    rng = np.random.default_rng(7)
    config = quick_config(gbt_blend=True, blend_rank_slack=0.2, ensemble=1, epochs=4)
    model = fit(config, synthetic_samples(400, rng), synthetic_samples(150, rng), device_table=DEVICES)
    assert model.calibration["order_tasks"] == 10  # ten tasks on one device, each with >= 3 programs
    spec = {**DEVICES["cpu-a"], "clock_ghz": 0.5, "mem_bw_gbs": 2}
    shots = synthetic_samples(60, rng)
    base = copy.deepcopy(model)
    base.add_device("cpu-c", spec)
    predicted = base.predict([s.features for s in shots], "cpu-c")[0]
    for s, p in zip(shots, predicted):  # SYNTHETIC: the model's own guess x noise: nothing to fine-tune on
        s.device, s.seconds = "cpu-c", float(p * np.exp(rng.normal()))
    parts = base.predict_parts([s.features for s in shots], "cpu-c")
    want = blend_weight([s.seconds for s in shots], *parts, [f"cpu-c|{s.task}" for s in shots], 0.2)
    assert want != model.calibration["gbt_order_weight"]  # the shots rank best at another weight than validation
    for ranked_by_validation, expected in ((10, want), (11, model.calibration["gbt_order_weight"])):
        model.calibration["order_tasks"] = ranked_by_validation
        tuned = checked_finetune(model, shots, config, steps=60, device_table={"cpu-c": spec})
        assert not tuned.summary["finetune"]["check"]["kept"]
        assert tuned.calibration["gbt_order_weight"] == expected
        assert tuned.calibration["gbt_weight"] == model.calibration["gbt_weight"]
        assert ("order_weight" in tuned.summary["finetune"]) == (ranked_by_validation == 10)


def test_a_stopped_run_resumes_from_its_last_epoch_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    """``fit(resume=...)`` saves the run after every epoch and the blend's GBT once fitted; a stop in the third
    epoch, then the same call again, gives the model an uninterrupted run gives (same random states, same
    snapshots, same trees), and the saved file of another run is refused, not resumed from. SYNTHETIC programs."""
    from cdmpp.model import training

    rng = np.random.default_rng(5)
    train, val = synthetic_samples(200, rng), synthetic_samples(60, rng)
    cfg = quick_config(ensemble=2, epochs=4, lr_cycle_epochs=2, patience=4, gbt_blend=True, gbt_max_trees=20)
    whole = fit(cfg, train, val)
    features = [s.features for s in val]

    state = tmp_path / "run.pt"
    real, calls = training._val_scores, []

    def stop_in_the_third_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "_val_scores", stop_in_the_third_epoch)
    with pytest.raises(KeyboardInterrupt):
        fit(cfg, train, val, resume=state)
    monkeypatch.setattr(training, "_val_scores", real)
    assert len(training.torch.load(state, weights_only=False)["history"]) == 2  # two epochs were saved
    resumed = fit(cfg, train, val, resume=state)
    assert resumed.summary["members"][0]["history"] == whole.summary["members"][0]["history"]
    for a, b in zip(resumed.members, whole.members):
        assert all(np.array_equal(a.state_dict()[k].numpy(), b.state_dict()[k].numpy()) for k in a.state_dict())
    assert np.array_equal(resumed.predict(features, "cpu-a")[0], whole.predict(features, "cpu-a")[0])
    assert training.torch.load(state, weights_only=False)["gbt"]  # the blend's trees, saved once fitted
    again = fit(cfg, train, val, resume=state)  # an ended run is not trained again, nor its GBT boosted
    assert again.summary["members"][0]["history"] == whole.summary["members"][0]["history"]
    assert np.array_equal(again.predict(features, "cpu-a")[0], whole.predict(features, "cpu-a")[0])
    with pytest.raises(ValueError, match="another training run"):
        fit(cfg.replace(epochs=5), train, val, resume=state)


def test_an_ensemble_of_runs_takes_each_independent_runs_best_state_and_resumes_each_run(tmp_path):
    """``ensemble_of = "runs"``: ``ensemble`` runs seeded ``seed``, ``seed + 1``, ...; a member is each run's best
    state; its first run is the run a snapshot ensemble of the same seed trains (the same saved file serves both),
    and each further run resumes from its own file. SYNTHETIC programs."""
    rng = np.random.default_rng(6)
    train, val = synthetic_samples(200, rng), synthetic_samples(60, rng)
    snapshots = quick_config(ensemble=2, epochs=4, lr_cycle_epochs=2, patience=4, gbt_blend=False)
    runs = snapshots.replace(ensemble_of="runs")
    with pytest.raises(ValueError, match="ensemble_of = 'seeds'"):
        snapshots.replace(ensemble_of="seeds")
    one_run = fit(snapshots, train, val, resume=tmp_path / "run.pt")
    model = fit(runs, train, val, resume=tmp_path / "run.pt")
    members = model.summary["members"]
    assert [m["seed"] for m in members] == [0, 1] and len(model.members) == 2
    assert members[0]["history"] == one_run.summary["members"][0]["history"]  # run 0 read back, not trained again
    assert members[1]["history"] != members[0]["history"]
    assert all(len(m["members_from_epochs"]) == 1 for m in members)
    assert (tmp_path / "run.pt.run1").exists()
    best = min(members[0]["history"], key=lambda row: row[2])[0]
    assert members[0]["members_from_epochs"] == [best]
    again = fit(runs, train, val, resume=tmp_path / "run.pt")
    assert [m["history"] for m in again.summary["members"]] == [m["history"] for m in members]
