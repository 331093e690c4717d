"""Amdahl's law between thread counts, and a model that reaches a device it never trained on through it."""

from __future__ import annotations

import numpy as np
import pytest

from cdmpp.model.physics import amdahl_seconds, anchor_device
from cdmpp.program.features import FEATURE_NAMES, N_FEATURES
from cdmpp.records.dataset import LabeledProgram
from tests.model.synthetic import FakeProgram, quick_config

SPEC = dict(clock_ghz=2.6, simd_width_bits=512, l1d_kb=32, l2_kb=1024, l3_kb=32768, mem_bw_gbs=30, peak_gflops=200)
TABLE = {"chip-2t/llvm-avx512": {**SPEC, "cores": 2}, "chip-1t/llvm-avx512": {**SPEC, "cores": 1},
         "chip-8t/llvm-avx512": {**SPEC, "cores": 8}, "chip-2t/llvm-avx2": {**SPEC, "cores": 2},
         "other-1t/llvm-avx512": {**SPEC, "cores": 1}, "other-8t/llvm-avx512": {**SPEC, "cores": 8},
         "gpu/cuda-sm90": {**SPEC, "cores": 132}}


def parallel_program(rng) -> FakeProgram:
    """SYNTHETIC: two leaves, one under a parallel loop of extent 4 or 3, op counts at random."""
    rows = np.zeros((2, N_FEATURES), np.float32)
    rows[:, FEATURE_NAMES.index("float_mad")] = rng.uniform(5, 25, 2)
    rows[0, FEATURE_NAMES.index("parallel_num")] = 1
    rows[0, FEATURE_NAMES.index("parallel_prod")] = np.log2(rng.choice([3, 4]) + 1)
    return FakeProgram(rows, np.arange(2))


def test_amdahl_seconds_runs_both_ways():
    """2 -> 1 thread and back gives the label again; a loop of extent 3 on 2 threads runs in 2 rounds."""
    rng = np.random.default_rng(0)
    feats = [parallel_program(rng) for _ in range(20)]
    two = rng.uniform(1e-5, 1e-2, 20)
    one = amdahl_seconds(two, feats, 2, 1, fork_join_s=1e-6)
    assert np.all(one > two - 1e-6)
    np.testing.assert_allclose(amdahl_seconds(one, feats, 1, 2, fork_join_s=1e-6), two, rtol=1e-9)
    serial_free = FakeProgram(feats[0].leaf_features[:1], np.arange(1))
    serial_free.leaf_features[0, FEATURE_NAMES.index("parallel_prod")] = np.log2(4)
    assert amdahl_seconds([1.0], [serial_free], 1, 2)[0] == pytest.approx(2 / 3)


def test_anchor_device_prefers_the_isa_then_the_chip_then_the_thread_count():
    trained = ["chip-2t/llvm-avx512", "chip-2t/llvm-avx2", "other-8t/llvm-avx512"]
    assert anchor_device("chip-2t/llvm-avx512", trained, TABLE) is None  # trained on: predicted directly
    assert anchor_device("chip-1t/llvm-avx512", trained, TABLE) == "chip-2t/llvm-avx512"
    assert anchor_device("chip-1t/llvm-avx512", ["chip-2t/llvm-avx2", "chip-8t/llvm-avx512"], TABLE) == "chip-8t/llvm-avx512"
    assert anchor_device("other-1t/llvm-avx512", ["chip-2t/llvm-avx512", "chip-8t/llvm-avx512"], TABLE) == "chip-2t/llvm-avx512"
    assert anchor_device("gpu/cuda-sm90", trained, TABLE) is None  # the law is about CPU threads
    assert anchor_device("chip-1t/llvm-avx512", ["gpu/cuda-sm90"], TABLE) is None
    # a chip never trained on goes through the closest thread count, even one the model trained on
    assert anchor_device("other-1t/llvm-avx512", ["chip-2t/llvm-avx512", "chip-1t/llvm-avx512"], TABLE) == "chip-1t/llvm-avx512"
    assert anchor_device("other-1t/llvm-avx512", ["chip-2t/llvm-avx512", "chip-1t/llvm-avx512"], TABLE,
                         cross_chip=False) is None  # the old rule: its other specs move it


def test_a_new_chip_is_moved_by_its_per_thread_peak():
    """Between chips the move multiplies by the per-thread peak ratio (a chip half as fast per thread takes
    twice as long); between devices of one chip it is Amdahl's law alone."""
    from cdmpp.model.physics import chip_ratio, move

    table = {**TABLE, "slow-1t/llvm-avx2": {**SPEC, "cores": 1, "peak_gflops": 50}}
    assert chip_ratio("chip-1t/llvm-avx512", "slow-1t/llvm-avx2", table, reference=False) == pytest.approx(4.0)
    assert chip_ratio("chip-2t/llvm-avx512", "chip-1t/llvm-avx512", table, reference=False) == 1.0
    rng = np.random.default_rng(0)
    feats = [parallel_program(rng) for _ in range(5)]
    secs = rng.uniform(1e-4, 1e-2, 5)
    np.testing.assert_allclose(move(secs, feats, ["chip-1t/llvm-avx512"] * 5, ["slow-1t/llvm-avx2"] * 5, table, {}),
                               4.0 * secs)


def test_a_new_gpu_goes_through_the_trained_gpu_closest_in_peak_moved_by_the_peaks_ratio():
    """No Amdahl between GPUs (their "cores" are SMs): the whole chips' peak FLOP/s set the ratio; the
    anchor is the trained GPU of the closest peak, and a GPU with none trained is predicted directly."""
    from cdmpp.model.physics import chip_ratio, fork_join_of, move

    table = {**TABLE, "slow/cuda-sm37": {**SPEC, "cores": 13, "peak_gflops": 4000},
             "mid/cuda-sm70": {**SPEC, "cores": 80, "peak_gflops": 16000},
             "fast/cuda-sm90": {**SPEC, "cores": 132, "peak_gflops": 80000}}
    trained = ["chip-2t/llvm-avx512", "slow/cuda-sm37", "fast/cuda-sm90"]
    assert anchor_device("mid/cuda-sm70", trained, table) == "slow/cuda-sm37"  # 4x apart, not 5x
    assert anchor_device("mid/cuda-sm70", trained, table, cross_chip=False) is None
    assert anchor_device("mid/cuda-sm70", ["chip-2t/llvm-avx512"], table) is None
    assert anchor_device("fast/cuda-sm90", trained, table) is None  # trained on
    assert chip_ratio("slow/cuda-sm37", "mid/cuda-sm70", table) == pytest.approx(0.25)  # per SM it would be 0.66
    rng = np.random.default_rng(0)
    feats = [parallel_program(rng) for _ in range(5)]
    secs = rng.uniform(1e-4, 1e-2, 5)
    np.testing.assert_allclose(move(secs, feats, ["slow/cuda-sm37"] * 5, ["mid/cuda-sm70"] * 5, table, {}),
                               0.25 * secs)
    fork_join = fork_join_of(["slow/cuda-sm37", "chip-2t/llvm-avx512"], [1e-3, 1e-3], np.array([0, 1]), table)
    assert fork_join["slow/cuda-sm37"] == 0.0  # kept, so that a new GPU can be anchored on it

def test_between_gpus_their_measured_levels_come_before_the_peaks():
    """A K80 reaches a third of its datasheet peak, a V100 two thirds: where both GPUs have a measured level
    (``level_gflops``, the FLOP/s their tuned programs reach) its ratio moves a program, else the peaks'."""
    from cdmpp.model.physics import chip_ratio

    table = {"slow/cuda-sm37": {**SPEC, "cores": 13, "peak_gflops": 4000, "level_gflops": 1000},
             "mid/cuda-sm70": {**SPEC, "cores": 80, "peak_gflops": 16000}}
    assert chip_ratio("slow/cuda-sm37", "mid/cuda-sm70", table) == pytest.approx(0.25)  # one level: the peaks
    table["mid/cuda-sm70"]["level_gflops"] = 8000
    assert chip_ratio("slow/cuda-sm37", "mid/cuda-sm70", table) == pytest.approx(0.125)
    assert chip_ratio("mid/cuda-sm70", "slow/cuda-sm37", table) == pytest.approx(8.0)
    assert chip_ratio("slow/cuda-sm37", "mid/cuda-sm70", table, reference=False) == pytest.approx(0.25)


def test_between_chips_the_reference_kernels_level_comes_before_the_peak():
    """Where both chips have their reference kernels measured (``reference_s``) their ratio moves a program,
    else the per-thread peak ratio; devices of one chip stay at 1."""
    from cdmpp.model.physics import chip_ratio

    table = {**TABLE, "slow-1t/llvm-avx2": {**SPEC, "cores": 1, "peak_gflops": 50}}
    assert chip_ratio("chip-1t/llvm-avx512", "slow-1t/llvm-avx2", table) == pytest.approx(4.0)  # no level: the peak
    table["chip-1t/llvm-avx512"] = {**table["chip-1t/llvm-avx512"], "reference_s": 0.002}
    assert chip_ratio("chip-1t/llvm-avx512", "slow-1t/llvm-avx2", table) == pytest.approx(4.0)  # one level: the peak
    table["slow-1t/llvm-avx2"]["reference_s"] = 0.003
    assert chip_ratio("chip-1t/llvm-avx512", "slow-1t/llvm-avx2", table) == pytest.approx(1.5)
    assert chip_ratio("chip-1t/llvm-avx512", "slow-1t/llvm-avx2", table, reference=False) == pytest.approx(4.0)
    assert chip_ratio("chip-2t/llvm-avx512", "chip-1t/llvm-avx512", table) == 1.0


def test_a_device_never_trained_on_is_predicted_on_its_anchor_and_moved_by_amdahls_law(tmp_path):
    from cdmpp.model.checkpoint import TrainedModel
    from cdmpp.model.training import finetune, fit

    rng = np.random.default_rng(1)
    two, one = "chip-2t/llvm-avx512", "chip-1t/llvm-avx512"
    train = []
    for _ in range(300):  # SYNTHETIC: 2-thread latency = 1e-9 s per operation of the first leaf, halved, + the second's
        p = parallel_program(rng)
        ops = np.exp2(p.leaf_features[:, FEATURE_NAMES.index("float_mad")]) - 1
        train.append(LabeledProgram(p, two, float(1e-9 * (ops[0] / 2 + ops[1]) + 2e-6)))
    model = fit(quick_config(epochs=3, ensemble=1, amdahl_transfer=True), train[:250], train[250:], device_table=TABLE)
    assert set(model.anchors) == {two} and model.anchors[two] > 0
    feats = [s.features for s in train[:40]]
    on_two = model.predict(feats, two)[0]
    mean, lo, hi = model.predict(feats, one)
    np.testing.assert_allclose(mean, amdahl_seconds(on_two, feats, 2, 1, model.anchors[two]), rtol=1e-6)
    assert np.all((lo <= mean) & (mean <= hi))
    np.testing.assert_allclose(model.predict(feats, [one] * 20 + [two] * 20)[0], [*mean[:20], *on_two[20:]], rtol=1e-6)
    model.save(tmp_path / "m")
    assert TrainedModel.load(tmp_path / "m").anchors == model.anchors

    shots = [LabeledProgram(s.features, one, 3 * s.seconds) for s in train[:16]]  # SYNTHETIC: 1-thread labels
    learned = model.on_anchors(shots)
    assert {s.device for s in learned} == {two}
    np.testing.assert_allclose([s.seconds for s in learned],
                               amdahl_seconds([s.seconds for s in shots], [s.features for s in shots], 1, 2,
                                              model.anchors[two]), rtol=1e-9)
    tuned = finetune(model, shots, steps=5)
    assert tuned.summary["finetune"]["devices"] == [one] and tuned.anchors == model.anchors


def test_tensor_core_work_is_learned_as_fp32_time_and_sped_up_by_each_gpus_tensor_cores():
    """The share f of a program's FLOPs on tensor cores runs tensor/FP32-peak times faster (Amdahl over two kinds
    of work): labels are learned as FP32-equivalent time, a GPU's prediction is sped up by its own tensor cores,
    and a move from a GPU without them to one with them speeds the tensor-core work up; other programs, and
    GPUs without ``tensor_gflops``, are left as they were."""
    from cdmpp.model.physics import fp32_equivalent, move, tensor_time_share

    table = {"slow/cuda-sm37": {**SPEC, "cores": 13, "peak_gflops": 4000},
             "mid/cuda-sm70": {**SPEC, "cores": 80, "peak_gflops": 16000, "tensor_gflops": 128000}}  # 8x
    rng = np.random.default_rng(2)
    plain, half, whole = (parallel_program(rng) for _ in range(3))
    plain.flops = half.flops = whole.flops = 1e9
    half.tensor_flops, whole.tensor_flops = 5e8, 1e9
    mid, slow = table["mid/cuda-sm70"], table["slow/cuda-sm37"]
    assert [tensor_time_share(p, mid) for p in (plain, half, whole)] == pytest.approx([1.0, 0.5 + 0.5 / 8, 1 / 8])
    assert tensor_time_share(whole, slow) == 1.0
    feats, secs = [plain, half, whole], np.array([1e-3, 1e-3, 1e-3])
    np.testing.assert_allclose(move(secs, feats, ["slow/cuda-sm37"] * 3, ["mid/cuda-sm70"] * 3, table, {}),
                               0.25 * secs * [1.0, 0.5625, 0.125])
    learned = fp32_equivalent([LabeledProgram(p, "mid/cuda-sm70", 1e-3) for p in feats], table)
    assert [s.seconds for s in learned] == pytest.approx([1e-3, 1e-3 / 0.5625, 8e-3])


def test_a_model_predicts_tensor_core_programs_as_fp32_code_sped_up_by_the_devices_tensor_cores():
    """Trained on a GPU without tensor cores, a model predicts a new GPU's tensor-core program as the same program
    without tensor-core work, sped up by the new GPU's tensor cores, through the anchor as any other program."""
    import dataclasses

    from cdmpp.model.physics import tensor_time_share
    from cdmpp.model.training import fit

    table = {"slow/cuda-sm37": {**SPEC, "cores": 13, "peak_gflops": 4000},
             "mid/cuda-sm70": {**SPEC, "cores": 80, "peak_gflops": 16000, "tensor_gflops": 128000}}
    rng = np.random.default_rng(3)
    train = []
    for _ in range(120):  # SYNTHETIC: latency 1e-9 s per operation of the first leaf
        p = parallel_program(rng)
        p.flops = float(np.exp2(p.leaf_features[0, FEATURE_NAMES.index("float_mad")]) - 1)
        train.append(LabeledProgram(p, "slow/cuda-sm37", 1e-9 * p.flops))
    model = fit(quick_config(epochs=2, ensemble=1, amdahl_transfer=True), train[:100], train[100:], device_table=table)
    fp32 = [s.features for s in train[:10]]
    tensor = [dataclasses.replace(p, tensor_flops=p.flops * 0.75) for p in fp32]
    share = np.array([tensor_time_share(p, table["mid/cuda-sm70"]) for p in tensor])
    assert np.all(share < 1)
    for got, want in zip(model.predict(tensor, "mid/cuda-sm70"), model.predict(fp32, "mid/cuda-sm70")):
        np.testing.assert_allclose(got, want * share, rtol=1e-6)
    np.testing.assert_allclose(model.predict(tensor, "slow/cuda-sm37")[0], model.predict(fp32, "slow/cuda-sm37")[0],
                               rtol=1e-6)
