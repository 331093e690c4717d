"""A small run of the shipped recipe on the real sample of ``shipped_sample.npz`` (labels: the shipped model's
seconds), and what the model it trains answers: the training loop's counterpart of ``shipped_sample.py``. The
recipe is ``train/default.toml`` with a smaller network and fewer epochs; everything else (program inputs,
log label, MAPE loss, cyclic LR, snapshot ensemble, CMD towards a new device, the GBT blend, the Amdahl
anchors, a checked fine-tune) runs as it ships. ``test_recipe_sample.py`` compares; regenerate (only when
a change of the recipe's numbers is meant) from the repository root:

    python -m tests.model.recipe_sample
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

EXPECTED = Path(__file__).resolve().parent / "recipe_sample.json"
TARGET = "amd-epyc-znver4-1t/llvm-avx512"  # no training labels: domain adaptation aligns towards it
SMALL = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, epochs=6, batch_size=16, lr_cycle_epochs=2, ensemble=2,
             gbt_minutes=1.0, max_minutes=5.0, progress=False)


def run() -> dict:
    from cdmpp import defaults
    from cdmpp.model.kinds import load_model
    from cdmpp.model.training import TrainConfig, checked_finetune, fit
    from cdmpp.records.dataset import LabeledProgram
    from tests.model.shipped_sample import ANCHORED, load_sample

    torch.set_num_threads(1)
    shipped = load_model(defaults.MODEL)
    table = {d: shipped.part_for(d).device_specs.table[d] for d in shipped.device_ids()}
    programs, devices = load_sample()
    seconds = shipped.predict(programs, devices)[0]
    rng = np.random.default_rng(0)
    labeled = [LabeledProgram(p, d, float(s * np.exp(0.1 * rng.normal())), task=f"t{i % 7}")
               for i, (p, d, s) in enumerate(zip(programs, devices, seconds))]
    val, train = labeled[::4], [s for i, s in enumerate(labeled) if i % 4]
    pool = [LabeledProgram(p, TARGET, float("nan")) for p in programs[:20]]
    config = TrainConfig.recipe("default").replace(**SMALL)
    model = fit(config, train, val, pool, device_table=table, featurizer_version="2")
    out = {"summary": {k: model.summary[k] for k in ("n_train", "n_val", "n_target")},
           "members_from_epochs": model.summary["members"][0]["members_from_epochs"],
           "calibration": model.calibration, "anchors": model.anchors}
    for name, devs in (("own", devices), ("anchored", ANCHORED), ("target", TARGET)):
        for order, (mean, lo, hi) in zip((False, True), model.predict_orders(programs, devs)):
            out[f"{name}/{'order' if order else 'seconds'}"] = dict(mean=mean.tolist(), lo=lo.tolist(), hi=hi.tolist())
    out["embed"] = model.embed(programs[:5]).tolist()
    shots = [LabeledProgram(p, TARGET, float(s) * 1.7, task=f"t{i % 3}")
             for i, (p, s) in enumerate(zip(programs[20:36], seconds[20:36]))]
    tuned = checked_finetune(model, shots, device_table=table)
    out["finetuned/check"] = tuned.summary["finetune"]["check"]
    out["finetuned/seconds"] = tuned.predict(programs, TARGET)[0].tolist()
    return out


if __name__ == "__main__":
    from tests.machine import this_machine

    EXPECTED.write_text(json.dumps({"machine": this_machine(), **run()}, indent=0) + "\n")
