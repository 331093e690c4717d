"""Fitted transforms: the log label, feature normalizer, device specs."""

from __future__ import annotations

import numpy as np

from cdmpp.model.training import finetune, fit
from cdmpp.model.transforms import FeatureNormalizer, LogLatency
from tests.model.synthetic import DEVICES, quick_config, synthetic_samples


def test_log_label_round_trip_and_json():
    rng = np.random.default_rng(0)
    y = np.exp(rng.uniform(np.log(1e-7), np.log(10), 500))
    bc = LogLatency().fit(y)
    z = bc.transform(y)
    assert abs(z.mean()) < 1e-6 and abs(z.std() - 1) < 1e-6
    assert np.allclose(bc.inverse_transform(z), y, rtol=1e-6)
    bc2 = LogLatency.from_dict(bc.to_dict())
    assert np.allclose(bc2.transform(y), z)
    assert np.all(np.isfinite(bc.inverse_transform(np.array([-50.0, 50.0]))))


def test_feature_normalizer_train_only_and_json():
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=100), rng.lognormal(8, 2, 100), np.ones(100)]).astype(np.float32)
    norm = FeatureNormalizer().fit(x)
    t = norm.transform(x)
    assert norm.log_cols_.tolist() == [False, True, False]
    assert np.allclose(t[:, :2].mean(0), 0, atol=1e-4) and np.all(t[:, 2] == 0)
    assert np.allclose(FeatureNormalizer.from_dict(norm.to_dict()).transform(x), t)


def test_device_specs_no_training_device_varies_along_do_not_move_predictions():
    """Trained on one device, a new device's prediction is the training device's until fine-tuned
    (not a random offset from untrained weights)."""
    rng = np.random.default_rng(3)
    train, val = synthetic_samples(300, rng), synthetic_samples(60, rng)
    model = fit(quick_config(epochs=3, ensemble=1), train, val, device_table={"cpu-a": DEVICES["cpu-a"]})
    model.add_device("cpu-b", DEVICES["cpu-b"])
    progs = [s.features for s in val]
    assert np.allclose(model.predict(progs, "cpu-a")[0], model.predict(progs, "cpu-b")[0])
    shots = synthetic_samples(30, rng, "cpu-b")
    tuned = finetune(model, shots, steps=20, device_table={"cpu-b": DEVICES["cpu-b"]})
    assert not np.allclose(tuned.predict(progs, "cpu-a")[0], tuned.predict(progs, "cpu-b")[0])
