"""Fixtures shared by the tests of this folder."""

from __future__ import annotations

import numpy as np
import pytest

from cdmpp.model.training import fit
from tests.model.synthetic import DEVICES, quick_config, synthetic_samples


@pytest.fixture(scope="session")
def trained():
    rng = np.random.default_rng(0)
    train = synthetic_samples(700, rng) + synthetic_samples(300, rng, "cpu-b")
    val = synthetic_samples(200, rng) + synthetic_samples(100, rng, "cpu-b")
    pool = synthetic_samples(100, rng, "cpu-b")
    for s in pool:  # SYNTHETIC: cpu-b's programs on a device without labels, so domain adaptation runs
        s.device = "cpu-d"
    model = fit(quick_config(da="cmd", da_weight=1.0), train, val, target_pool=pool,
                device_table={**DEVICES, "cpu-d": {**DEVICES["cpu-b"], "clock_ghz": 2.5}})
    return model, train, val
