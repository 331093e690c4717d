"""How a checkpoint's two halves (transformer, pooled GBT) and their blend do on networks it never saw
(reports/study-issue19.md, round 20): per-program error on every labelled program of the cross-model
split's held-out tasks, on their fastest program per task (what a tuned network runs), and the summed
network prediction of ``cdmpp bench network``'s best-measured programs against the measured latencies
of a ``cdmpp bench network`` report, for blend weights w (of the transformer) from 0 to 1.

``.venv/bin/python benchmarks/blend_across_models.py MODEL NETWORK_REPORT``, MODEL trained with
``--exclude-networks resnet18,mobilenet_v2,bert_tiny``; about a minute."""

import json
import sys
from collections import defaultdict

import numpy as np

from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import splits
from cdmpp.evaluation.metrics import within_task_spearman
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned
from cdmpp.model.blend import blend
from cdmpp.predict import network as net
from cdmpp.predict.predictor import Predictor
from cdmpp.zoo.tasks import TaskTable

WEIGHTS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)
model_dir, report = sys.argv[1], sys.argv[2]
opts = ProtocolOptions()
predictor = Predictor.load(model_dir)
model = predictor.model


test = splits.cross_model_split(load_pinned(opts), pool=0.0).test
y = np.array([p.seconds for p in test])
tasks = [(p.device, p.task) for p in test]
transformer, gbt = model.predict_parts([p.features for p in test], [p.device for p in test])
by_task = defaultdict(list)
for i, t in enumerate(tasks):
    by_task[t].append(i)
fastest = np.array([min(ids, key=lambda i: y[i]) for ids in by_task.values()])
w_order = model.calibration.get("gbt_order_weight", model.calibration["gbt_weight"])
print(f"{model_dir}: w = {model.calibration['gbt_weight']:.1f} for seconds, {w_order:.1f} for order; {len(y)} held-out "
      f"programs, {len(fastest)} tasks")
print("| w | MAPE, all | within-task Spearman | MAPE, fastest per task | median log(pred/label), fastest |")
print("|---:|---:|---:|---:|---:|")
for w in WEIGHTS:
    p = blend(transformer, gbt, w)
    ape = np.abs(p - y) / y
    print(f"| {w:.1f} | {100 * ape.mean():.1f} % | {within_task_spearman(y, p, tasks):.3f} | "
          f"{100 * ape[fastest].mean():.1f} % | {np.median(np.log(p[fastest] / y[fastest])):+.2f} |")

result = json.load(open(report))
device = result["device"]
target = DeviceTable(opts.devices).get(device).make_target()
table = TaskTable.load(opts.task_table)
print(f"\nnetworks on {device}, error against {report}'s measured latency")
print("| network | measured | " + " | ".join(f"w = {w:.1f}" for w in WEIGHTS) + " |")
print("|---|---:|" + "---:|" * len(WEIGHTS))
for row in result["networks"]:
    programs = net.task_programs(row["network"], table, "best-measured", device, opts.dataset, target)
    feats = predictor.featurize([p.mod for p in programs], trusted=True)
    keep = [i for i, f in enumerate(feats) if f.n_leaves > 0]  # no stores: predicted 0, as cdmpp network does
    weight = np.array([programs[i].weight for i in keep], dtype=np.float64)
    t, g = model.predict_parts([feats[i] for i in keep], device)
    m = row["measured_seconds"]
    print(f"| {row['network']} | {1e3 * m:.2f} ms | " + " | ".join(
        f"{100 * ((weight * blend(t, g, w)).sum() / m - 1):+.0f} %" for w in WEIGHTS) + " |")
