"""Add ``calibration["val_log_bias"]`` to a checkpoint trained before ``cdmpp train`` stored it (3 Dec, 7c875df).

``cdmpp finetune`` gives the value to ``ShotChoice`` as ``base_bias`` (reports/shot-choice-level.md); a checkpoint
without it gets 0, the old behaviour. The value is what ``cdmpp train`` computes at its end: the median log error
of the finished model (members and GBT blend) on its own validation programs. Those are drawn again here as
``train_checkpoint`` drew them (``training_split``, seed 0, a tenth of the tasks) from the records measured before
the training started (``summary.trained_at`` less ``train_seconds``; nothing is ever removed from a dataset), and
the script refuses unless the numbers of training and validation programs and the validation MAPE equal those the
checkpoint recorded. The weights are not touched; the model version is stamped again, since it hashes the
calibration.

    .venv/bin/python scripts/val_log_bias.py cdmpp/models/default
"""

import json
import sys
from pathlib import Path


def main(checkpoint: str, dataset: str = "", task_table: str = "") -> None:
    import datetime as dt

    import numpy as np

    from cdmpp import defaults
    from cdmpp.records.dataset import LoadReport
    from cdmpp.records.store import RecordStore

    from cdmpp.model.checkpoint import TrainedModel
    from cdmpp.model.shots import median_log_error
    from cdmpp.records.dataset import load_dataset
    from cdmpp.workflows import model_hash, training_split
    from cdmpp.zoo.tasks import TaskTable

    model = TrainedModel.load(checkpoint)
    summary = model.summary
    if "val_log_bias" in model.calibration:
        sys.exit(f"{checkpoint}: already has val_log_bias = {model.calibration['val_log_bias']:.4f}")
    dataset, task_table = dataset or defaults.DATASET, task_table or defaults.TASK_TABLE
    started = dt.datetime.fromisoformat(summary["trained_at"]).timestamp() - summary["train_seconds"]
    before = {r.id for r in RecordStore(dataset).records(report=LoadReport(), traces=False)  # imports carry no time
              if not isinstance(r.measured_at, (int, float)) or r.measured_at < started}
    ds = load_dataset(dataset, TaskTable.load(task_table), progress=True)
    ds.programs = [p for p in ds.programs if p.record_id in before]
    split = training_split(ds, seed=0)
    found, recorded = (len(split.train), len(split.val)), (summary["n_train"], summary["n_val"])
    if found != recorded:
        sys.exit(f"{dataset}: {found[0]} training + {found[1]} validation programs, the checkpoint recorded "
                 f"{recorded[0]} + {recorded[1]}: not the data it was trained on")
    seconds = np.array([p.seconds for p in split.val])
    pred = model.predict([p.features for p in split.val], [p.device for p in split.val])[0]
    mape = float(np.mean(np.abs(pred / seconds - 1)))
    if abs(mape - summary["val"]["mape"]) > 1e-3:
        sys.exit(f"validation MAPE {mape:.4f}, the checkpoint recorded {summary['val']['mape']:.4f}: not its predictions")
    bias = median_log_error(pred, seconds)
    path = Path(checkpoint) / "predictor.json"
    meta = json.loads(path.read_text())
    meta["calibration"]["val_log_bias"] = bias
    model.calibration["val_log_bias"] = bias
    old = meta["summary"]["model_version"]
    meta["summary"]["model_version"] = old.rsplit("-", 1)[0] + "-" + model_hash(model)
    path.write_text(json.dumps(meta, indent=1))  # as TrainedModel.save writes it
    print(f"val_log_bias {bias:+.4f} (validation MAPE {mape:.4f} as recorded); {old} -> {meta['summary']['model_version']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
