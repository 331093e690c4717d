"""The shipped checkpoint answers as it did when the fixture was made (tests/model/shipped_sample.py): seconds,
interval and order of 51 real programs on their own three devices and on a device reached through an Amdahl
anchor. A change to the model code that moves any of them by more than 1e-6 relative fails here; on another
kind of CPU than the record's (``tests/machine.py``; float32 sums in other BLAS kernels' order move answers by up
to 4e-6 on an Intel chip, 3e-6 on Zen 4 against Zen 3) by more than 2e-5."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cdmpp import defaults
from cdmpp.model.kinds import is_checkpoint, load_model
from tests.machine import same_machine
from tests.model.shipped_sample import EXPECTED, answers, load_sample


@pytest.mark.skipif(not is_checkpoint(defaults.MODEL), reason="no shipped checkpoint")
def test_shipped_model_answers_unchanged():
    record = json.loads(EXPECTED.read_text())
    expected, rtol = record["answers"], 1e-6 if same_machine(record) else 2e-5
    programs, devices = load_sample()
    got = answers(load_model(defaults.MODEL), programs, devices)
    assert set(got) == set(expected)
    for key, parts in expected.items():
        for part, values in parts.items():
            np.testing.assert_allclose(got[key][part], values, rtol=rtol, atol=0, err_msg=f"{key} {part}")


@pytest.mark.skipif(not is_checkpoint(defaults.MODEL), reason="no shipped checkpoint")
def test_the_shipped_model_was_trained_with_the_default_config():
    """TrainConfig's defaults are the shipped recipe: the shipped checkpoint's config (each part's, one per kind of
    code) is TrainConfig() and train/default.toml."""
    from cdmpp.model.config import TrainConfig

    model = load_model(defaults.MODEL)
    for part in getattr(model, "parts", {"": model}).values():
        assert TrainConfig.from_dict(part.config) == TrainConfig() == TrainConfig.recipe("default")
