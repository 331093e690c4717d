"""Why the V100 held out is predicted 2.4x too slow (reports/leave-one-chip-out.md, "One model per kind of code"):
its level comes from the K80 moved by the peaks' ratio. This compares that ratio with the measured one on the programs
measured on both, and with the GPU part's own K80/V100 ratio on the V100's other programs (the shipped model, which
trained on both, so a fit, not a prediction). Usage: .venv/bin/python experiments/gpu_pair_ratio.py [--model DIR]"""

import argparse

import numpy as np
import torch

from cdmpp import defaults
from cdmpp.model import physics
from cdmpp.model.kinds import load_model
from cdmpp.records.dataset import load_dataset
from cdmpp.zoo.tasks import TaskTable

FAST, SLOW = "nvidia-v100/cuda-sm70", "nvidia-k80/cuda-sm37"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(defaults.MODEL))
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset(defaults.DATASET, TaskTable.load(defaults.TASK_TABLE), devices=[FAST, SLOW], progress=False)
    on = {d: {(p.task, p.features.program_hash): p for p in ds.programs if p.device == d} for d in (FAST, SLOW)}
    model = load_model(args.model).part("cuda")
    peaks = 1 / physics.chip_ratio(SLOW, FAST, model.device_specs.table)
    both = sorted(set(on[FAST]) & set(on[SLOW]))
    alone = [p for key, p in on[FAST].items() if key not in on[SLOW]]

    def seconds(programs, device):
        return model.predict([p.features for p in programs], device)[0]

    measured = np.array([on[SLOW][k].seconds / on[FAST][k].seconds for k in both])
    twins = [on[FAST][k] for k in both]
    print(f"peaks' ratio {SLOW} / {FAST}: {peaks:.2f}")
    print(f"{len(both)} programs measured on both: measured ratio (median) {np.median(measured):.2f}, "
          f"predicted {np.median(seconds(twins, SLOW) / seconds(twins, FAST)):.2f}")
    print(f"{len(alone)} programs of {FAST} alone: predicted ratio (median) "
          f"{np.median(seconds(alone, SLOW) / seconds(alone, FAST)):.2f}; predicted on {FAST} / label (median) "
          f"{np.median(seconds(alone, FAST) / np.array([p.seconds for p in alone])):.2f}")


if __name__ == "__main__":
    main()
