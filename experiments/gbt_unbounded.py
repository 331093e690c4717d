"""How long the shipped blend's GBT needs on `cdmpp train`'s split (the two pinned devices, val 0.1, seed 0) when
no time budget stops it: `python benchmarks/gbt_unbounded.py` (2 threads, like `cdmpp train`)."""
import time
from cdmpp import defaults
from cdmpp.records.dataset import load_dataset
from cdmpp.zoo.tasks import TaskTable
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import splits
from cdmpp.model.pooled_gbt import PooledGBT
ids = ["amd-epyc-znver4-2t/llvm-avx512", "amd-epyc-znver4-1t/llvm-avx512"]
t = time.monotonic()
ds = load_dataset("datasets/measurements", TaskTable.load(defaults.TASK_TABLE), devices=ids, progress=False)
print(f"load {time.monotonic() - t:.1f} s, {len(ds)} programs")
split = splits.random_split(ds, 0, val=0.1, test=0.0)
table = DeviceTable(defaults.DEVICES)
gbt = PooledGBT(table.spec_table(), nthread=2, random_state=0, target="latency")
t = time.monotonic()
gbt.fit(split.train, split.val)
print(f"GBT fit {time.monotonic() - t:.1f} s, best iteration {gbt.model_.best_iteration}, rounds {gbt.model_.get_booster().num_boosted_rounds()}")
