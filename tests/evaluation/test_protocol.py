"""One seed of the evaluation protocol."""

from __future__ import annotations

import json

import pytest

from tests.data import FAKE_DEVICE, ROOT


@pytest.mark.slow
def test_protocol_seed_writes_a_row_per_setting_and_method(two_devices, tiny_recipe, tmp_path):
    """MECHANICS ONLY (relabeled fake device): one seed of the protocol writes cdmpp, pooled GBT, their
    blend and the twin rows for every setting asked for."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.protocol import ProtocolOptions, run_seed

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    real_dev = next(iter({p.device for p in two_devices.programs} - {FAKE_DEVICE}))
    table[FAKE_DEVICE] = {**table[real_dev], "cores": 1, "simd_width_bits": 256}
    runs = tmp_path / "runs.jsonl"
    opts = ProtocolOptions(target_device=FAKE_DEVICE, settings=("random-new", "cross-device-seen"), ks=("0", "4"),
                           samplers=("kmeans",), recipe=tiny_recipe, minutes=0.05, runs=str(runs))
    run_seed(opts, 0, ds=two_devices, device_table=table)
    rows = {(r["setting"], r["method"]) for r in map(json.loads, runs.read_text().splitlines())}
    assert {("random-new", "cdmpp"), ("random-new", "pooled GBT"), ("random-new", "cdmpp ⊕ pooled GBT"),
            ("cross-device-seen", "cdmpp k=4 (kmeans)"), ("cross-device-seen", "twin-ratio k=4 (kmeans)"),
            ("cross-device-seen", "cdmpp + twin k=4 (kmeans)")} <= rows
