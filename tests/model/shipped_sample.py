"""The shipped model's answers on a fixed sample of real programs: what a refactor of the model code must not
change (issue 57). ``shipped_sample.npz`` holds the features of 51 programs (17 drawn at random from each of
three devices' records), with their builds' instruction counts where ``datasets/assembly`` has them, and
``shipped_sample.json`` the shipped checkpoint's ``predict_orders`` of them, each on its own device and all on a
device it predicts through an Amdahl anchor; ``test_shipped_sample.py`` compares. Regenerate (only when the
shipped model is retrained on purpose) from the repository root:

    CDMPP_CACHE=/tmp/cdmpp-sample-cache python -m tests.model.shipped_sample

The features are stored, not the records: the test runs without TVM or the dataset, and reads only what the
model path (normalizer, transformer, GBT blend, Amdahl move) does with them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FEATURES, EXPECTED = HERE / "shipped_sample.npz", HERE / "shipped_sample.json"
DEVICES = ("amd-epyc-znver4-2t/llvm-avx512", "amd-epyc-znver5-1t/llvm-avx512", "nvidia-h100/cuda-sm90")
ANCHORED = "amd-ryzen7-3700x-8t/llvm-sse2"  # no labels: predicted on a trained CPU device, moved by Amdahl's law
PER_DEVICE = 17


def load_sample():
    """``(programs, devices)``: the stored ``ProgramFeatures`` and the device each was measured on."""
    from cdmpp.program.features import ProgramFeatures

    z = np.load(FEATURES)
    off = z["offsets"]
    programs = [ProgramFeatures(z["leaves"][a:b], z["positions"][a:b], float(fl), str(h),
                                asm=None if np.isnan(c).any() else c)  # NaN: not built
                for a, b, fl, h, c in zip(off[:-1], off[1:], z["flops"], z["hashes"], z["asm"])]
    return programs, [str(d) for d in z["devices"]]


def answers(model, programs, devices) -> dict:
    """What the test compares: seconds, interval and order, on the programs' devices and on ``ANCHORED``."""
    out = {}
    for name, devs in (("own", devices), ("anchored", ANCHORED)):
        for order, (mean, lo, hi) in zip((False, True), model.predict_orders(programs, devs)):
            out[f"{name}/{'order' if order else 'seconds'}"] = dict(mean=mean.tolist(), lo=lo.tolist(), hi=hi.tolist())
    return out


def main() -> None:
    from cdmpp import defaults
    from cdmpp.model.kinds import load_model
    from cdmpp.program.assembly import N_COUNTS
    from cdmpp.records.dataset import FeatureCache, _assembly_counts, _featurize_records
    from cdmpp.records.labels import label
    from cdmpp.records.record import Record
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable
    from cdmpp.records.importers import with_imported_workloads

    store = RecordStore(defaults.DATASET)
    rng = np.random.default_rng(57)
    chosen = []
    for device in DEVICES:
        recs = [r for r in store.iter_records(device) if label(r) is not None]
        chosen += [recs[i] for i in sorted(rng.choice(len(recs), PER_DEVICE, replace=False))]
    cache = FeatureCache(os.environ.get("CDMPP_CACHE", "/tmp/cdmpp-sample-cache"))
    table = with_imported_workloads(TaskTable.load(defaults.TASK_TABLE), defaults.DATASET)
    _featurize_records([Record.from_dict(r) for r in chosen if cache.get(r["program_hash"]) is None], table, cache,
                       progress=False)
    with_counts = _assembly_counts(defaults.assembly_dir(defaults.DATASET))  # its build's, where it was built
    feats = [cache.get(r["program_hash"]) for r in chosen]
    assert all(f is not None for f in feats), "a sampled program did not featurize"
    feats = [with_counts(f, r["device"]) for f, r in zip(feats, chosen)]
    asm = np.array([np.full(N_COUNTS, np.nan) if f.asm is None else f.asm for f in feats], dtype=np.float64)
    offsets = np.cumsum([0] + [f.n_leaves for f in feats])
    np.savez_compressed(FEATURES, leaves=np.concatenate([f.leaf_features for f in feats]).astype(np.float32),
                        positions=np.concatenate([f.positions for f in feats]).astype(np.int64), offsets=offsets,
                        flops=np.array([f.flops for f in feats]), hashes=np.array([f.program_hash for f in feats]),
                        devices=np.array([r["device"] for r in chosen]), asm=asm)
    programs, devices = load_sample()
    model = load_model(defaults.MODEL)
    from tests.machine import this_machine

    EXPECTED.write_text(json.dumps(dict(model=str(defaults.MODEL.relative_to(defaults.PACKAGE.parent)),
                                        machine=this_machine(),
                                        answers=answers(model, programs, devices)), indent=0) + "\n")


if __name__ == "__main__":
    main()
