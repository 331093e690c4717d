"""Random-new trained on every CPU device: do other chips' labels of the training programs help the
2-thread and 1-thread Zen 4 devices' new programs? (issue 55: random-new is at 34 %; the learning curve
in programs of one machine is nearly flat, but the training/validation gap is 21 vs 35 %, and the other
chips measured the same core program set: more labels per program, not more programs.)

    .venv/bin/python experiments/random_new_all_cpus.py 0 --epochs 20     # → runs/random-new-all-cpus/0.json

One split of every CPU device's random schedules (twins grouped across all of them, as the protocol
does), two arms on it: the protocol's pinned devices only (the split restricted to them: a valid split of
their data), and every CPU device. Both are scored on the same test programs (those of the pinned
devices) and, for choosing, on the same validation programs; development seeds only.
"""

import argparse
import dataclasses
import json
import os

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seed", type=int)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arms", default="pinned,all-cpus")
    a = ap.parse_args()

    import torch

    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.methods.cdmpp_model import CDMPP
    from cdmpp.evaluation.metrics import fast_share_mape, ranking_metrics
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, recipe_config, setting_splits
    from cdmpp.devices.spec import target_kind_of_id

    torch.set_num_threads(a.threads)
    opts = ProtocolOptions()
    devices = DeviceTable(opts.devices)
    cpus = [d for d in devices.ids() if target_kind_of_id(d) == "llvm"]  # GPU programs neither loaded nor featurized
    ds = load_pinned(dataclasses.replace(opts, device_ids=cpus))
    table = devices.spec_table()
    (_, split), = setting_splits(ds, "random-new", a.seed)
    pinned = set(opts.device_ids)
    on_pinned = lambda progs: [p for p in progs if p.device in pinned]  # noqa: E731
    val, test = on_pinned(split.val), on_pinned(split.test)
    print(f"devices {sorted({p.device for p in ds.programs})}; train {len(split.train)} "
          f"({len(on_pinned(split.train))} pinned), val {len(val)}, test {len(test)} (pinned)", flush=True)

    os.makedirs("runs/random-new-all-cpus", exist_ok=True)
    out_path = f"runs/random-new-all-cpus/{a.seed}.json"
    out = json.load(open(out_path)) if os.path.exists(out_path) else {}
    for arm in a.arms.split(","):
        train = on_pinned(split.train) if arm == "pinned" else split.train
        model = CDMPP(recipe_config("ablation-no-counts", seed=a.seed, epochs=a.epochs, progress=False), table).fit(
            train, split.val if arm != "pinned" else val)
        row = {"train": len(train), "epochs": a.epochs, "describe": model.describe()}
        for part, progs in (("val", val), ("test", test)):
            y, tasks = np.array([p.seconds for p in progs]), [f"{p.device}|{p.task}" for p in progs]
            pred = model.predict(progs)
            row[part] = {"mape": float(np.mean(np.abs(pred - y) / y)),
                         "spearman": ranking_metrics(y, model.predict_order(progs), tasks)["spearman"],
                         "fast10": fast_share_mape(y, pred, tasks)}
        out[arm] = row
        print(arm, json.dumps(row), flush=True)
        json.dump(out, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
