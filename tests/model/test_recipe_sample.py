"""The shipped recipe, run small on the real sample, trains the model it trained when the fixture was made
(tests/model/recipe_sample.py): the training loop's numbers are unchanged, not only the shipped weights'."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cdmpp import defaults
from tests.model.recipe_sample import EXPECTED, run


def _compare(got, expected, where=""):
    if isinstance(expected, dict):
        assert set(got) == set(expected), where
        for k in expected:
            _compare(got[k], expected[k], f"{where}/{k}")
    elif isinstance(expected, (list, float, int)) and not isinstance(expected, bool):
        np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(expected, dtype=float), rtol=1e-5,
                                   atol=1e-12, err_msg=where)
    else:
        assert got == expected, where


@pytest.mark.skipif(not (defaults.MODEL / "predictor.json").exists(), reason="no shipped checkpoint")
def test_recipe_trains_the_same_model():
    _compare(json.loads(json.dumps(run())), json.loads(EXPECTED.read_text()))
