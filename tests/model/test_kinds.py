"""One model per kind of code: a checkpoint of a CPU part and a GPU part answers as one model."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from cdmpp.model.checkpoint import TrainedModel
from cdmpp.model.kinds import KindModels, load_model, read_summary

GPU = "gpu-x/cuda-sm90"


@pytest.fixture(scope="module")
def two_kinds(trained):
    """SYNTHETIC: the CPU model, and a copy of it with other weights standing in for a GPU part."""
    cpu = trained[0]
    gpu = copy.deepcopy(cpu)
    gpu.device_specs.table = {GPU: cpu.device_specs.table["cpu-a"]}  # a part knows the devices of its kind alone
    gpu.summary = {**gpu.summary, "train_devices": [GPU]}
    with torch.no_grad():
        for m in gpu.members:
            for p in m.parameters():
                p.add_(0.05)
    return KindModels({"llvm": cpu, "cuda": gpu})


def test_each_device_is_answered_by_the_part_of_its_kind(two_kinds, trained):
    programs = [s.features for s in trained[2][:40]]
    cpu, gpu = two_kinds.parts["llvm"], two_kinds.parts["cuda"]
    assert two_kinds.part_for(GPU) is gpu and two_kinds.part_for("cpu-a") is cpu
    on_gpu, on_cpu = two_kinds.predict(programs, GPU)[0], two_kinds.predict(programs, "cpu-a")[0]
    assert np.array_equal(on_gpu, gpu.predict(programs, GPU)[0])
    assert np.array_equal(on_cpu, cpu.predict(programs, "cpu-a")[0])
    assert not np.allclose(on_gpu, on_cpu)  # the GPU's spec is cpu-a's: the CPU part would answer the same
    mixed = two_kinds.predict(programs[:4], ["cpu-a", GPU, GPU, "cpu-a"])[0]  # each by its device's part
    np.testing.assert_allclose(mixed, [on_cpu[0], on_gpu[1], on_gpu[2], on_cpu[3]], rtol=1e-5)  # other batches
    assert set(two_kinds.summary["train_devices"]) == set(cpu.summary["train_devices"]) | {GPU}
    assert GPU in two_kinds.device_ids() and "cpu-a" in two_kinds.device_ids()
    with pytest.raises(KeyError, match="in no part"):
        KindModels({"llvm": cpu}).part_for(GPU)
    with pytest.raises(ValueError, match="no part for 'cuda'"):
        KindModels({"llvm": cpu}).part("cuda")


def test_a_checkpoint_of_two_kinds_saves_and_loads_as_one(two_kinds, trained, tmp_path):
    programs = [s.features for s in trained[2][:40]]
    trained[0].save(tmp_path / "ckpt")  # a one-model checkpoint first: saving two kinds over it replaces it
    two_kinds.save(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "predictor.json").exists()
    again = load_model(tmp_path / "ckpt")
    assert isinstance(again, KindModels) and sorted(again.parts) == ["cuda", "llvm"]
    for device in (GPU, "cpu-a"):
        for a, b in zip(two_kinds.predict(programs, device), again.predict(programs, device)):
            assert np.array_equal(a, b)
    assert read_summary(tmp_path / "ckpt")["train_devices"] == two_kinds.summary["train_devices"]
    trained[0].save(tmp_path / "one")
    assert isinstance(load_model(tmp_path / "one"), TrainedModel)
    with pytest.raises(FileNotFoundError, match="no cdmpp checkpoint"):
        load_model(tmp_path / "none")


def test_the_predictor_routes_by_the_device_kind(two_kinds, tmp_path):
    """``Predictor.model_for`` answers from the part that knows a device; a device of the table new to the model
    joins the part of its target's kind (from the table, not from its id)."""
    import json

    from cdmpp.devices.table import DeviceTable
    from cdmpp.predict.predictor import Predictor

    models = copy.deepcopy(two_kinds)
    gpu = DeviceTable().get("nvidia-h100/cuda-sm90").to_dict()
    gpu.update(id="odd-gpu/sm90", hardware="a GPU named oddly", relation="")
    path = tmp_path / "devices.json"
    path.write_text(json.dumps([gpu]))
    p = Predictor(models, devices=path)
    assert p.model_for(GPU) is models.parts["cuda"] and p.model_for("cpu-a") is models.parts["llvm"]
    assert p.trained_on(GPU) and p.trained_on("cpu-a") and not p.trained_on("odd-gpu/sm90")
    assert p.model_for("odd-gpu/sm90") is models.parts["cuda"] and "odd-gpu/sm90" not in models.parts["llvm"].device_ids()
