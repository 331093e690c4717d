"""The reference kernels (``cdmpp.devices.reference``): a chip's level measured on fixed tensor programs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cdmpp.devices import reference

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "datasets" / "devices.json"
DATASET = ROOT / "datasets" / "measurements"


def test_the_kernels_are_sixteen_distinct_programs_with_their_tasks():
    tasks = {k["task"] for k in reference.kernels()}
    assert len(reference.kernel_hashes()) == 16 == len(tasks)
    assert all(k["trace"] for k in reference.kernels())
    level = {h: 2.0 for h in reference.kernel_hashes()}
    assert reference.geometric_mean_s(level) == pytest.approx(2.0)
    del level[next(iter(level))]
    assert reference.geometric_mean_s(level) is None  # a level over a subset would not compare


@pytest.mark.slow
def test_the_kernels_replay_and_run_here(tvm):
    """Two of the kernels (the shortest) built from their traces are the programs they name, and run. Measured
    without waiting for a quiet machine (the suite's other worker is busy: waiting and rerunning cost ~2 minutes
    there); this checks that they run, not how fast."""
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.program import tvm_env

    short = frozenset({"80a9df21ce7f87cd", "d12162592638e89f"})
    got = reference.measure_reference_s(tvm_env.host_mcpu(), cfg=MeasureConfig(quiet_share=1.0), only=short)
    assert set(got) == short
    assert all(math.isfinite(s) and 0 < s < 1 for s in got.values())


@pytest.mark.skipif(not DATASET.is_dir(), reason="no dataset in this checkout")
def test_the_table_levels_are_the_labels_of_the_chips_one_thread_device(tmp_path, capsys):
    """``cdmpp devices reference`` fills a chip's devices (every thread count) from its 1-thread labels: the
    table's Zen 4 entries hold what the dataset's labels give."""
    from cdmpp.cli import main

    shipped = {d["id"]: d for d in json.loads(TABLE.read_text())}
    zen4 = [shipped[i] for i in ("amd-epyc-znver4-1t/llvm-avx512", "amd-epyc-znver4-2t/llvm-avx512",
                                 "amd-epyc-znver4-2t/llvm-avx2")]
    bare = [{k: v for k, v in d.items() if k != "reference_s"} for d in zen4]
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(bare))
    assert main(["devices", "reference", "--table", str(path), "--dataset", str(DATASET)]) == 0
    filled = {d["id"]: d for d in json.loads(path.read_text())}
    for d in zen4[:2]:
        assert filled[d["id"]]["reference_s"] == pytest.approx(d["reference_s"], rel=1e-5)
    assert "reference_s" not in filled["amd-epyc-znver4-2t/llvm-avx2"]  # no 1-thread AVX2 device of the chip
    assert "amd-epyc-znver4-2t/llvm-avx2" in capsys.readouterr().err


def test_a_reference_level_must_be_positive_seconds():
    from cdmpp.devices.spec import DeviceSpec
    from cdmpp.devices.table import spec_problems

    d = json.loads(TABLE.read_text())[0]
    assert not spec_problems(d)
    assert any("reference_s" in p for p in spec_problems(dict(d, reference_s=-1.0)))
    assert any("reference_s" in p for p in spec_problems(dict(d, reference_s="fast")))
    d.pop("reference_s", None)
    assert "reference_s" not in DeviceSpec.from_dict(d).to_dict()  # unmeasured: no field, as before
    assert any("level_gflops" in p for p in spec_problems(dict(d, level_gflops=0)))
    assert "level_gflops" not in DeviceSpec.from_dict(d).to_dict()
    assert any("tensor_gflops" in p for p in spec_problems(dict(d, tensor_gflops=-5.0)))
    assert "tensor_gflops" not in DeviceSpec.from_dict(d).to_dict()
    assert DeviceSpec.from_dict(dict(d, tensor_gflops=112000.0)).specs()["tensor_gflops"] == 112000.0


def test_a_gpus_level_is_the_flops_its_level_programs_reach(tmp_path, capsys):
    """``cdmpp devices reference --level GPU``: the 90th percentile of FLOP/s over the GPU's level programs (a
    fixed tenth by hash) in the dataset goes into its spec; a CPU, or too few programs, is a clear error."""
    from cdmpp.cli import main
    from cdmpp.devices.reference import is_level_program

    shipped = {d["id"]: d for d in json.loads(TABLE.read_text())}
    gpu, cpu = "nvidia-k80/cuda-sm37", "amd-epyc-znver4-1t/llvm-avx512"
    path = tmp_path / "devices.json"
    path.write_text(json.dumps([{k: v for k, v in shipped[gpu].items() if k != "level_gflops"}, shipped[cpu]]))
    hashes = [f"{i:016x}" for i in range(2000)]
    level = [h for h in hashes if is_level_program(h)][:100]
    assert len(level) == 100
    lines = [{"id": f"{gpu}|t|{h}", "device": gpu, "task": "t", "program_hash": h, "flops": 1e9 * (j + 1),
              "seconds": [1.0], "error": None} for j, h in enumerate(level)]
    lines += [{"id": f"{gpu}|t|{h}", "device": gpu, "task": "t", "program_hash": h, "flops": 1e15, "seconds": [1.0],
               "error": None} for h in hashes[:300] if not is_level_program(h)]  # not level programs: no say
    data = tmp_path / "data"
    data.mkdir()
    (data / "nvidia-k80_cuda-sm37.active.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["devices", "reference", "--table", str(path), "--dataset", str(data), "--level", gpu]) == 0
    filled = {d["id"]: d for d in json.loads(path.read_text())}
    assert filled[gpu]["level_gflops"] == pytest.approx(91.0)  # the 90th percentile of 1..100 GFLOP/s
    assert main(["devices", "reference", "--table", str(path), "--dataset", str(data), "--level", cpu]) == 2
    assert "not a GPU" in capsys.readouterr().err
    (data / "nvidia-k80_cuda-sm37.active.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:40]))
    assert main(["devices", "reference", "--table", str(path), "--dataset", str(data), "--level", gpu]) == 2
    assert "fewer than 50" in capsys.readouterr().err
