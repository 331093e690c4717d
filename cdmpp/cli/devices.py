"""``cdmpp devices [show ID | add SPEC.json | probe | reference]``: the device table, which devices the model was
trained on, and how to add one."""

from __future__ import annotations

import argparse
import json
import os
import sys

from cdmpp import defaults


def trained_devices(model: str | os.PathLike | None = None) -> tuple[str, set[str] | None]:
    """(model version, ids the checkpoint trained on or None if it does not say), read from its JSON alone:
    listing devices needs no torch."""
    from cdmpp.model.kinds import read_summary

    summary = read_summary(model or defaults.MODEL)
    train = summary.get("train_devices")
    return str(summary.get("model_version") or "unversioned"), set(train) if train is not None else None


def _number(v, unit: str = "") -> str:
    return f"{v:g}{unit}" if isinstance(v, (int, float)) else "?"


def cmd_devices(args) -> int:
    from cdmpp.devices.table import DeviceTable

    if not os.path.exists(args.devices):
        raise FileNotFoundError(f"no device table at {args.devices} (pass --devices PATH)")
    table = DeviceTable(args.devices)
    version, trained = trained_devices(args.model)

    def status(i):
        return "yes" if trained is None or i in trained else "no"

    if args.json:
        print(json.dumps([{**s.to_dict(), "trained": status(s.id) == "yes"} for s in table], indent=1))
        return 0
    head = ("id", "kind", "threads", "GHz", "SIMD", "L3 KiB", "mem GB/s", "GFLOP/s", "level", "trained", "note")
    rows = [(s.id, s.kind, str(s.threads), _number(s.clock_ghz), _number(s.simd_width_bits), _number(s.l3_kb),
             _number(s.mem_bw_gbs), _number(s.peak_gflops), _level(s), status(s.id),
             "probed under load" if s.probe.get("under_load") else ("probe warning" if s.probe.get("warning") else ""))
            for s in table]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for line in [head, *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip())
    n = sum(status(s.id) == "yes" for s in table)
    print(f"\n{len(table)} devices in {args.devices}; model {version} was trained on {n} of them (the others are "
          "predicted from their specs alone, flagged device_untrained; a chip never trained on is moved by its "
          "measured `level`, where it and the trained chip have one: a CPU's reference kernels' ms, a GPU's "
          "GFLOP/s on its tuned programs).\n"
          "Add one: `cdmpp devices probe --add` (this machine's CPU), `cdmpp collect --target cuda` (its GPU), or "
          "`cdmpp devices add SPEC.json` (fields: `cdmpp devices show ID` of a similar device).")
    return 0


def _level(spec) -> str:
    """A chip's measured level (``cdmpp.devices.reference``): a CPU's reference kernels' geometric-mean latency,
    a GPU's FLOP/s on its tuned programs; "-" where none is measured."""
    if spec.reference_s:
        return f"{1e3 * spec.reference_s:.3g} ms"
    return f"{spec.level_gflops:.0f} GFLOP/s" if spec.level_gflops else "-"


def cmd_show(args) -> int:
    from cdmpp.devices.table import DeviceTable

    print(json.dumps(DeviceTable(args.devices).get(args.id).to_dict(), indent=1))
    return 0


def _add(table, spec, replace: bool) -> None:
    if spec.id in table and not replace:
        raise ValueError(f"{spec.id} is already in {table.path}; pass --replace to overwrite it")
    if replace:
        table.replace(spec)
    else:
        table.add(spec)


def cmd_add(args) -> int:
    from cdmpp.devices.spec import DeviceSpec
    from cdmpp.devices.table import DeviceTable, spec_problems

    try:
        with open(args.spec) as f:
            data = json.load(f)
    except OSError as e:
        raise FileNotFoundError(f"{args.spec}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{args.spec}: not JSON ({e})") from None
    specs = data if isinstance(data, list) else [data]
    problems = [(i, p) for i, d in enumerate(specs) for p in [spec_problems(d)] if p]
    if problems:
        raise ValueError("; ".join(f"{args.spec}: spec {specs[i].get('id', i) if isinstance(specs[i], dict) else i!r} "
                                   f"is not valid: {'; '.join(p)}" for i, p in problems))
    table = DeviceTable(args.table)
    for d in specs:
        _add(table, DeviceSpec.from_dict(d), args.replace)
        print(f"added {d['id']} to {args.table}")
    return 0


def cmd_probe(args) -> int:
    from cdmpp.devices.probe import probe_local_cpu
    from cdmpp.devices.table import DeviceTable

    reference = args.add if args.reference is None else args.reference
    spec = probe_local_cpu(args.threads or os.cpu_count() or 1, args.mcpu, tries=args.tries, reference=reference)
    print(json.dumps(spec.to_dict(), indent=1))
    if spec.probe.get("warning"):
        print(f"warning: {spec.probe['warning']}", file=sys.stderr)
    if args.add:
        table = DeviceTable(args.table)
        _add(table, spec, args.replace)
        print(f"added {spec.id} to {args.table}", file=sys.stderr)
    return 0


def cmd_reference(args) -> int:
    from cdmpp.devices.reference import LEVEL_QUANTILE, MIN_LEVEL_PROGRAMS, gpu_level_from_labels, levels_from_labels
    from cdmpp.devices.table import DeviceTable
    from cdmpp.records.store import RecordStore

    table = DeviceTable(args.table)
    found = levels_from_labels(table, RecordStore(args.dataset))
    for device, level in found.items():
        spec = table.get(device)
        spec.reference_s = float(f"{level['reference_s']:.6g}")
        spec.probe["reference"] = {"method": f"labels of {level['from']} in the dataset (the collector's measurement of "
                                             "the cdmpp.devices.reference kernels, 1 thread, fastest repeat)",
                                   "kernel_s": {h: float(f"{v:.4g}") for h, v in sorted(level["kernel_s"].items())}}
        table.add(spec, save=False)
        print(f"{device}: reference_s {spec.reference_s:.4g} s (from {level['from']})")
    for device in args.level or ():
        spec = table.get(device)
        if spec is None or spec.kind != "gpu":
            print(f"--level {device}: not a GPU of {args.table}", file=sys.stderr)
            return 2
        level = gpu_level_from_labels(RecordStore(args.dataset), device)
        if level is None:
            print(f"--level {device}: fewer than {MIN_LEVEL_PROGRAMS} labelled level programs with FLOPs "
                  f"in {args.dataset}", file=sys.stderr)
            return 2
        spec.level_gflops = float(f"{level['level_gflops']:.6g}")
        spec.probe["level"] = {"method": f"the {100 * LEVEL_QUANTILE:.0f}th percentile of the FLOP/s its "
                                         f"{level['programs']} level programs reach in the dataset "
                                         "(cdmpp.devices.reference.gpu_level_from_labels; tuned records)"}
        table.add(spec, save=False)
        found[device] = level
        print(f"{device}: level_gflops {spec.level_gflops:.6g} ({level['programs']} level programs)")
    if found:
        table.save()
    missing = [s.id for s in table if s.kind == "cpu" and not s.reference_s]
    if missing:
        print(f"no reference level (no 1-thread device of the chip and ISA with every kernel labelled; "
              f"`cdmpp devices probe --reference` on the chip measures one): {', '.join(missing)}", file=sys.stderr)
    return 0


def add_devices_commands(sub) -> None:
    d = sub.add_parser("devices", help="list devices: specs and whether the model was trained on each",
                       description="The device table: one row per device (hardware + target + threads) with the "
                                   "specs the model's device encoder reads, and whether the model trained on it.")
    d.add_argument("--devices", default=defaults.DEVICES, help="device spec table (default %(default)s)")
    d.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    d.add_argument("--json", action="store_true", help="print the table as JSON")
    d.set_defaults(func=cmd_devices)
    dsub = d.add_subparsers(dest="devices_command")

    s = dsub.add_parser("show", help="print one device's spec as JSON")
    s.add_argument("id", help="device id")
    s.add_argument("--devices", default=argparse.SUPPRESS, help="device spec table (default: as for the list)")
    s.set_defaults(func=cmd_show)

    a = dsub.add_parser("add", help="validate a device spec (JSON object or list) and add it to the table")
    a.add_argument("spec", metavar="SPEC.json")
    a.add_argument("--table", default=defaults.DEVICES, help="device table to add to (default %(default)s)")
    a.add_argument("--replace", action="store_true", help="overwrite a device of the same id")
    a.set_defaults(func=cmd_add)

    p = dsub.add_parser("probe", help="probe this machine's CPU (caches, clock, memory bandwidth, peak FLOP/s)")
    p.add_argument("--threads", type=int, help="threads the device runs with (default: all cpus)")
    p.add_argument("--mcpu", help="LLVM cpu to target (default: this machine's)")
    p.add_argument("--tries", type=int, default=3, help="probes at most, while other processes load the machine "
                                                        "(default %(default)s)")
    p.add_argument("--add", action="store_true", help="add the result to the table")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure the reference kernels (cdmpp.devices.reference, ~30 s): the chip's level, which "
                        "moves a model's predictions to a chip it never trained on (default: with --add)")
    p.add_argument("--table", default=defaults.DEVICES, help="device table to add to (default %(default)s)")
    p.add_argument("--replace", action="store_true", help="with --add: overwrite a device of the same id")
    p.set_defaults(func=cmd_probe)

    r = dsub.add_parser("reference", help="fill CPU devices' reference level (reference_s) from the labels of their "
                                          "chip's 1-thread device in the dataset")
    r.add_argument("--table", default=defaults.DEVICES, help="device table to update (default %(default)s)")
    r.add_argument("--dataset", default=defaults.DATASET, help="dataset folder (default %(default)s)")
    r.add_argument("--level", nargs="+", metavar="GPU", help="also fill these GPUs' level (level_gflops: the FLOP/s "
                   "their tuned programs reach, from an imported tuning log or database), which moves a model's "
                   "predictions to a GPU it never trained on instead of the datasheet peak")
    r.set_defaults(func=cmd_reference)
