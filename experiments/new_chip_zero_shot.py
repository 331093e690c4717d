"""The shipped model on a chip it never trained on (reports/leave-one-chip-out.md, "A chip the shipped model never
saw"): every labelled program of DEVICE, predicted with no measurement of the chip, as the shipped model answers
(through its anchor, moved by Amdahl's law and the reference kernels' level, and beside it by the per-thread
peak ratio as before 2 Dec) and from the chip's specs alone
(``direct``); beside it the shipped model's own blended GBT alone through the same transfer (a pooled GBT on log
latency, trained on the same programs), and the chip's twins' measured labels on the anchor moved by the same
transfer (no model: what the transfer itself costs). DEVICE's programs are twins of the core set, so each was in
training on other chips: the chip is new, the programs are not (DESIGN.md §5 "seen" programs). The reference
kernels are not scored.
Run from the checkout: ``.venv/bin/python experiments/new_chip_zero_shot.py DEVICE``."""
import dataclasses, json, sys
import numpy as np, torch
from cdmpp import defaults
from cdmpp.devices.reference import kernel_hashes
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import metrics as ev
from cdmpp.evaluation.methods.twin_ratio import AmdahlTransfer
from cdmpp.model import physics
from cdmpp.model.checkpoint import TrainedModel
from cdmpp.records.dataset import load_dataset
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore
from cdmpp.zoo.tasks import TaskTable

torch.set_num_threads(1)
device = sys.argv[1]
table = DeviceTable(defaults.DEVICES).spec_table()
model = TrainedModel.load(defaults.MODEL)
assert device not in model.summary["train_devices"], f"{device} is one the shipped model trained on"
for name, spec in table.items():
    if name not in model.device_specs.table:
        model.add_device(name, spec)
model.add_reference_levels(table)  # the chips' measured levels, as the Predictor copies them
ds = load_dataset(defaults.DATASET, TaskTable.load(defaults.TASK_TABLE), devices=[device], progress=False)
test = [p for p in ds.programs if p.device == device and p.features.program_hash not in kernel_hashes()]
features = [p.features for p in test]
anchor = model.anchor_of(device)
rows = {}
mean, lo, hi = model.predict(features, device)
rows["cdmpp (shipped), transfer by the reference kernels' level"] = ev.score(
    test, mean, lo, hi, model.predict(features, device, order=True)[0])
levels = {d: s.pop("reference_s", None) for d, s in model.device_specs.table.items()}
mean, lo, hi = model.predict(features, device)
rows["cdmpp (shipped), transfer by the per-thread peak ratio"] = ev.score(
    test, mean, lo, hi, model.predict(features, device, order=True)[0])
for d, level in levels.items():
    if level:
        model.device_specs.table[d]["reference_s"] = level
anchors, model.anchors = model.anchors, None
rows["cdmpp (shipped), direct from the specs"] = ev.score(test, model.predict(features, device)[0])
model.anchors = anchors
gbt = model.gbt
gbt.label = "the shipped model's GBT"
rows["its GBT alone, spec transfer"] = ev.score(test, AmdahlTransfer(gbt, model.anchors, model.device_specs.table).predict(test))
# no model: the twins' measured labels on the anchor, moved by the same transfer
on_anchor = {r["program_hash"]: label(r) for r in RecordStore(defaults.DATASET).iter_records(anchor, traces=False)}
twins = [p for p in test if on_anchor.get(p.features.program_hash)]
moved = physics.move([on_anchor[p.features.program_hash] for p in twins], [p.features for p in twins], [anchor] * len(twins),
                     [device] * len(twins), model.device_specs.table, model.anchors)
rows[f"measured {anchor} labels, spec transfer ({len(twins)} twins)"] = ev.score(twins, moved)
ratio = np.median([p.seconds / on_anchor[p.features.program_hash] for p in twins])
rows[f"measured {anchor} labels x their median ratio ({ratio:.3f}; uses the chip's labels)"] = ev.score(
    twins, np.array([on_anchor[p.features.program_hash] for p in twins]) * ratio)
print(f"{device}: {len(test)} programs, anchor {anchor}, per-thread peak ratio "
      f"{physics.chip_ratio(anchor, device, model.device_specs.table, reference=False):.3f}, reference kernels' ratio "
      f"{physics.chip_ratio(anchor, device, model.device_specs.table):.3f}")
print("| predictor | programs | MAPE | capped | median APE | within-task Spearman | fast-10 % MAPE |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, s in rows.items():
    print(f"| {name} | {s['n']:,} | {100 * s['mape']:.1f} % | {100 * s['mape_capped']:.1f} % | {100 * s['median_ape']:.1f} % | "
          f"{s['spearman']:.3f} | {100 * s['mape_fast10']:.1f} % |")
print(json.dumps({k: {m: round(v, 4) for m, v in s.items() if isinstance(v, float)} for k, s in rows.items()}))
