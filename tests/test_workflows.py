"""Train, sample, fine-tune: checkpoints from a dataset."""

from __future__ import annotations

import numpy as np
import pytest

from tests.data import ROOT, TASKS


@pytest.mark.slow
def test_train_and_sample_workflow(real, tiny_recipe, tmp_path):
    from cdmpp.model.checkpoint import TrainedModel
    from cdmpp.workflows import sample_ids, train_checkpoint

    folder, real = real
    out = tmp_path / "model"
    train_checkpoint(tiny_recipe, str(folder), str(out), str(TASKS), str(ROOT / "datasets" / "devices.json"),
                     max_minutes=0.1, limit=120, progress=False)
    s = TrainedModel.load(out).summary
    assert s["model_version"].startswith("cdmpp-") and s["data"]["programs"] == 120
    assert not (out / "train-state.pt").exists()  # the run's saved state goes once the checkpoint is written
    assert all("target" in spec for spec in s["devices"].values())
    device = real.devices()[0]
    assert len(sample_ids(5, str(folder), device, task_table=str(TASKS), limit=120)) == 0  # all measured there already
    ids = sample_ids(5, str(folder), "some-other-device", str(out), task_table=str(TASKS), limit=120)
    assert len(ids) == len(set(ids)) == 5


@pytest.mark.slow
def test_cpu_and_gpu_programs_train_one_model_per_kind(tiny_recipe, tmp_path):
    """Real measurements of a CPU and of a GPU: `cdmpp train` fits a part per kind of code on that kind's
    programs alone, saved as one checkpoint that the predictor answers from, each device by its kind's part."""
    import shutil

    from cdmpp.model.kinds import KindModels, load_model
    from cdmpp.predict.predictor import Predictor
    from cdmpp.records.dataset import load_dataset
    from cdmpp.workflows import train_checkpoint
    from cdmpp.zoo.tasks import TaskTable

    parts = [ROOT / "datasets" / "measurements" / f for f in ("amd-epyc-znver4-1t_llvm-avx512.part-0004.jsonl.gz",
                                                               "nvidia-h100_cuda-sm90.part-0002.jsonl.gz")]
    if not all(p.exists() for p in parts):
        pytest.skip("the CPU and GPU parts this test reads are not in the checkout")
    folder = tmp_path / "data"
    folder.mkdir()
    for p in parts:
        shutil.copy(p, folder)
    out = tmp_path / "model"
    train_checkpoint(tiny_recipe, str(folder), str(out), str(TASKS), str(ROOT / "datasets" / "devices.json"),
                     max_minutes=0.1, progress=False)
    model = load_model(out)
    assert isinstance(model, KindModels) and sorted(model.parts) == ["cuda", "llvm"]
    assert model.parts["cuda"].summary["train_devices"] == ["nvidia-h100/cuda-sm90"]
    assert model.parts["llvm"].summary["train_devices"] == ["amd-epyc-znver4-1t/llvm-avx512"]
    assert model.summary["model_version"].startswith("cdmpp-") and model.summary["data"]["programs"] > 200
    assert set(model.parts["cuda"].device_ids()).isdisjoint(model.parts["llvm"].device_ids())
    assert not list(out.glob("train-state*.pt"))
    ds = load_dataset(str(folder), TaskTable.load(str(TASKS)), progress=False)
    p = Predictor.load(out)
    for kind, part in model.parts.items():
        programs = [x for x in ds.programs if x.device in part.summary["train_devices"]][:20]
        got = [x.seconds for x in p.predict_features([x.features for x in programs], programs[0].device, kind)]
        assert np.allclose(got, part.predict([x.features for x in programs], programs[0].device)[0])

    # GPU data added: the GPU part retrained alone, the CPU part kept as it was; a recipe with the assembly's counts
    # (of x86 builds) gives the GPU part none
    again = tmp_path / "gpu-again"
    counted = tmp_path / "counted.toml"
    counted.write_text(f'base = "{tiny_recipe}"\nassembly_counts = true\n')
    train_checkpoint(str(counted), str(folder), str(again), str(TASKS), str(ROOT / "datasets" / "devices.json"),
                     max_minutes=0.1, seed=1, progress=False, device_ids=["nvidia-h100/cuda-sm90"],
                     other_parts_from=str(out))
    new = load_model(again)
    assert sorted(new.parts) == ["cuda", "llvm"] and new.summary["kept_parts"] == {
        "llvm": model.parts["llvm"].summary["model_version"]}
    assert new.parts["llvm"].summary == model.parts["llvm"].summary
    assert new.parts["cuda"].summary["trained_at"] == new.summary["trained_at"]
    assert not new.parts["cuda"].config.get("assembly_counts") and Predictor(new).build_target("nvidia-h100/cuda-sm90") is None
    assert new.summary["data"]["per_device"] == model.summary["data"]["per_device"]  # each part's own programs
    cpu = [x.features for x in ds.programs if x.device == "amd-epyc-znver4-1t/llvm-avx512"][:20]
    for a, b in zip(new.predict(cpu, "amd-epyc-znver4-1t/llvm-avx512"), model.predict(cpu, "amd-epyc-znver4-1t/llvm-avx512")):
        assert np.array_equal(a, b)
    model.parts["llvm"].save(tmp_path / "one-model")
    with pytest.raises(ValueError, match="no other parts to keep"):
        train_checkpoint(tiny_recipe, str(folder), str(tmp_path / "x"), str(TASKS), other_parts_from=str(tmp_path / "one-model"))
    with pytest.raises(ValueError, match="no cdmpp checkpoint"):  # what `cdmpp train` prints, not a traceback
        train_checkpoint(tiny_recipe, str(folder), str(tmp_path / "x"), str(TASKS), other_parts_from=str(tmp_path / "none"))


@pytest.mark.slow
def test_train_checkpoint_leaves_out_excluded_networks(real, tiny_recipe, tmp_path):
    """A checkpoint for benchmarks on unseen networks never trains on a task of those networks."""
    from cdmpp.model.checkpoint import TrainedModel
    from cdmpp.workflows import train_checkpoint

    folder, real = real
    nets = real.networks()
    assert len(nets) >= 2
    out = tmp_path / "model"
    train_checkpoint(tiny_recipe, str(folder), str(out), str(TASKS), str(ROOT / "datasets" / "devices.json"),
                     max_minutes=0.1, limit=120, progress=False, exclude_networks=[nets[0]])
    s = TrainedModel.load(out).summary
    seen = {n for d in s["data"]["per_device"].values() for n in d["networks"]}
    assert nets[0] not in seen and seen
    kept = [p for p in real.programs[:120] if not any(o.split("@")[0] == nets[0] for o in p.networks)]
    assert s["data"]["programs"] == len(kept)


def test_model_version_changes_with_anything_an_answer_depends_on(predictor, device):
    """The version hash covers the members' weights, the calibration (blend weights, interval) and the GBT's
    trees: equal for an equal model, different when only a blend weight differs, also in one part of a model
    of one part per kind of code."""
    import copy

    from cdmpp.model.kinds import KindModels
    from cdmpp.workflows import model_hash

    model = predictor.model_for(device)
    same = copy.copy(model)
    same.calibration = dict(model.calibration)
    assert model_hash(same) == model_hash(model)
    assert model_hash(KindModels({"llvm": same, "cuda": model})) == model_hash(KindModels({"llvm": model, "cuda": model}))
    same.calibration["gbt_weight"] = 1.0 - model.calibration.get("gbt_weight", 0.0)
    assert model_hash(same) != model_hash(model)
    assert model_hash(KindModels({"llvm": same, "cuda": model})) != model_hash(KindModels({"llvm": model, "cuda": model}))


def test_adapting_by_choice_changes_only_that_device_and_survives_a_save(predictor, device, real, tmp_path):
    """MECHANICS (labels of a real device, moved to a made-up one 5x slower): `cdmpp finetune`'s default
    stores a ShotChoice for the device; its predictions move towards the shots, other devices' stay, and
    the saved checkpoint predicts the same."""
    import dataclasses

    import numpy as np

    from cdmpp.model.checkpoint import TrainedModel
    from cdmpp.workflows import adapt_by_choice, model_hash

    trained = predictor.model_for(device)
    slow = "made-up-slow-chip-1t/llvm-avx2"
    programs = [dataclasses.replace(p, device=slow, seconds=5 * p.seconds) for p in real[1].programs]
    shots, test = programs[:60], programs[60:120]
    new = adapt_by_choice(trained, shots, slow, {slow: trained.device_specs.table[device]})
    feats = [p.features for p in test]
    y = np.array([p.seconds for p in test])
    after = np.mean(np.abs(new.predict(feats, slow)[0] - y) / y)
    assert after < 0.5 * np.mean(np.abs(np.asarray(new.predict(feats, device)[0]) - y) / y)
    assert np.allclose(new.predict(feats, device)[0], trained.predict(feats, device)[0])
    assert slow not in trained.device_specs.table and not trained.shot_choices  # the original is untouched
    new.save(tmp_path / "m")
    again = TrainedModel.load(tmp_path / "m")
    assert np.allclose(again.predict(feats, slow)[0], new.predict(feats, slow)[0], rtol=1e-5)
    assert new.summary["finetune"]["how"] == "choice"
    assert new.shot_choices[slow].base_bias == trained.calibration.get("val_log_bias", 0.0)  # the level it keeps
    assert model_hash(new) != model_hash(trained) and model_hash(again) == model_hash(new)  # a new version, kept
