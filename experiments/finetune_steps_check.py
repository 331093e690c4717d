"""Would checked_finetune keep a 20- or 100-step fine-tune at k = 16 and 64 (the seed-0 source model of
benchmarks/finetune_steps_model.py; reports/study-issue19.md, round 23)?"""
import sys, numpy as np, torch
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P, splits
from cdmpp.model.checkpoint import TrainedModel
from cdmpp.model.training import checked_finetune, TrainConfig
torch.set_num_threads(2)
opts = P.ProtocolOptions(); ds = P.load_pinned(opts); target = opts.target_device
table = DeviceTable(opts.devices).spec_table()
model = TrainedModel.load("runs/models/xd-seed0"); cfg = TrainConfig.from_dict(model.config)
for k in (16, 64):
    for sampler, seed in [("kmeans", 0), ("kmeans", 1), ("kmeans", 2), ("random", 0), ("random", 1), ("random", 2)]:
        sp = splits.cross_device_split(ds, target, k, sampler, 0, embed=model.embed, programs="new", draw=seed)
        out = []
        for steps in (20, 100):
            c = checked_finetune(model, sp.shots, cfg, steps, device_table=table).summary["finetune"]["check"]
            out.append(f"steps {steps}: kept {c['kept']} ({100*c['held_out_mape']:.0f} vs {100*c['unadapted_mape']:.0f} %)")
        print(k, sampler, seed, "; ".join(out), flush=True)
