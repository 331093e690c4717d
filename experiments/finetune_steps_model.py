"""Train and save the protocol's cross-device source model of one seed (argument, default 0) as
runs/models/xd-seed<seed>, for the fine-tune studies of benchmarks/finetune_*.py (reports/study-issue19.md,
rounds 23-24)."""
import sys, torch
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P, splits
from cdmpp.evaluation.harness import recipe_config
from cdmpp.evaluation.methods.cdmpp_model import CDMPP
torch.set_num_threads(2)
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
opts = P.ProtocolOptions(); ds = P.load_pinned(opts); target = opts.target_device
table = DeviceTable(opts.devices).spec_table()
base = splits.cross_device_split(ds, target, 0, seed=seed, programs="new")
config = recipe_config(opts.recipe, seed=seed, max_minutes=9.5, progress=False)
m = CDMPP(config, table, base.target_pool).fit(base.train, base.val)
m.model_.save(f"runs/models/xd-seed{seed}")
print("saved")
