"""Can cdmpp's transformer rank GPU programs at all? Trained on the GPUs alone (no CPU program), without the GBT,
then asked on the H200 through the H100 (the protocol's zero-shot route for a new GPU: the trained GPU closest in
peak FLOP/s). Beside it, leave-one-chip-out's transformer trained on every device ranks the H200's programs at
within-task Spearman ~0 (reports/gpu-transformer.md). Usage:
.venv/bin/python experiments/gpu_alone.py [--epochs 60] [--seeds 0,1,2] [--held-out nvidia-h200/cuda-sm90]"""

import argparse
import statistics

import numpy as np

from cdmpp import defaults
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation.metrics import score
from cdmpp.model.training import TrainConfig, fit
from cdmpp.records.dataset import load_dataset
from cdmpp.zoo.tasks import TaskTable

GPUS = ["nvidia-h100/cuda-sm90", "nvidia-v100/cuda-sm70", "nvidia-k80/cuda-sm37", "nvidia-h200/cuda-sm90"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--held-out", default="nvidia-h200/cuda-sm90")
    ap.add_argument("--through", default="nvidia-h100/cuda-sm90", help="the trained GPU the held-out one is asked on")
    args = ap.parse_args()
    ds = load_dataset(defaults.DATASET, TaskTable.load(defaults.TASK_TABLE), devices=GPUS, searched=False, progress=False)
    train = [p for p in ds.programs if p.device != args.held_out]
    asked = [p for p in ds.programs if p.device == args.held_out]
    trained_hashes = {p.record_id.rsplit("|", 1)[1] for p in train if p.device == args.through}
    seen = np.array([p.record_id.rsplit("|", 1)[1] in trained_hashes for p in asked])
    rows = {"seen (twins of trained programs)": [], "new": []}
    for seed in map(int, args.seeds.split(",")):
        cfg = TrainConfig.recipe("ablation-no-counts").replace(epochs=args.epochs, gbt_blend=False, amdahl_transfer=False,
                                                    seed=seed, progress=False)
        model = fit(cfg, train, device_table=DeviceTable(defaults.DEVICES))
        pred = model.label_transform.inverse_transform(model.predict_z([p.features for p in asked], args.through).mean(axis=0))
        for name, mask in (("seen (twins of trained programs)", seen), ("new", ~seen)):
            test = [p for p, m in zip(asked, mask) if m]
            m = score(test, pred[mask])
            m["log_bias"] = float(np.median(np.log(pred[mask] / np.array([p.seconds for p in test]))))
            rows[name].append(m)
            print(f"seed {seed} {name}: n {m['n']} MAPE {100 * m['mape']:.1f} % median APE {100 * m['median_ape']:.1f} % "
                  f"Spearman {m['spearman']:.3f} median log(pred/label) {m['log_bias']:+.2f}", flush=True)
    for name, ms in rows.items():
        mean = {k: statistics.mean(m[k] for m in ms) for k in ("mape", "median_ape", "spearman", "log_bias")}
        print(f"{len(ms)} seeds, {name}: MAPE {100 * mean['mape']:.1f} % (sd {100 * statistics.pstdev(m['mape'] for m in ms):.1f}), "
              f"median APE {100 * mean['median_ape']:.1f} %, Spearman {mean['spearman']:.3f}, median log {mean['log_bias']:+.2f}")


if __name__ == "__main__":
    main()
