"""Does a chip the model never trained on want another order weight? (issue 52: on the locked seeds cdmpp's
within-task Spearman at k = 0 is 0.751 against 0.754 for the GBT through the same transfer.)

cdmpp orders a task's programs by a blend of its transformer and its GBT, at the weight that ranked the
validation programs best (within 2 % of the lowest MAPE, ``blend.blend_weight``). Those programs are predicted
on their own device; a held-out chip is predicted on another chip and moved there (``physics.move``), and on
the thread transfer of round 26 (reports/study-issue19.md) the moved device wanted more of the GBT than
validation chose. Here the weight is also chosen on validation programs moved the way a held-out chip is:
each predicted on the device ``physics.anchor_device`` would pick were its own chip untrained, then moved to
it. Both weights, and the whole curve, are scored on the held-out chip's test programs at k = 0. Development
seeds only; one model per chip and seed, trained as ``cdmpp protocol --settings leave-one-chip-out --set
epochs=10`` trains it (12-29 minutes at 2 threads on the Zen 4 VM, after the features of every CPU device).

Not run yet (7 Dec): its mechanics were checked on the shipped model and ~5,000 programs of 40 tasks, whose
numbers mean nothing (those programs trained it). The next step of issue 52; seeds 0-2 on Zen 3, Zen 5 and the
Xeon VM, then, if the moved weight ranks better on every chip, the locked rerun.

    .venv/bin/python experiments/loco_order_weight.py train CHIP SEED   # -> runs/loco-order/<chip>-<seed>.pkl
    .venv/bin/python experiments/loco_order_weight.py table runs/loco-order/*.pkl
"""

import os
import pickle
import sys

import numpy as np

from cdmpp.model import physics
from cdmpp.model.blend import WEIGHTS, blend, blend_weight
from cdmpp.ranking import within_task_spearman

EPOCHS = 10
RANK_SLACK = 0.02  # the recipe's blend_rank_slack


def moved_parts(trained, programs) -> tuple[np.ndarray, np.ndarray]:
    """The transformer's and the GBT's seconds of labelled ``programs``, each predicted on the trained device of
    another chip that ``physics.anchor_device`` picks for a chip never trained on, then moved to its own device."""
    table = trained.device_specs.table
    devices = [p.device for p in programs]
    chip = {d: physics._parts(d)[0] for d in trained.anchors}
    anchor = {d: physics.anchor_device(d, [t for t in trained.anchors if chip[t] != chip.get(d)], table)
              for d in set(devices)}
    on = [anchor[d] or d for d in devices]
    features = [p.features for p in programs]
    members = trained._members_seconds(features, on, 256)[0]
    gbt = trained._gbt_seconds(features, on)
    return tuple(physics.move(x, features, on, devices, table, trained.anchors) for x in (members, gbt))


def order_curves(trained, test, val) -> dict:
    """The weights chosen on ``val`` as predicted (``val``) and moved across chips (``moved``), and on
    ``test`` (the held-out chip, predicted as the model predicts it) within-task Spearman and MAPE per weight."""
    out = {"weights": WEIGHTS.tolist(), "chosen": {"model": trained.calibration.get("gbt_order_weight")}}
    y_val = np.array([p.seconds for p in val])
    tasks_val = [f"{p.device}|{p.task}" for p in val]
    as_is = trained.predict_parts([p.features for p in val], [p.device for p in val])
    for name, (a, b) in (("val", as_is), ("moved", moved_parts(trained, val))):
        out["chosen"][name] = blend_weight(y_val, a, b, tasks_val, RANK_SLACK)
        out["chosen"][name + ", best ranking"] = blend_weight(y_val, a, b, tasks_val, np.inf)
    y = np.array([p.seconds for p in test])
    tasks = [f"{p.device}|{p.task}" for p in test]
    a, b = trained.predict_parts([p.features for p in test], [p.device for p in test])
    out["spearman"] = [within_task_spearman(y, blend(a, b, w), tasks) for w in WEIGHTS]
    out["mape"] = [float(np.mean(np.abs(blend(a, b, w) - y) / y)) for w in WEIGHTS]
    return out


def train(chip: str, seed: int) -> str:
    from shot_choice_chips import loco_fit

    _, _, base, model = loco_fit(chip, seed, recipe="default", epochs=EPOCHS)
    trained = model.model_.part("llvm") if hasattr(model.model_, "parts") else model.model_
    out = dict(order_curves(trained, base.test, base.val), chip=chip, seed=seed, programs=len(base.test))
    os.makedirs("runs/loco-order", exist_ok=True)
    path = f"runs/loco-order/{chip}-{seed}.pkl"
    with open(path, "wb") as f:
        pickle.dump(out, f)
    return path


def table(paths) -> None:
    print("| chip | seed | weight: model / val / moved / moved, best ranking | test Spearman at each | best on test (w) |")
    print("|---|---:|---|---|---|")
    for path in paths:
        with open(path, "rb") as f:
            r = pickle.load(f)
        rho = dict(zip(np.round(r["weights"], 1), r["spearman"]))
        names = ("model", "val", "moved", "moved, best ranking")
        ws = [round(r["chosen"][n], 1) for n in names]
        best = max(rho, key=rho.get)
        print(f"| {r['chip']} | {r['seed']} | {' / '.join(f'{w:.1f}' for w in ws)} | "
              f"{' / '.join(f'{rho[w]:.3f}' for w in ws)} | {rho[best]:.3f} ({best:.1f}) |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:
        print(train(sys.argv[2], int(sys.argv[3])))
    elif sys.argv[1:2] == ["table"]:
        table(sys.argv[2:])
    else:
        sys.exit(__doc__)
