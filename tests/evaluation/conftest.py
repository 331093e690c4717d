"""Fixtures of the evaluation tests: real programs, held-out networks and a second (relabeled) device."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from tests.data import FAKE_DEVICE


@pytest.fixture(scope="session")
def held(real):
    """The two networks with the fewest programs in the subset: held out for the cross-model tests."""
    counts = Counter(n for p in real[1].programs for n in {o.split("@")[0] for o in p.networks})
    return tuple(sorted(counts, key=lambda n: (counts[n], n))[:2])


@pytest.fixture(scope="session")
def two_devices(real):
    """MECHANICS ONLY: every third real program copied onto FAKE_DEVICE (same latency) as a second device."""
    from cdmpp.records.dataset import Dataset

    real = real[1]
    fake = [dataclasses.replace(p, device=FAKE_DEVICE, record_id=p.record_id.replace(p.device, FAKE_DEVICE))
            for p in real.programs[::3]]
    return Dataset(list(real.programs) + fake)
