"""Instruction counts of a built program (cdmpp.program.assembly): what they count, where they are kept, and that
a dataset gives each measured program its device's build's counts."""

from __future__ import annotations

import numpy as np
import pytest

from cdmpp.program.assembly import (COUNT_NAMES, N_COUNTS, N_INPUTS, AssemblyCounts, build_counts, build_key,
                                    count_inputs, instruction_counts)

ASM = """\t.text
main:
\tpushq\t%rbp
\tmovq\t%rsp, %rbp
.LBB0_1:
\tvbroadcastss\t(%rdi), %zmm1
\tvfmadd231ps\t(%rsi,%rax), %zmm1, %zmm0
\tvmovups\t%zmm0, -64(%rsp)
\taddq\t$64, %rax
\tcmpq\t%rdx, %rax
\tjne\t.LBB0_1
.LBB0_2:
\tvaddss\t%xmm1, %xmm0, %xmm0
\tcall\tfoo
\tretq
"""


def test_counts_classes_and_the_innermost_loop():
    whole, inner = instruction_counts(ASM)
    at = {n: i for i, n in enumerate(COUNT_NAMES)}
    assert whole.shape == inner.shape == (N_COUNTS,)
    assert whole[at["all"]] == 11 and whole[at["blocks"]] == 2
    assert whole[at["fma_zmm"]] == 1 and whole[at["broadcast"]] == 1 and whole[at["mov_zmm"]] == 1
    assert whole[at["spill"]] == 1 and whole[at["arith_scalar"]] == 1 and whole[at["call"]] == 1
    assert whole[at["branch"]] == 1 and whole[at["int"]] == 2
    # the loop .LBB0_1 .. jne: six instructions, the FMA inside, the scalar add and the call outside
    assert inner[at["all"]] == 6 and inner[at["fma_zmm"]] == 1 and inner[at["arith_scalar"]] == 0
    assert inner[at["blocks"]] == 1  # one innermost loop


def test_inputs_and_build_key():
    whole, _ = instruction_counts(ASM)
    x = count_inputs(whole)
    assert x.shape == (N_INPUTS,) and np.all(np.isfinite(x)) and x[0] == pytest.approx(np.log1p(11))
    assert np.isnan(count_inputs(None)).all()
    assert build_key({"kind": "llvm", "num-cores": 2, "mcpu": "znver4"}) == "llvm-znver4"
    assert build_key({"kind": "llvm", "num-cores": 1, "mcpu": "znver4"}) == "llvm-znver4"  # threads share a build
    assert build_key({"kind": "llvm", "mcpu": "x86-64-v3"}) != "llvm-znver4"
    assert build_key({"kind": "llvm", "mcpu": "znver5"}) == "llvm-znver4"  # measured: the same counts (SAME_COUNTS)
    assert build_key({"kind": "llvm", "mcpu": "rocketlake"}) == "llvm-rocketlake"  # not: ymm where znver4 takes zmm


def test_the_count_folder(tmp_path):
    (tmp_path / "llvm-znver4").mkdir()
    c = np.arange(2 * N_COUNTS, dtype=float).reshape(2, N_COUNTS)
    np.savez(tmp_path / "llvm-znver4" / "part-0.npz", hashes=np.array(["a", "b"]), counts=c)
    np.savez(tmp_path / "llvm-znver4" / "part-1.npz", hashes=np.array(["b"]), counts=c[:1] + 100)
    table = AssemblyCounts(tmp_path)
    assert np.array_equal(table.get("b", "llvm-znver4"), c[1])  # the first file's counts of a program built twice
    assert table.get("a", "llvm-x86-64-v3") is None and table.get("z", "llvm-znver4") is None
    np.savez(tmp_path / "llvm-znver4" / "part-2.npz", hashes=np.array(["c"]), counts=np.zeros((1, 3)))
    with pytest.raises(ValueError, match="expected"):
        AssemblyCounts(tmp_path).get("a", "llvm-znver4")


def test_a_real_build_counts_instructions(sampled, tvm):
    counts, inner = build_counts(sampled["matmul"][0].mod,
                                 tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2}))
    at = {n: i for i, n in enumerate(COUNT_NAMES)}
    assert counts.shape == inner.shape == (N_COUNTS,) and counts[at["all"]] > 20 and counts[at["blocks"]] >= 1
    assert 0 < inner[at["all"]] <= counts[at["all"]]  # a matmul's innermost loop is part of the module


def test_a_dataset_attaches_its_devices_counts(real, tmp_path):
    """The counts folder's programs carry their counts (``ProgramFeatures.asm``) on the device whose build they are;
    the others none."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable
    from tests.data import REAL_DEVICE, TASKS

    folder, ds = real
    hashes = sorted({p.features.program_hash for p in ds.programs})[:5]
    key = build_key(DeviceTable().get(REAL_DEVICE).target)
    (tmp_path / key).mkdir()
    counts = np.ones((len(hashes), N_COUNTS))
    np.savez(tmp_path / key / "part-0.npz", hashes=np.array(hashes), counts=counts)
    again = load_dataset(str(folder), TaskTable.load(str(TASKS)), limit=len(ds), progress=False, assembly_dir=str(tmp_path))
    built = [p for p in again.programs if p.features.asm is not None]
    assert built and {p.features.program_hash for p in built} <= set(hashes)
    assert all(p.device == REAL_DEVICE for p in built)
    assert all(p.features.asm is None for p in ds.programs)  # the folder without counts beside it


def test_building_a_devices_programs_resumes(tmp_path):
    """``cdmpp assembly``: a device's labelled programs built for its target, counted, kept (a search's candidate
    last: the evaluation's splits leave it out); a second run builds none of them again."""
    import gzip
    import itertools
    import json

    from cdmpp.devices.table import DeviceTable
    from cdmpp.records.builds import build_device
    from cdmpp.records.store import slug
    from tests.data import REAL_DEVICE, ROOT, TASKS

    parts = sorted((ROOT / "datasets" / "measurements").glob(f"{slug(REAL_DEVICE)}.part-*.jsonl.gz"))
    if not parts or not TASKS.exists():
        pytest.skip("no measurements of the test device")
    data = tmp_path / "measurements"
    data.mkdir()
    with gzip.open(parts[0], "rt") as f:
        lines = list(itertools.islice(f, 3))
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "search": {"strategy": "evolutionary"}}) + "\n"
    (data / f"{slug(REAL_DEVICE)}.active.jsonl").write_text("".join(lines))
    root = tmp_path / "assembly"
    assert build_device(REAL_DEVICE, str(data), str(root), str(TASKS), progress=False) == 3
    key = build_key(DeviceTable().get(REAL_DEVICE).target)
    table = AssemblyCounts(root).table(key)
    assert len(table) == 3 and all(c[0] > 0 for c in table.values())
    with np.load(next((root / key).glob("build-*.npz"))) as z:  # the innermost loops' counts kept beside
        assert z["inner"].shape == z["counts"].shape and (z["inner"][:, 0] <= z["counts"][:, 0]).all()
        assert z["hashes"].tolist()[-1] == first["program_hash"]
    assert build_device(REAL_DEVICE, str(data), str(root), str(TASKS), progress=False) == 0
    # built before the innermost loops' counts were kept: ``--innermost`` builds them again for those counts only
    path = next((root / key).glob("build-*.npz"))
    with np.load(path) as z:
        kept, inner = dict(z), z["inner"].copy()
    np.savez(path, **{**kept, "inner": np.full_like(inner, np.nan)})
    assert AssemblyCounts(root).inner_table(key) == {}
    assert build_device(REAL_DEVICE, str(data), str(root), str(TASKS), progress=False, innermost=True) == 3
    with np.load(next((root / key).glob("innermost-*.npz"))) as z:
        assert "counts" not in z.files and np.array_equal(z["inner"], inner)
    assert np.array_equal(AssemblyCounts(root).table(key)[first["program_hash"]], kept["counts"][-1])
    assert build_device(REAL_DEVICE, str(data), str(root), str(TASKS), progress=False, innermost=True) == 0
    with pytest.raises(ValueError, match="x86 LLVM"):
        build_device("nvidia-h100/cuda-sm90", str(data), str(root), str(TASKS))


def test_a_program_that_does_not_build_keeps_its_features(sampled, tvm):
    """``with_counts``: the counts of a build where it succeeds, the features as they were (not built) where not;
    a worker's counts are checked as untrusted input."""
    from cdmpp.program.assembly import with_counts
    from cdmpp.program.features import featurize
    from cdmpp.sandbox.wire import decode_counts

    mod = sampled["matmul"][0].mod
    f = featurize(mod)
    target = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
    assert with_counts(f, mod, target).asm.shape == (N_COUNTS,) and f.asm is None
    assert with_counts(f, "not a module", target) is f
    assert decode_counts(None) is None and decode_counts([1] * N_COUNTS).shape == (N_COUNTS,)
    for bad in ([1] * (N_COUNTS - 1), [float("nan")] * N_COUNTS, [-1] * N_COUNTS, [0.5] * N_COUNTS, "x"):
        with pytest.raises(ValueError, match="instruction counts"):
            decode_counts(bad)
