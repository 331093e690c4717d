"""``cdmpp predict``: latency of programs in files (TVMScript, workload + trace JSON, a MetaSchedule
database folder) on one or more devices, as a table or JSON; and ``cdmpp --version``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from cdmpp import defaults

DB_FILES = ("database_workload.json", "database_tuning_record.json")


def model_version(model: str | os.PathLike | None = None) -> str:
    """The checkpoint's version from its JSON alone (no torch): cheap enough for ``--version``."""
    from cdmpp.model.kinds import read_summary

    try:
        summary = read_summary(model or defaults.MODEL)
    except (OSError, ValueError):
        return f"none at {model or defaults.MODEL}"
    return str(summary.get("model_version") or "unversioned")


class VersionAction(argparse.Action):
    """``--version``: the package version and the shipped model's, read only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import cdmpp

        print(f"cdmpp {cdmpp.__version__} (model {model_version()})")
        parser.exit()


def read_programs(paths: list[str]) -> list[tuple[str, str | dict]]:
    """(name, program) for each program in ``paths``, in the forms ``Predictor.predict`` takes (text or a
    workload + trace dict; nothing is parsed by TVM here). A file holds TVMScript, or JSON: one
    ``{"workload", "trace"}`` object, a list of them, or a service request (``{"programs": [...]}``, with an
    optional shared ``workload``). A folder is a MetaSchedule JSON database: each tuning record's trace on
    its workload is one program."""
    from cdmpp.program.inputs import ProgramError

    out: list[tuple[str, str | dict]] = []
    for path in paths:
        if os.path.isdir(path):
            out += _database_programs(path)
            continue
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise FileNotFoundError(f"{path}: {e.strerror or e}") from None
        if not text.lstrip().startswith(("{", "[")):
            out.append((path, text))
            continue
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise ProgramError(f"{path}: looks like JSON but does not parse: {e}") from None
        shared = None
        if isinstance(obj, dict) and "programs" in obj:
            obj, shared = obj["programs"], obj.get("workload")
        items = obj if isinstance(obj, list) else [obj]
        for i, item in enumerate(items):
            if isinstance(item, dict) and shared is not None and "workload" not in item:
                item = {**item, "workload": shared}
            out.append((path if len(items) == 1 and not isinstance(obj, list) else f"{path}#{i}", item))
    return out


def _database_programs(folder: str) -> list[tuple[str, dict]]:
    """Every tuning record of a MetaSchedule JSON database as a workload + trace program."""
    from cdmpp.program.inputs import ProgramError

    missing = [n for n in DB_FILES if not os.path.exists(os.path.join(folder, n))]
    if missing:
        raise FileNotFoundError(f"{folder} is a folder but not a MetaSchedule database: no {' or '.join(missing)}")

    def lines(name):
        with open(os.path.join(folder, name)) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield n, json.loads(line)
                    except ValueError as e:
                        raise ProgramError(f"{folder}/{name} line {n}: not JSON ({e})") from None

    workloads = [w for _, w in lines(DB_FILES[0])]
    out = []
    for n, rec in lines(DB_FILES[1]):
        try:
            workload, trace = workloads[rec[0]], rec[1][0]
        except (IndexError, KeyError, TypeError):
            raise ProgramError(f"{folder}/{DB_FILES[1]} line {n}: not a tuning record "
                               "([workload index, [trace, run_secs, target, args_info]])") from None
        out.append((f"{folder}#record{n}", {"workload": workload, "trace": trace}))
    return out


def featurize_named(predictor, items: list, kind: str, trusted: bool, build: dict | None = None
                    ) -> tuple[list, dict[int, str]]:
    """Features of each item (None where it failed) and {index: reason} of those that failed, so that one bad
    program is named and the others are still predicted (``build``: ``Predictor.build_target`` of the device)."""
    from cdmpp.program.inputs import ProgramError, load_program

    errors: dict[int, str] = {}
    feats: list = [None] * len(items)
    if trusted:  # parsed here, one by one, so that a bad one is named
        progs = {}
        for i, item in enumerate(items):
            try:
                progs[i] = load_program(item, kind)
            except ProgramError as e:
                errors[i] = str(e)
        ok = list(progs)
        for i, f in zip(ok, predictor.featurize([progs[i] for i in ok], kind, trusted=True, build=build) if ok else []):
            feats[i] = f
    else:
        ok = list(range(len(items)))
        while ok:
            try:
                got = predictor.featurize([items[i] for i in ok], kind, build=build)
            except ProgramError as e:
                bad = getattr(e, "errors", None)
                if not bad:
                    raise
                for b in bad:
                    errors[ok[b["index"]]] = b["reason"]
                ok = [i for i in ok if i not in errors]  # the sandbox returns nothing when one fails: again
                continue
            for i, f in zip(ok, got):
                feats[i] = f
            break
    return feats, errors


def predict_named(predictor, feats: list, device: str, kind: str) -> tuple[dict, dict]:
    """({index: Prediction}, {index: reason}) on ``device``: a program it cannot run (no computation, GPU
    threads on a CPU) is named, the others predicted."""
    from cdmpp.program.inputs import ProgramError

    ok, errors = [i for i, f in enumerate(feats) if f is not None], {}
    while ok:
        try:
            return dict(zip(ok, predictor.predict_features([feats[i] for i in ok], device, kind))), errors
        except ProgramError as e:
            if not getattr(e, "errors", None):
                raise
            errors.update({ok[b["index"]]: b["reason"] for b in e.errors})
            ok = [i for i in ok if i not in errors]
    return {}, errors


def _default_devices(predictor, kind: str) -> list:
    """The devices the model was trained on that run ``kind`` code (all its devices if it says none)."""
    devs = [d for d in map(predictor.device, predictor.devices()) if d.kind == kind]
    trained = [d for d in devs if d.trained]
    return trained or devs


def human_seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.4g} {unit}"
    return f"{s / 1e-9:.4g} ns"


def load_predictor(model: str | None, devices: str):
    """The checkpoint, answering also for the devices of the table at ``devices`` (from their specs)."""
    from cdmpp.predict.predictor import Predictor

    p = Predictor.load(model)
    return p if devices == defaults.DEVICES else Predictor(p.model, p.path, devices=devices)


def cmd_predict(args) -> int:
    items = read_programs(args.programs)
    if not items:
        raise ValueError("no programs in " + ", ".join(args.programs))
    predictor = load_predictor(args.model, args.devices)
    named = [d.strip() for ds in args.device or [] for d in ds.split(",") if d.strip()]
    devices = [predictor.device(d) for d in named] or _default_devices(predictor, args.target or "llvm")
    rows, errors, by_build, reported = [], [], {}, set()
    for dev in devices:
        d, kind, build = dev.id, args.target or dev.kind, predictor.build_target(dev)
        at = (kind, json.dumps(build, sort_keys=True))  # features once per target kind and build
        if at not in by_build:
            by_build[at] = featurize_named(predictor, [p for _, p in items], kind, args.trusted, build)
            errors += [(items[i][0], None, r) for i, r in by_build[at][1].items() if (kind, i) not in reported]
            reported |= {(kind, i) for i in by_build[at][1]}
        preds, errs = predict_named(predictor, by_build[at][0], dev, kind)
        errors += [(items[i][0], d, r) for i, r in errs.items()]
        rows += [{"program": items[i][0], "device": d, "seconds": p.seconds, "lo90": p.lo90, "hi90": p.hi90,
                  "flags": list(p.ood)} for i, p in sorted(preds.items())]
    if args.json:
        print(json.dumps({"model_version": predictor.version, "predictions": rows,
                          "errors": [{"program": n, "device": d, "reason": r} for n, d, r in errors]}, indent=1))
    else:
        _print_table(rows)
    for name, d, reason in errors:
        print(f"cdmpp predict: {name}{' on ' + d if d else ''}: {reason}", file=sys.stderr)
    return 2 if errors else 0


def _print_table(rows: list[dict]) -> None:
    head = ("program", "device", "seconds", "90 % interval", "flags")
    table = [(r["program"], r["device"], human_seconds(r["seconds"]),
              f"{human_seconds(r['lo90'])} - {human_seconds(r['hi90'])}", ",".join(r["flags"]) or "-") for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    for line in [head, *table]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())


def add_predict_commands(sub) -> None:
    p = sub.add_parser("predict", help="predict programs' latency on devices (table or JSON)",
                       description="Predict the latency of scheduled TVM programs: seconds, a 90 % interval and "
                                   "flags saying where a prediction lies outside what the model was trained on "
                                   "(device_untrained: the model never measured the device, it predicts from its "
                                   "specs; features_out_of_range: the program lies outside the training programs). "
                                   "Exit status 2 when a program cannot be read or predicted (named on stderr); "
                                   "the others are still printed.")
    p.add_argument("programs", nargs="+", metavar="PROGRAM",
                   help="a TVMScript file, a JSON file of workload + trace programs (one, a list, or a service "
                        "request), or a MetaSchedule JSON database folder (every tuning record)")
    p.add_argument("--device", action="append", metavar="ID",
                   help="device id, repeatable or comma-separated (default: the devices the model was trained on; "
                        "cdmpp devices lists them)")
    p.add_argument("--target", choices=["llvm", "cuda"], help="the programs' target (default: each device's)")
    p.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    p.add_argument("--devices", default=defaults.DEVICES,
                   help="device spec table: its devices the model never saw are predicted from their specs "
                        "(default %(default)s)")
    p.add_argument("--trusted", action="store_true",
                   help="parse the programs in this process (faster); by default they are parsed in a sandbox "
                        "worker, since TVMScript runs Python and TVM's JSON loader can crash")
    p.add_argument("--json", action="store_true", help="print JSON: predictions and errors")
    p.set_defaults(func=cmd_predict)
