"""Leave-one-chip-out: every device of a chip held out, twins grouped, the k-shot rows beside their peers."""

from __future__ import annotations

import json

import pytest

from tests.evaluation.conftest import OTHER

def test_chip_of_reads_the_spec_then_the_id():
    from cdmpp.evaluation.splits import chip_of

    assert chip_of("amd-epyc-znver4-1t/llvm-avx512", {"amd-epyc-znver4-1t/llvm-avx512": {"hardware": "Zen 4"}}) == "Zen 4"
    assert chip_of("amd-epyc-znver4-2t/llvm-avx2") == chip_of("amd-epyc-znver4-1t/llvm-avx512") == "amd-epyc-znver4"
    assert chip_of("nvidia-h100/cuda-sm90") == "nvidia-h100"


def test_a_held_out_chip_is_never_in_training_and_its_twins_are_grouped(three_devices, chip_table):
    from cdmpp.evaluation.splits import chips, leave_one_chip_out_split

    eligible = chips(three_devices, chip_table, min_programs=10)
    assert "fake chip A" in eligible and "fake chip B" in eligible
    sp = leave_one_chip_out_split(three_devices, "fake chip B", chip_table, k=8, sampler="random", seed=1)
    assert {p.device for p in sp.test} == {OTHER} and {p.device for p in sp.shots} == {OTHER}
    assert OTHER not in {p.device for p in sp.train + sp.val}
    test = {p.features.program_hash for p in sp.test}
    assert not test & {p.features.program_hash for p in sp.train + sp.val}  # twins grouped: new programs only
    assert not test & {p.features.program_hash for p in sp.shots}
    assert len(sp.shots) == 8 and sp.info["chip"] == "fake chip B"


def test_a_gpus_level_programs_are_not_test_programs_where_its_level_is_measured(three_devices, chip_table):
    """The level (``level_gflops``) is measured on a fixed tenth of the chip's programs: like the CPU reference
    kernels, they stay out of the test set that judges the transfer, and only where the level is in the spec."""
    from cdmpp.devices.reference import is_level_program
    from cdmpp.evaluation.splits import leave_one_chip_out_split

    before = leave_one_chip_out_split(three_devices, "fake chip B", chip_table, seed=1).test
    assert any(is_level_program(p.features.program_hash) for p in before)
    table = {**chip_table, OTHER: {**chip_table[OTHER], "level_gflops": 1000.0}}
    after = leave_one_chip_out_split(three_devices, "fake chip B", table, seed=1).test
    assert [p for p in before if not is_level_program(p.features.program_hash)] == after


def test_protocol_rows_and_the_mean_over_chips(three_devices, chip_table, tmp_path):
    """MECHANICS ONLY (relabeled fake chips): one seed writes, per chip and k, the pooled GBT, its shots-chosen
    variant, the shots-only GBT and the chip's own GBT; the summary averages the chips."""
    from cdmpp.evaluation.protocol import ProtocolOptions, run_seed
    from cdmpp.evaluation.summary import aggregate

    runs = tmp_path / "runs.jsonl"
    opts = ProtocolOptions(settings=("leave-one-chip-out",), methods=("pooled-gbt",), chip_ks=("0", "16"),
                           samplers=("random",), chips=("fake chip A", OTHER), runs=str(runs))
    for seed in (0, 1):
        run_seed(opts, seed, ds=three_devices, device_table=chip_table)
    rows = [json.loads(line) for line in runs.read_text().splitlines()]
    got = {(r["chip"], r["method"]) for r in rows}
    for chip in ("fake chip A", "fake chip B"):
        assert {(chip, "pooled GBT"), (chip, "pooled GBT k=16 (random)"), (chip, "shots-only GBT k=16 (random)"),
                (chip, "pooled GBT, spec transfer k=16 (random)"), (chip, "pooled GBT, spec transfer"), (chip, "chip's own GBT (reference)")} <= got
    summary = aggregate(str(runs), "test")["leave-one-chip-out"]
    both = summary["shots-only GBT k=16 (random) @ every chip"]
    per = [summary[f"shots-only GBT k=16 (random) @ {c}"]["mape"] for c in ("fake chip A", "fake chip B")]
    assert both["seeds"] == 2 and both["mape"] == pytest.approx(sum(per) / 2)
    from cdmpp.evaluation.summary import chips_markdown

    table = chips_markdown({"leave-one-chip-out": summary}, label="pooled GBT", sampler="random")
    assert "**every chip**" in table and "**fake chip B** (the chip's own GBT" in table
    assert sum(line.startswith("| 16 |") for line in table.splitlines()) == 3  # every chip + two chips


def test_gpu_chips_are_averaged_apart_from_cpu_chips(tmp_path):
    """A GPU's error is of another scale: "@ every chip" averages the CPU chips (rows without a kind are a CPU's,
    as before GPUs were held out), "@ every GPU chip" the GPUs, and the markdown shows both."""
    from cdmpp.evaluation.summary import chips_markdown
    from cdmpp.evaluation.summary import aggregate

    runs = tmp_path / "runs.jsonl"
    mape = {"cpu-a": 0.4, "cpu-b": 0.5, "gpu-a": 1.2, "gpu-b": 0.8}
    with runs.open("w") as f:
        for seed in (0, 1):
            for chip, m in mape.items():
                kind = {"kind": "gpu"} if chip.startswith("gpu") else ({} if chip == "cpu-a" else {"kind": "cpu"})
                for method in ("cdmpp", "pooled GBT"):
                    f.write(json.dumps(dict(seed=seed, setting="leave-one-chip-out", method=method, chip=chip, k=0,
                                            programs=10, **kind, metrics=dict(mape=m, spearman=0.5))) + "\n")
    summary = aggregate(str(runs), "test")["leave-one-chip-out"]
    assert summary["cdmpp @ every chip"]["mape"] == pytest.approx(0.45)
    assert summary["cdmpp @ every GPU chip"]["mape"] == pytest.approx(1.0)
    assert summary["cdmpp @ every GPU chip"]["chips"] == ["gpu-a", "gpu-b"]
    table = chips_markdown({"leave-one-chip-out": summary})
    assert "**every chip**" in table and "**every GPU chip**" in table


def test_a_chip_can_be_trained_on_its_own_kind_of_code_alone():
    from types import SimpleNamespace

    from cdmpp.evaluation.chips import of_chips_kind

    devices = ["nvidia-h100/cuda-sm90", "nvidia-h200/cuda-sm90", "amd-epyc-znver4-1t/llvm-avx512",
               "amd-epyc-znver3-1t/llvm-avx2"]
    programs = [SimpleNamespace(device=d, i=i) for i in range(3) for d in devices]
    gpu = of_chips_kind(SimpleNamespace(programs=programs), "nvidia-h200", {})
    assert {p.device for p in gpu} == set(devices[:2]) and len(gpu) == 6
    cpu = of_chips_kind(programs, "amd-epyc-znver3", {})
    assert {p.device for p in cpu} == set(devices[2:])


def test_an_unknown_chip_is_a_clear_error(three_devices, chip_table):
    from cdmpp.evaluation.chips import held_out_chips
    from cdmpp.evaluation.protocol import ProtocolOptions

    with pytest.raises(ValueError, match="unknown chip.*chips in the data"):
        held_out_chips(ProtocolOptions(chips=("no such chip",)), three_devices, chip_table)


def test_shots_of_a_chip_with_two_devices_come_from_both():
    """The embedding is device-free: over a pool holding two thread counts' copies of the same programs, KMeans
    once took every shot from one device (Zen 3 held out, 416 of 416 at 1 thread). Each device's share now
    comes from its own programs, in proportion to its share of the pool; one device is as before."""
    from types import SimpleNamespace

    import numpy as np

    from cdmpp.evaluation.splits import choose_shots, shots_by_device

    points = np.random.default_rng(0).normal(size=(60, 4))
    pool = [SimpleNamespace(device=d) for d in ["a/1t"] * 60 + ["a/2t"] * 60]
    embedding = np.vstack([points, points])
    assert choose_shots(pool, 12, "kmeans", 0, embedding).max() < 60  # the failure: one device only
    for sampler in ("kmeans", "random"):
        chosen = shots_by_device(pool, 12, sampler, 0, embedding)
        assert sum(i < 60 for i in chosen) == 6 and sum(i >= 60 for i in chosen) == 6
    one = pool[:60]
    assert shots_by_device(one, 5, "kmeans", 0, points) == set(choose_shots(one, 5, "kmeans", 0, points).tolist())


def test_each_device_of_a_chip_gets_the_choice_fitted_on_its_own_shots():
    from types import SimpleNamespace

    import numpy as np

    from cdmpp.evaluation.chips import by_device

    shots = [SimpleNamespace(device=d, seconds=s) for d, s in [("a/1t", 1.0), ("a/1t", 1.0), ("a/2t", 5.0)]]
    test = [SimpleNamespace(device=d) for d in ("a/2t", "a/1t", "a/2t")]

    class Mean:  # a "choice" that predicts its shots' mean seconds
        def __init__(self, s):
            self.value = float(np.mean([p.seconds for p in s]))

        def describe(self):
            return f"mean {self.value}"

    (got, none), described = by_device(Mean, shots, test, lambda c, ps: (np.full(len(ps), c.value), None))
    assert got.tolist() == [5.0, 1.0, 5.0] and none is None
    assert described == "a/1t: mean 1.0; a/2t: mean 5.0"
