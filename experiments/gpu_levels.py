"""Why a datasheet peak moves a new GPU wrong (reports/gpu-transfer.md): per GPU, the FLOP/s its labelled programs
reach against its peak; on the programs the K80 and the V100 both ran, their measured ratio per kind of operator;
and, from experiments/gpu_transfer.py's saved predictions, the median log error per kind of operator of each
transfer. Usage: .venv/bin/python experiments/gpu_levels.py [PREDICTIONS.jsonl] (the --out of gpu_transfer.py)"""

import collections
import glob
import json
import sys

import numpy as np

from cdmpp import defaults
from cdmpp.devices.table import DeviceTable
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore

GPUS = ("nvidia-v100/cuda-sm70", "nvidia-k80/cuda-sm37")


def main() -> None:
    store = RecordStore(defaults.DATASET)
    table = DeviceTable(defaults.DEVICES).spec_table()
    on, names = {}, {}
    for device in GPUS:
        on[device] = {}
        for r in store.iter_records(device, traces=False):
            if (y := label(r)) is not None and float(r.get("flops") or 0) > 0:
                on[device][(r["task"], r["program_hash"])] = (y, float(r["flops"]))
                names[r["task"]] = r.get("task_name", "?")
        rates = np.array([f / y / 1e9 for y, f in on[device].values()])
        print(f"{device}: {len(rates)} programs reach {np.quantile(rates, 0.9):.0f} GFLOP/s at the 90th percentile "
              f"({np.quantile(rates, 0.9) / table[device]['peak_gflops']:.2f} of the {table[device]['peak_gflops']:.0f} peak); "
              f"level_gflops in the table: {table[device].get('level_gflops')}")
    ratios = collections.defaultdict(list)
    for key, (y, _) in on[GPUS[0]].items():
        if key in on[GPUS[1]]:
            ratios[names[key[0]]].append(on[GPUS[1]][key][0] / y)
    print(f"\nmeasured {GPUS[1]} / {GPUS[0]} on programs both ran (peaks' ratio "
          f"{table[GPUS[0]]['peak_gflops'] / table[GPUS[1]]['peak_gflops']:.2f}, bandwidths' "
          f"{table[GPUS[0]]['mem_bw_gbs'] / table[GPUS[1]]['mem_bw_gbs']:.2f}):")
    for name, r in sorted(ratios.items(), key=lambda kv: -len(kv[1])):
        print(f"  {name:30s} {len(r):4d} programs, median {np.median(r):.2f}")
    if len(sys.argv) < 2:
        return
    for device in GPUS:
        files = sorted(glob.glob(f"{sys.argv[1]}.{device.replace('/', '_')}.*.npz"))
        if not files:
            continue
        runs = [np.load(f) for f in files]
        print(f"\n{device} held out ({len(runs)} seeds): median log(prediction / label) per kind of operator")
        variants = [v for v in runs[0].files if v.startswith("nearest")]
        print(f"  {'operator':30s} {'programs':>8s} " + " ".join(f"{v:>17s}" for v in variants))
        by = collections.defaultdict(lambda: collections.defaultdict(list))
        for z in runs:
            for v in variants:
                for task, e in zip(z["task"], np.log(z[v] / z["seconds"])):
                    by[names.get(str(task), "?")][v].append(e)
        for name, per in sorted(by.items(), key=lambda kv: -len(kv[1][variants[0]]))[:8]:
            print(f"  {name:30s} {len(per[variants[0]]):8d} " + " ".join(f"{np.median(per[v]):+17.2f}" for v in variants))


if __name__ == "__main__":
    main()
