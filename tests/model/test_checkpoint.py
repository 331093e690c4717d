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
