"""``cdmpp bench network``: predicted vs measured end-to-end latency of zoo networks.

Each network is compiled with the same schedules the prediction uses (``cdmpp.predict.network``), run end to
end on this machine with the device's thread count, and compared with the predicted sum over its
tasks. Beside it: the sum of the stored labels of the same programs (what a perfect kernel predictor
would say), which separates the model's error from what a sum of kernels leaves out (the VM's own
time, caches warmed by the previous kernel). A network whose tasks the model trained on is marked
``seen``; only unseen ones test generalization (train a checkpoint without them and pass ``--model``).
"""

from __future__ import annotations

import json
import os
import sys
import time


def _seen_networks(predictor, device: str) -> set[str]:
    data = predictor.model.summary.get("data") or {}
    per = data.get("per_device", {}) if isinstance(data, dict) else {}
    return set((per.get(device) or {}).get("networks", {}))


def run(networks: list[str], device: str, schedules: str, model: str | None, dataset_dir: str,
        task_table: str, devices: str | None = None) -> dict:
    from cdmpp.predict import network as net
    from cdmpp.devices.probe import check_runs_here
    from cdmpp.devices.table import DeviceTable
    from cdmpp.predict.predictor import Predictor
    from cdmpp.zoo.tasks import TaskTable, split_occurrence

    spec = DeviceTable(devices).get(device) if devices else DeviceTable().get(device)
    check_runs_here(spec)  # before any compile: the networks run on this machine
    target = spec.make_target()
    table = TaskTable.load(task_table)
    predictor = Predictor.load(model)
    seen = _seen_networks(predictor, device)
    rows = []
    for occ in networks:
        t0 = time.perf_counter()
        programs = net.task_programs(occ, table, schedules, device, dataset_dir, target)
        pred = net.predict_network(predictor, occ, device, programs)
        measured = net.measure_network(net.compile_network(occ, programs, target), occ, spec)
        labels = [p.weight * p.measured_s for p in programs if p.measured_s is not None]
        row = {"network": occ, "seen_in_training": split_occurrence(occ)[0] in seen,
               "tasks": len(programs), "calls": sum(p.weight for p in programs),
               "tasks_scheduled": sum(p.trace is not None for p in programs),
               "predicted_s": pred.seconds, "lo90": pred.lo90, "hi90": pred.hi90, **{
                   f"measured_{k}": v for k, v in measured.items()},
               "sum_of_labels_s": sum(labels) if len(labels) == len(programs) else None,
               "wall_s": round(time.perf_counter() - t0, 1)}
        row["error"] = row["predicted_s"] / row["measured_seconds"] - 1
        if row["sum_of_labels_s"]:
            row["labels_error"] = row["sum_of_labels_s"] / row["measured_seconds"] - 1
        rows.append(row)
        print(f"bench network: {occ}: predicted {1e3 * pred.seconds:.3f} ms, measured "
              f"{1e3 * row['measured_seconds']:.3f} ms ({100 * row['error']:+.1f} %)", file=sys.stderr)
    return {"device": device, "schedules": schedules, "model_version": predictor.version, "networks": rows,
            "command": " ".join(sys.argv)}


def table(result: dict) -> str:
    lines = [f"{'network':16s} {'seen':>4s} {'tasks':>5s} {'pred ms':>9s} {'90% interval':>19s} {'meas ms':>9s} "
             f"{'error':>7s} {'labels':>7s}"]
    for r in result["networks"]:
        labels = f"{100 * r['labels_error']:+6.1f}%" if r.get("labels_error") is not None else "      -"
        lines.append(f"{r['network']:16s} {'yes' if r['seen_in_training'] else 'no':>4s} {r['tasks']:5d} "
                     f"{1e3 * r['predicted_s']:9.3f} {1e3 * r['lo90']:8.3f}-{1e3 * r['hi90']:<10.3f} "
                     f"{1e3 * r['measured_seconds']:9.3f} {100 * r['error']:+6.1f}% {labels}")
    return "\n".join(lines)


def main(args) -> int:
    from cdmpp.zoo.tasks import TaskTable

    networks = [n.strip() for n in (args.networks or "").split(",") if n.strip()]
    if not networks:
        networks = [o for o in TaskTable.load(args.task_table).occurrences() if o.endswith("@1")]
    r = run(networks, args.device, args.schedules, args.model, args.dataset, args.task_table, args.devices)
    print(table(r))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(r, f, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
