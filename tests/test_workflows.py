"""Train, sample, fine-tune: checkpoints from a dataset."""

from __future__ import annotations

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
    assert all("target" in spec for spec in s["devices"].values())
    device = real.devices()[0]
    assert len(sample_ids(5, str(folder), device, task_table=str(TASKS), limit=120)) == 0  # all measured there already
    ids = sample_ids(5, str(folder), "some-other-device", str(out), task_table=str(TASKS), limit=120)
    assert len(ids) == len(set(ids)) == 5


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


def test_model_version_changes_with_anything_an_answer_depends_on(predictor):
    """The version hash covers the members' weights, the calibration (blend weights, interval) and the GBT's
    trees: equal for an equal model, different when only a blend weight differs."""
    import copy

    from cdmpp.workflows import model_hash

    model = predictor.model
    same = copy.copy(model)
    same.calibration = dict(model.calibration)
    assert model_hash(same) == model_hash(model)
    same.calibration["gbt_weight"] = 1.0 - model.calibration.get("gbt_weight", 0.0)
    assert model_hash(same) != model_hash(model)
