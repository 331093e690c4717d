"""Is cross-model's error a per-task offset or a spread inside each task? (issue 55; development only.) The 20-epoch
`base` models of experiments/cross_model_arms.py (build/counts-dropout/), seeds 0-2, on cross-model's validation and
development held-out networks: the share of the log-error variance that each (device, task)'s mean log error
explains, the MAPE with each task's best scale applied (the factor that minimizes its MAPE, known only to an oracle:
what any per-task correction, shots included, could at best buy) and the MAPE per network.

    .venv/bin/python experiments/cross_model_task_bias.py
"""

from collections import defaultdict

import numpy as np
import torch

from cdmpp.evaluation import splits
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned
from cdmpp.model.blend import blend
from cdmpp.model.checkpoint import TrainedModel


def best_scale(ratio: np.ndarray) -> float:
    """The c minimizing mean |c * ratio - 1| (ratio = predicted / measured): the median of 1 / ratio weighted by ratio."""
    inv = 1.0 / ratio
    order = np.argsort(inv)
    cum = np.cumsum(ratio[order])
    return float(inv[order][np.searchsorted(cum, cum[-1] / 2)])


def main() -> None:
    torch.set_num_threads(1)
    ds = load_pinned(ProtocolOptions())
    for seed in (0, 1, 2):
        split = splits.cross_model_split(ds, splits.HELD_OUT_NETWORKS, seed=seed)
        model = TrainedModel.load(f"build/counts-dropout/cross-model-copies0.25-e20-seed{seed}")
        for part, programs in (("validation", split.val), ("held-out networks", split.test)):
            t, g = model.predict_parts([p.features for p in programs], [p.device for p in programs])
            pred = blend(t, g, model.calibration["gbt_weight"])
            y = np.array([p.seconds for p in programs])
            err = np.log(pred / y)
            by_task, by_net = defaultdict(list), defaultdict(list)
            for i, p in enumerate(programs):
                by_task[(p.device, p.task)].append(i)
                for net in sorted(splits._base_networks(p) & set(splits.HELD_OUT_NETWORKS)) or ["training networks"]:
                    by_net[net].append(i)
            task_mean, scaled = np.zeros_like(err), np.zeros_like(err)
            for rows in by_task.values():
                task_mean[rows] = err[rows].mean()
                scaled[rows] = np.abs(best_scale(pred[rows] / y[rows]) * pred[rows] / y[rows] - 1)
            ape = np.abs(pred / y - 1)
            print(f"seed {seed}, {part}: MAPE {100 * ape.mean():.1f} %; task offsets explain "
                  f"{100 * (1 - np.var(err - task_mean) / np.var(err)):.0f} % of the log-error variance; each task at its best "
                  f"scale {100 * scaled.mean():.1f} %; "
                  + ", ".join(f"{n} {100 * ape[rows].mean():.1f} % ({len(rows)})" for n, rows in sorted(by_net.items())),
                  flush=True)


if __name__ == "__main__":
    main()
