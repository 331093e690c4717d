"""Train and save the protocol's cross-device source model of seed 0 (runs/models/xd-seed0) for
benchmarks/finetune_steps.py and finetune_steps_check.py (reports/study-issue19.md, round 23)."""
import torch
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P, splits
from cdmpp.evaluation.harness import recipe_config
from cdmpp.evaluation.methods.cdmpp_model import CDMPP
torch.set_num_threads(2)
opts = P.ProtocolOptions(); ds = P.load_pinned(opts); target = opts.target_device
table = DeviceTable(opts.devices).spec_table()
base = splits.cross_device_split(ds, target, 0, seed=0, programs="new")
config = recipe_config(opts.recipe, seed=0, max_minutes=9.5, progress=False)
m = CDMPP(config, table, base.target_pool).fit(base.train, base.val)
m.model_.save("runs/models/xd-seed0")
print("saved")
