"""The shipped model on the devices it never trained on (every labelled program of each): its own prediction
against the Amdahl transfer, MAPE and median APE (reports/study-issue19.md, round 25)."""
import numpy as np, torch
from cdmpp.evaluation.protocol import ProtocolOptions
from cdmpp.records.dataset import load_dataset
from cdmpp.zoo.tasks import TaskTable
from cdmpp.evaluation import splits
from cdmpp.model.checkpoint import TrainedModel
torch.set_num_threads(1)
o = ProtocolOptions()
devs = ["amd-epyc-znver4-2t/llvm-avx2", "intel-xeon-emeraldrapids-16t/llvm-avx512", "amd-epyc-znver3-1t/llvm-avx2"]
ds = load_dataset(o.dataset, TaskTable.load(o.task_table), devices=devs, progress=False)
m = TrainedModel.load("cdmpp/models/default")
anchors = m.anchors
for d in devs:
    ps = [p for p in splits._programs(ds) if p.device == d]
    y = np.array([p.seconds for p in ps]); f = [p.features for p in ps]
    m.anchors = None; direct = m.predict(f, d)[0]
    m.anchors = anchors; moved = m.predict(f, d)[0]
    ape = lambda pr: np.abs(pr - y) / y
    print(d, len(ps), "own", round(ape(direct).mean(), 4), round(float(np.median(ape(direct))), 4), "transfer", round(ape(moved).mean(), 4), round(float(np.median(ape(moved))), 4), "anchor", m.anchor_of(d), flush=True)
