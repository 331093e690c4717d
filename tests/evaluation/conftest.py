"""Fixtures of the evaluation tests: real programs, held-out networks and a second (relabeled) device."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from tests.data import FAKE_DEVICE, ROOT


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


OTHER = "fake-otherchip-4t/llvm-avx2"  # NOT a real device: relabeled real programs (mechanics only)


@pytest.fixture(scope="session")
def three_devices(two_devices):
    """MECHANICS ONLY: the two-device set plus every fourth real program relabeled onto a second fake chip."""
    from cdmpp.records.dataset import Dataset

    real = [p for p in two_devices.programs if p.device != FAKE_DEVICE]
    other = [dataclasses.replace(p, device=OTHER, seconds=p.seconds / 3, record_id=p.record_id + "-other")
             for p in real[1::4]]
    return Dataset(list(two_devices.programs) + other)


@pytest.fixture(scope="session")
def chip_table(three_devices):
    from cdmpp.devices.table import DeviceTable

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    real_dev = next(iter({p.device for p in three_devices.programs} - {FAKE_DEVICE, OTHER}))
    table[FAKE_DEVICE] = {**table[real_dev], "cores": 1, "threads": 1, "hardware": "fake chip A"}
    table[OTHER] = {**table[real_dev], "cores": 4, "threads": 4, "hardware": "fake chip B"}
    return table
