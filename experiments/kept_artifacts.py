"""Programs/s of a pass that builds its programs versus one that runs the artifacts kept from the first
(``MetaScheduleMeasurer(artifact_dir=...)``): the same random stored programs, the collector's settings, this machine.
Run it with nothing else measuring (stop or PAUSE a collection first).

    python benchmarks/kept_artifacts.py [DEVICE] [N]
"""
import random
import sys
import tempfile
import time

from cdmpp.program import tvm_env
from cdmpp.measure.measurer import MeasureConfig
from cdmpp.measure.metaschedule import MetaScheduleMeasurer
from cdmpp.records.labels import label
from cdmpp.devices.table import DeviceTable
from cdmpp.program.inputs import apply_trace
from cdmpp.records.store import RecordStore
from cdmpp.zoo.tasks import TaskTable, load_task_mod

device = sys.argv[1] if len(sys.argv) > 1 else "amd-epyc-znver4-2t/llvm-avx512"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 96
spec = DeviceTable("datasets/devices.json").get(device)
tvm_env.setup(spec.threads)
tasks = TaskTable.load("datasets/tasks-llvm.json.gz")
labeled = [r for r in RecordStore("datasets/measurements").iter_records(device) if label(r) is not None]
recs = sorted(random.Random(0).sample(labeled, n), key=lambda r: r["task"])
task_mods = {key: load_task_mod(tasks[key]) for key in {r["task"] for r in recs}}
mods = [apply_trace(task_mods[r["task"]], r["trace"]) for r in recs]
with tempfile.TemporaryDirectory() as kept:
    measurer = MetaScheduleMeasurer(spec.make_target(), MeasureConfig(), artifact_dir=kept)
    for name in ("built", "kept"):
        t, failed = time.perf_counter(), 0
        for i in range(0, n, 32):
            batch = recs[i:i + 32]
            out = measurer.measure(mods[i:i + 32], [r["task"] for r in batch], [r["id"] for r in batch])
            failed += sum(err is not None for _, err, _, _ in out)
        dt = time.perf_counter() - t
        print(f"{name}: {n} programs in {dt:.1f} s, {n / dt:.2f} programs/s ({failed} failed)")
