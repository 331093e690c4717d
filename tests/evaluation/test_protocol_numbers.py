"""The protocol's numbers on a fixed sample stay what they were (issue 57: behaviour unchanged while the
runner is rebuilt). One seed, a cheap method mix (cdmpp at one epoch, the pooled GBT and its variants, the
GBT blend, the twin predictors, TVM's XGBModel and the Tenset MLP), every within-device and cross-device setting the sample allows; each
row's fields are compared with ``protocol_numbers.json``; leave-one-chip-out's with
``protocol_numbers_chips.json``. Both were recorded with the code of 42ce0d9, before the runner's rebuild.

MECHANICS ONLY for the cross-device rows: the target is the relabeled fake device. Rewrite the record
(only when a change is meant to move the numbers, and say so in its commit) with
``CDMPP_RECORD_PROTOCOL_NUMBERS=1 pytest tests/evaluation/test_protocol_numbers.py``.

The records were made on AMD EPYC chips (Zen 4 and Zen 5 give the same numbers). On an Intel chip MKL takes
other kernels, so float sums differ in their last bits, and two kinds of rows amplify that past any tolerance:
the Tenset MLP (its training) and leave-one-chip-out's KMeans shots (a cluster flips, the shots change). On a CPU
of another vendor than the record's (its ``machine``, ``tests/machine.py``) those rows must be there with the same fields, their
numbers are not compared; every other row is compared as tightly as on the recording machine.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.data import FAKE_DEVICE, ROOT
from tests.machine import same_machine, this_machine

RECORD = Path(__file__).with_name("protocol_numbers.json")
CHIPS_RECORD = Path(__file__).with_name("protocol_numbers_chips.json")


@pytest.fixture(scope="module")
def one_epoch_recipe(tmp_path_factory):
    from cdmpp.defaults import RECIPES

    path = tmp_path_factory.mktemp("recipe") / "one-epoch.toml"
    # the recipe without the assembly's counts: the sample holds no builds, and the record predates them
    path.write_text(f'base = "{RECIPES / "ablation-no-counts"}"\nd_model = 32\nd_ff = 64\nepochs = 1\nensemble = 1\n'
                    "lr_cycle_epochs = 1\ngbt_minutes = 1\n")
    return str(path)


VARIES = ("time", "train_seconds", "recipe")  # wall clock, a temporary path: the rest of a row is compared


def _rows(runs: Path) -> dict:
    """{"setting | method": the row's numbers, metrics flattened} of a runs file (one seed: each pair once)."""
    out = {}
    for r in map(json.loads, runs.read_text().splitlines()):
        flat = {f"metrics.{k}": v for k, v in r.pop("metrics").items()}
        flat.update({k: v for k, v in r.items() if k not in VARIES and not isinstance(v, (dict, list))})
        out[f"{r['setting']} | {r['method']}" + (f" @ {r['chip']}" if r.get("chip") else "")] = flat
    return out


@pytest.mark.slow
def test_the_protocol_numbers_on_a_fixed_sample_are_unchanged(two_devices, held, one_epoch_recipe, tmp_path):
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.protocol import ProtocolOptions, run_seed

    table = DeviceTable(str(ROOT / "datasets" / "devices.json")).spec_table()
    real_dev = next(iter({p.device for p in two_devices.programs} - {FAKE_DEVICE}))
    table[FAKE_DEVICE] = {**table[real_dev], "cores": 1, "simd_width_bits": 256}
    runs = tmp_path / "runs.jsonl"
    opts = ProtocolOptions(target_device=FAKE_DEVICE, held_out=held, seeds=(0,),
                           settings=("random-new", "cross-model", "cross-device-new", "cross-device-seen"),
                           ks=("0", "8"), samplers=("kmeans", "random"),
                           methods=("cdmpp", "pooled-gbt", "pooled-gbt-roofline", "gbt-blend", "twins", "xgb", "mlp"),
                           recipe=one_epoch_recipe, minutes=60.0, peer_minutes=30.0, runs=str(runs))
    run_seed(opts, 0, ds=two_devices, device_table=table)
    _compare(_rows(runs), RECORD)


def _blas_sensitive(row: str) -> bool:
    """Rows whose numbers follow the CPU vendor's BLAS kernels (see the module's docstring)."""
    return "Tenset MLP" in row or (row.startswith("leave-one-chip-out") and "(kmeans)" in row)


def _compare(got: dict, record: Path) -> None:
    if os.environ.get("CDMPP_RECORD_PROTOCOL_NUMBERS"):
        record.write_text(json.dumps({"machine": this_machine(), **got}, indent=1, sort_keys=True) + "\n")
    want = json.loads(record.read_text())
    recorder = same_machine(want)
    assert sorted(got) == sorted(want), "the rows written changed"
    off = []
    for row, fields in want.items():  # every recorded field as it was (a row may tell more than it did)
        if not recorder and _blas_sensitive(row):
            assert set(fields) <= set(got[row]), f"{row}: fields {sorted(set(fields) - set(got[row]))} missing"
            continue
        for key, value in fields.items():
            now = got[row].get(key, "missing")
            same = (math.isclose(now, value, rel_tol=1e-6, abs_tol=1e-9) if isinstance(value, float)
                    and isinstance(now, float) else now == value)
            if not same:
                off.append(f"{row}: {key} {now} (was {value})")
    assert not off, "\n".join(off)


@pytest.mark.slow
def test_the_leave_one_chip_out_numbers_on_a_fixed_sample_are_unchanged(three_devices, chip_table,
                                                                        one_epoch_recipe, tmp_path):
    """Leave-one-chip-out (MECHANICS ONLY: two relabeled fake chips): cdmpp at one epoch, its fine-tune, the
    pooled GBT and the chip peers, k = 0 and 16 with KMeans and random shots."""
    from cdmpp.evaluation.protocol import ProtocolOptions, run_seed
    from tests.evaluation.conftest import OTHER

    runs = tmp_path / "runs.jsonl"
    opts = ProtocolOptions(settings=("leave-one-chip-out",), methods=("cdmpp", "pooled-gbt", "cdmpp-finetune"),
                           chip_ks=("0", "16"), samplers=("kmeans", "random"), chips=("fake chip A", OTHER),
                           recipe=one_epoch_recipe, minutes=60.0, runs=str(runs))
    run_seed(opts, 0, ds=three_devices, device_table=chip_table)
    _compare(_rows(runs), CHIPS_RECORD)
