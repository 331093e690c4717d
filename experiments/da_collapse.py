"""Does CMD domain adaptation towards a held-out chip's programs collapse training? (reports/leave-one-chip-out.md,
"Two CPUs of other people's tuning logs"). Leave-one-chip-out's split of CHIP_DEVICE (seed 1000), the transformer
alone (no GBT blend, one member) trained EPOCHS epochs with each DA arm; prints the validation MAPE after each
epoch. Validation programs only (the other devices'); the chip's test programs are not scored. Since 424a498
``fit`` stops a collapsed run and trains again without a pool, so the "cmd" arm then prints that retrained run
and its ``da_collapsed`` history.
Run from the checkout: ``.venv/bin/python experiments/da_collapse.py DATASET CHIP_DEVICE EPOCHS cmd,none``."""
import dataclasses, sys, time
from cdmpp import defaults
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import chips, splits
from cdmpp.model.training import TrainConfig, fit
from cdmpp.records.dataset import load_dataset
from cdmpp.zoo.tasks import TaskTable

dataset, device, epochs, arms = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
table = DeviceTable(defaults.DEVICES).spec_table()
ds = load_dataset(dataset, TaskTable.load(defaults.TASK_TABLE), progress=False, searched=False)
chip = splits.chip_of(device, table)
ds.programs = chips.of_chips_kind(ds, chip, table)
sp = splits.leave_one_chip_out_split(ds, chip, table, 0, seed=1000)
print("train", len(sp.train), "val", len(sp.val), "pool", len(sp.target_pool), flush=True)
for arm in arms:
    cfg = dataclasses.replace(TrainConfig.recipe("ablation-no-counts"), epochs=epochs, da=arm, gbt_blend=False, ensemble=1,
                              seed=1000)
    t = time.monotonic()
    m = fit(cfg, sp.train, sp.val, target_pool=sp.target_pool, device_table=table)
    print(arm, "val MAPE", round(m.summary["val"]["mape"], 4), "per epoch", m.summary["members"][0]["history"],
          "collapsed", m.summary.get("da_collapsed"), f"{time.monotonic() - t:.0f} s", flush=True)
