"""Checkpoints save and load."""

from __future__ import annotations

import numpy as np

from cdmpp.model.checkpoint import TrainedModel


def test_save_load_round_trip(trained, tmp_path):
    model, _, val = trained
    progs, devs = [s.features for s in val[:50]], [s.device for s in val[:50]]
    model.save(tmp_path / "ckpt")
    assert not list((tmp_path / "ckpt").glob("*.pt")) and (tmp_path / "ckpt" / "predictor.json").exists()
    again = TrainedModel.load(tmp_path / "ckpt")
    for a, b in zip(model.predict(progs, devs), again.predict(progs, devs)):
        assert np.array_equal(a, b)
    assert np.array_equal(model.embed(progs), again.embed(progs))


def test_a_model_saved_before_gpus_could_anchor_loads_with_its_trained_gpus_as_anchors(trained, tmp_path):
    """Anchors written when only CPUs anchored gain the trained GPUs on load (fork/join 0), so a GPU the model
    never saw is predicted through the trained GPU closest in peak FLOP/s, as a model trained today does."""
    import copy

    model = copy.copy(trained[0])
    model.anchors = {"cpu-a": 1e-6}
    model.summary = {**model.summary, "train_devices": ["cpu-a", "gpu-old/cuda-sm70"]}
    model.save(tmp_path / "ckpt")
    assert TrainedModel.load(tmp_path / "ckpt").anchors == {"cpu-a": 1e-6, "gpu-old/cuda-sm70": 0.0}
    model.anchors = None  # trained without the Amdahl transfer: nothing is reached through an anchor
    model.save(tmp_path / "plain")
    assert TrainedModel.load(tmp_path / "plain").anchors is None
