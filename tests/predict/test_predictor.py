"""``Predictor``: out-of-distribution flags, programs with nothing to predict, untrusted text in the sandbox."""

from pathlib import Path

import numpy as np
import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.program.features import N_FEATURES, featurize
from cdmpp.program.inputs import ProgramError
from cdmpp.model.kinds import is_checkpoint
from tests.attacks import IMP, SAMPLE, TMP, marker_path, tvmscript_with
from tests.programs import concat_and_empty

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


def test_loop_that_never_runs_gives_no_leaf_and_predictor_says_why(tvm, predictor, device):
    _, never_runs, negative = concat_and_empty(tvm)
    feats = featurize(never_runs)
    assert feats.n_leaves == 0 and feats.leaf_features.shape == (0, N_FEATURES)
    assert featurize(negative).n_leaves == 1  # a negative extent runs nothing either; the other loop stays
    with pytest.raises(ProgramError, match="computes nothing") as e:
        predictor.predict([never_runs], device)
    assert e.value.errors[0]["index"] == 0


def test_predictor_parses_text_in_the_sandbox_unless_trusted(predictor, device):
    """``Predictor.predict`` on text from elsewhere: parsed in a sandbox worker, so the injected Python
    writes nothing; ``trusted=True`` (text you wrote) parses in process, with the same answer."""
    from cdmpp.program.inputs import ProgramError

    marker = marker_path(TMP, "predictor")
    with pytest.raises(ProgramError) as e:
        predictor.predict([SAMPLE, tvmscript_with(f'{IMP}("pathlib").Path("{marker}").write_text("x")')], device)
    assert [x["index"] for x in e.value.errors] == [1] and "not allowed" in e.value.errors[0]["reason"]
    assert not Path(marker).exists()
    sandboxed, = predictor.predict([SAMPLE], device)
    in_process, = predictor.predict([SAMPLE], device, trusted=True)
    assert abs(sandboxed.seconds - in_process.seconds) <= 1e-6 * in_process.seconds


def test_ood_flags_in_prediction(predictor, device, sampled):
    """Each prediction says why it may lie outside what the model was trained on: a device without
    training data, features outside the training range."""
    import copy

    from cdmpp.model.transforms import FeatureNormalizer
    from cdmpp.predict.predictor import ASSEMBLY_NOT_BUILT, DEVICE_UNTRAINED, FEATURES_OUT_OF_RANGE, Predictor
    from cdmpp.program.assembly import N_COUNTS
    from cdmpp.program.features import featurize

    feats = [featurize(s.mod) for s in sampled["matmul"][:3]]
    model = copy.copy(predictor.model_for(device))
    norm = FeatureNormalizer().fit(np.concatenate([f.leaf_features for f in feats[:2]]))
    model.feature_normalizer = norm  # a model "trained" on two programs, on one device only
    others = [d for d in predictor.devices() if d != device]
    model.summary = {**predictor.model.summary, "train_devices": [device]}
    model.config = {**model.config, "assembly_counts": False}  # first a model that reads no built programs' counts
    p = Predictor(model)
    assert [x.ood for x in p.predict_features(feats[:2], device, "llvm")] == [(), ()]
    assert all(x.in_distribution for x in p.predict_features(feats[:2], device, "llvm"))
    far = copy.copy(feats[0])
    far.leaf_features = feats[0].leaf_features * 4 + 1  # every value beyond the training maximum,
    far.leaf_features[:, 49:57] = feats[0].leaf_features[:, 49:57]  # but still a CPU program (no GPU threads)
    assert p.predict_features([far], device, "llvm")[0].ood == (FEATURES_OUT_OF_RANGE,)
    if others:
        assert DEVICE_UNTRAINED in p.predict_features(feats[:1], others[0], "llvm")[0].ood
    model.config = {**model.config, "assembly_counts": True}  # a model reading built programs' counts
    assert p.predict_features(feats[:1], device, "llvm")[0].ood == (ASSEMBLY_NOT_BUILT,)
    built = copy.copy(feats[0])
    built.asm = np.ones(N_COUNTS)
    assert p.predict_features([built], device, "llvm")[0].ood == ()  # built for its target: no flag
    model.config = {**model.config, "assembly_counts": False}
    # a checkpoint without the range still flags values a constant training column never had
    del norm.min_, norm.max_
    const = int(np.nonzero(norm.inv_scale_ == 0)[0][0])
    odd = copy.copy(feats[0])
    odd.leaf_features = feats[0].leaf_features.copy()
    odd.leaf_features[:, const] += 5
    assert p.predict_features([odd], device, "llvm")[0].ood == (FEATURES_OUT_OF_RANGE,)


def test_a_program_for_another_target_kind_is_an_error_not_a_number(predictor, device, sampled):
    """A CPU schedule asked on a GPU (or with a cuda target on a CPU) gets a ProgramError naming every item,
    not a latency no device could reach (issue 52)."""
    from cdmpp.predict.predictor import target_kind_problem
    from cdmpp.program.features import featurize
    from cdmpp.program.inputs import ProgramError

    feats = [featurize(s.mod) for s in sampled["matmul"][:2]]
    with pytest.raises(ProgramError, match="does not run on") as e:
        predictor.predict_features(feats, device, "cuda")
    assert [x["index"] for x in e.value.errors] == [0, 1]
    assert "CPU schedule cannot run on a CUDA device" in target_kind_problem(feats[0], "cuda")
    assert target_kind_problem(feats[0], "llvm") is None
    gpu = [d for d in predictor.devices() if predictor.target_kind(d) == "cuda"]
    if gpu:
        with pytest.raises(ProgramError, match="binds no GPU threads"):
            predictor.predict_features(feats, gpu[0])


def test_a_device_of_the_table_the_model_never_saw_is_predicted_from_its_specs(predictor, device, sampled, tmp_path):
    """``Predictor`` reads the device table: a device described there (``cdmpp devices add``) is answered,
    flagged ``device_untrained``; one found nowhere is an ``UnknownDeviceError`` that says how to add it."""
    import copy
    import json

    from cdmpp.devices.table import DeviceTable
    from cdmpp.predict.predictor import DEVICE_UNTRAINED, Predictor, UnknownDeviceError
    from cdmpp.program.features import featurize

    spec = DeviceTable().get(device).to_dict()
    spec.update(id="made-up-chip-8t/llvm-avx2", hardware="a made-up chip", threads=8, cores=8,
                peak_gflops=4 * spec["peak_gflops"], relation="")
    path = tmp_path / "devices.json"
    path.write_text(json.dumps([spec]))
    model = copy.deepcopy(predictor.model)
    p = Predictor(model, devices=path)
    assert "made-up-chip-8t/llvm-avx2" in p.devices()
    feats = [featurize(s.mod) for s in sampled["matmul"][:2]]
    got = p.predict_features(feats, "made-up-chip-8t/llvm-avx2")
    assert all(np.isfinite(x.seconds) and x.seconds > 0 and DEVICE_UNTRAINED in x.ood for x in got)
    with pytest.raises(UnknownDeviceError, match="cdmpp devices add"):
        p.predict_features(feats, "no-such-device-1t/llvm-avx2")


def test_a_new_chip_is_moved_by_its_reference_kernels_level(predictor, sampled, tmp_path):
    """A chip the model never saw, with its reference kernels measured (``reference_s``), is predicted on the
    anchor and moved by the two chips' reference levels, not their peaks, also with a model saved before the
    anchor's level was in the table (it is copied from the table: a measurement of the chip)."""
    import copy
    import json

    from cdmpp.devices.table import DeviceTable
    from cdmpp.predict.predictor import Predictor
    from cdmpp.program.features import featurize

    zen4 = DeviceTable().get("amd-epyc-znver4-1t/llvm-avx512").to_dict()
    assert zen4["reference_s"] > 0
    new = dict(zen4, id="made-up-chip-1t/llvm-avx512", hardware="a made-up chip", relation="",
               peak_gflops=4 * zen4["peak_gflops"], reference_s=3 * zen4["reference_s"])
    path = tmp_path / "devices.json"
    path.write_text(json.dumps([zen4, new]))
    model = copy.deepcopy(predictor.model_for("amd-epyc-znver4-1t/llvm-avx512"))
    for spec in model.device_specs.table.values():
        spec.pop("reference_s", None)
    p = Predictor(model, devices=path)
    feats = [featurize(s.mod) for s in sampled["matmul"][:3]]
    on_zen4 = np.array([x.seconds for x in p.predict_features(feats, "amd-epyc-znver4-1t/llvm-avx512")])
    on_new = np.array([x.seconds for x in p.predict_features(feats, "made-up-chip-1t/llvm-avx512")])
    np.testing.assert_allclose(on_new, 3 * on_zen4, rtol=1e-5)


def test_out_of_range_names_the_inputs_and_fires_only_where_the_prediction_moves(predictor, device, sampled):
    """A value beyond the training range is flagged, with its column named, only when holding it at the
    range moves the prediction by more than RISK_FACTOR (issue 52: 99.7 % of foreign programs were flagged)."""
    import copy

    from cdmpp.predict.predictor import FEATURES_OUT_OF_RANGE, RISK_FACTOR
    from cdmpp.program.features import FEATURE_NAMES

    f = featurize(sampled["matmul"][0].mod)
    norm = predictor.model_for(device).feature_normalizer
    base = predictor.predict_features([f], device)[0].seconds
    moved = []
    for col in range(N_FEATURES):
        if col in range(49, 57):  # GPU binding columns: a CPU program stays a CPU program
            continue
        g = copy.copy(f)
        g.leaf_features = f.leaf_features.copy()
        g.leaf_features[:, col] = norm.max_[col] + 10.0 * (1.0 + abs(norm.max_[col]))
        p = predictor.predict_features([g], device)[0]
        held = predictor.predict_features([f], device)[0].seconds  # the column at the range ~ the original
        if FEATURES_OUT_OF_RANGE in p.ood:
            assert p.out_of_range == (FEATURE_NAMES[col],)
            moved.append(col)
        else:
            assert p.out_of_range == () and held == base
    assert moved, "some column must matter"
    assert len(moved) < N_FEATURES - 8, "a column the model ignores must not flag"
    assert RISK_FACTOR > 1


def test_a_device_is_resolved_once_and_its_target_kind_comes_from_the_table(predictor, device, sampled, tmp_path):
    """Issue 57: the kind is the table's target, whatever the id says, and a device is resolved once for
    all the calls that use it (the HTTP path checked one device four times per request)."""
    import copy
    import json

    from cdmpp.devices.table import DeviceTable
    from cdmpp.predict.predictor import Device, Predictor
    from cdmpp.program.features import featurize

    table = DeviceTable()
    cpu = table.get(device).to_dict()
    cpu.update(id="odd-chip-2t/cuda-looking-id", hardware="a chip named oddly", relation="")
    gpu = table.get("nvidia-h100/cuda-sm90").to_dict()
    gpu.update(id="odd-gpu/sm90", hardware="a GPU named oddly", relation="")
    path = tmp_path / "devices.json"
    path.write_text(json.dumps([cpu, gpu]))
    p = Predictor(copy.deepcopy(predictor.model), devices=path)
    calls = []
    resolve = p._devices._resolve
    p._devices._resolve = lambda d: calls.append(d) or resolve(d)
    assert p.target_kind("odd-chip-2t/cuda-looking-id") == "llvm" and p.target_kind("odd-gpu/sm90") == "cuda"
    feats = [featurize(s.mod) for s in sampled["matmul"][:2]]
    dev = p.device("odd-chip-2t/cuda-looking-id")
    assert isinstance(dev, Device) and dev.kind == "llvm" and not dev.trained
    for _ in range(3):
        p.predict_features(feats, "odd-chip-2t/cuda-looking-id", "llvm")
        p.predict_features(feats, dev)
    assert calls == ["odd-chip-2t/cuda-looking-id", "odd-gpu/sm90"]
    assert p.device(dev) is dev


def test_a_model_that_reads_the_builds_builds_each_program_it_is_asked(sampled):
    """A model trained with the built programs' instruction counts (``assembly_counts``) gets them when it predicts:
    each asked program is built for the device's target, in this process (a TVM object) or in the sandbox worker
    that parses it (text), with the same counts, and its features are cached per build; a model without them builds
    nothing. SYNTHETIC training programs (the model's numbers are not the point), real asked programs."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.model.training import fit
    from cdmpp.predict.predictor import ASSEMBLY_NOT_BUILT, Predictor
    from cdmpp.program.assembly import N_COUNTS, build_counts
    from cdmpp.records.dataset import LabeledProgram
    from tests.model.synthetic import FakeProgram, quick_config

    dev, table, rng = "amd-epyc-znver4-2t/llvm-avx512", DeviceTable(), np.random.default_rng(0)
    train = [LabeledProgram(FakeProgram(np.abs(rng.normal(size=(2, N_FEATURES))).astype(np.float32), np.arange(2),
                                        1e6, asm=rng.integers(1, 200, N_COUNTS).astype(float)),
                            dev, float(rng.uniform(1e-4, 1e-3))) for _ in range(80)]
    p = Predictor(fit(quick_config(epochs=1, ensemble=1, assembly_counts=True), train[:60], train[60:],
                      device_table=table))
    assert p.build_target(dev) == table.get(dev).target
    mod = sampled["matmul"][1].mod
    here, = p.predict([mod], dev)
    there, = p.predict([mod.script()], dev)  # text from elsewhere: parsed and built in a sandbox worker
    assert ASSEMBLY_NOT_BUILT not in here.ood and ASSEMBLY_NOT_BUILT not in there.ood
    assert there.seconds == pytest.approx(here.seconds, rel=1e-5)
    built = p.featurize([mod], "llvm", build=p.build_target(dev))[0]
    assert np.array_equal(built.asm, build_counts(mod, table.get(dev).make_target())[0])
    assert p.featurize([mod], "llvm")[0].asm is None  # the same program without a build: its own cache entry
    plain = Predictor(fit(quick_config(epochs=1, ensemble=1, assembly_counts=False), train[:60], train[60:],
                          device_table=table))
    assert plain.build_target(dev) is None
