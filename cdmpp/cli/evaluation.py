"""``cdmpp eval | protocol | learning-curve | train | sample | finetune``: evaluation and the train / sample / fine-tune workflow."""

from __future__ import annotations

import argparse
import os
import sys

from cdmpp import defaults


def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def cmd_eval(args) -> int:
    from cdmpp.evaluation.harness import EvalOptions, run_eval

    opts = EvalOptions(
        name=args.name, split=args.split, dataset=args.dataset, task_table=args.task_table, devices=args.devices,
        held_out=_csv(args.held_out), target_device=args.target_device, ks=[int(k) for k in _csv(args.k)],
        recipe=args.recipe, peers=_csv(args.peers), ablations=_csv(args.ablations), max_minutes=args.max_minutes,
        minutes_per_method=args.minutes_per_method, reports_dir=args.reports_dir, limit=args.limit,
        train_fraction=args.train_fraction, seed=args.seed, progress=args.progress, threads=args.threads)
    try:
        report = run_eval(opts)
    except ValueError as e:
        print(f"cdmpp eval: {e}", file=sys.stderr)
        return 2
    print(open(f"{args.reports_dir}/{args.name}.md").read())
    print(f"wrote {args.reports_dir}/{args.name}.json, .md and -runs.jsonl ({report['elapsed_seconds']:.0f} s)",
          file=sys.stderr)
    return 0


def _protocol_options(args, default_settings=None, **more):
    import tomllib

    from cdmpp.evaluation import splits
    from cdmpp.evaluation.protocol import SETTINGS, ProtocolOptions

    overrides = tomllib.loads("\n".join(args.set)) if args.set else {}
    if args.locked:  # the locked test: its own seeds and held-out networks, to report, never to choose
        args.seeds = ",".join(str(s) for s in splits.LOCKED_SEEDS)
        more.setdefault("held_out", splits.LOCKED_HELD_OUT_NETWORKS)
    return ProtocolOptions(dataset=args.dataset, task_table=args.task_table, devices=args.devices,
                           device_ids=_csv(args.device_ids), target_device=args.target_device,
                           settings=_csv(args.settings) if args.settings else list(default_settings or SETTINGS), seeds=[int(s) for s in _csv(args.seeds)],
                           methods=_csv(args.methods), recipe=args.recipe, overrides=overrides, label=args.label,
                           minutes=args.minutes, runs=args.runs, peer_minutes=args.peer_minutes, limit=args.limit,
                           threads=args.threads, chips=_csv(args.chips) if args.chips else (),
                           chip_train=getattr(args, "chip_train", "same-kind"),
                           progress=args.progress, states=args.states, **more)


def cmd_protocol(args) -> int:
    import shlex

    import dataclasses
    import json

    from cdmpp.evaluation.protocol import run_protocol
    from cdmpp.evaluation.summary import aggregate, markdown, summary_markdown

    opts = _protocol_options(args, ks=_csv(args.k), chip_ks=_csv(args.chip_k), samplers=_csv(args.samplers))
    command = "cdmpp " + shlex.join(sys.argv[1:])
    if args.summarize_only:  # rows already in --runs (e.g. a run of more peers appended): summary only
        summary = aggregate(opts.runs, command)
        summary["options"] = {**dataclasses.asdict(opts)}
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump(summary, f, indent=1)
    else:
        try:
            summary = run_protocol(opts, jobs=args.jobs, command=command, summary_path=args.summary or None)
        except ValueError as e:
            print(f"cdmpp protocol: {e}", file=sys.stderr)
            return 2
    if args.summary:
        _write_generated(os.path.splitext(args.summary)[0] + ".md", summary_markdown(summary))
    print(markdown(summary))
    return 0


def _write_generated(path: str, text: str) -> str:
    """Write a generated report to ``path``, unless ``path`` holds a report someone wrote by hand (its first line
    is not the generated one's, e.g. reports/leave-one-chip-out.md beside leave-one-chip-out.json): then beside it,
    as ``<name>.summary.md``, never over it. Returns the path written."""
    if os.path.exists(path):
        with open(path) as f:
            if f.readline().rstrip("\n") != text.split("\n", 1)[0]:
                kept, path = path, os.path.splitext(path)[0] + ".summary.md"
                print(f"cdmpp: {kept} was written by hand; the generated summary goes to {path}", file=sys.stderr)
    with open(path, "w") as f:
        f.write(text)
    return path


def cmd_learning_curve(args) -> int:
    import dataclasses
    import json
    import shlex

    from cdmpp.evaluation.protocol import run_protocol
    from cdmpp.evaluation.summary import aggregate_curve, curve_markdown

    opts = _protocol_options(args, ("random-new", "cross-model"),
                             train_fractions=[float(f) for f in _csv(args.train_fractions)])
    if not opts.train_fractions:
        print("cdmpp learning-curve: --train-fractions is empty", file=sys.stderr)
        return 2
    command = "cdmpp " + shlex.join(sys.argv[1:])
    if args.summarize_only:  # rows already in --runs: the curve only
        curve = aggregate_curve(opts.runs, command)
        curve["options"] = dataclasses.asdict(opts)
    else:
        curve = run_protocol(opts, jobs=args.jobs, command=command)
    text = curve_markdown(curve)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(curve, f, indent=1)
        _write_generated(os.path.splitext(args.out)[0] + ".md", "# cdmpp learning curve\n\n" + text)
    print(text)
    return 0


def _refuse_overwrite(out: str, force: bool, command: str) -> bool:
    """A trained checkpoint is never replaced by accident: the caller must pass --force."""
    from cdmpp.model.kinds import is_checkpoint

    if is_checkpoint(out) and not force:
        print(f"cdmpp {command}: {out} already holds a checkpoint; pass --force to replace it", file=sys.stderr)
        return True
    return False


def cmd_train(args) -> int:
    from cdmpp.workflows import train_checkpoint

    if args.write_store:
        return _write_store(args)
    if _refuse_overwrite(args.out, args.force, "train"):
        return 2
    try:
        model = train_checkpoint(args.recipe, args.dataset, args.out, args.task_table, args.devices,
                                 args.max_minutes, args.val, args.seed, args.limit,
                                 device_ids=_csv(args.device_ids) or None,
                                 exclude_networks=_csv(args.exclude_networks) or None, val_by=args.val_by,
                                 device=args.device, store=args.store, other_parts_from=args.other_parts_from)
    except ValueError as e:
        print(f"cdmpp train: {e}", file=sys.stderr)
        return 2
    if "rank" in model.summary:  # a torchrun rank other than 0: rank 0 saves and reports
        return 0
    print(f"saved {model.summary['model_version']} to {args.out}")
    for kind, part in getattr(model, "parts", {"": model}).items():
        s = part.summary
        print(f"  {kind + ' code: ' if kind else ''}{s['n_train']} train / {s['n_val']} val programs, "
              f"val MAPE {100 * s['val']['mape']:.1f} %, {s['train_seconds']} s")
    return 0


def _write_store(args) -> int:
    """``cdmpp train --write-store DIR``: the split ``cdmpp train`` would train on, written as a feature store."""
    from cdmpp.workflows import write_split_store

    if args.store:
        print("cdmpp train: --write-store writes a store and --store trains from one: give one of them",
              file=sys.stderr)
        return 2
    if os.path.exists(os.path.join(args.write_store, "split.json")) and not args.force:
        print(f"cdmpp train: {args.write_store} already holds a store; pass --force to replace it", file=sys.stderr)
        return 2
    info = write_split_store(args.write_store, args.dataset, args.task_table, args.val, args.seed, args.limit,
                             _csv(args.device_ids) or None, _csv(args.exclude_networks) or None, args.val_by)
    print(f"wrote {info['n_train']} train / {info['n_val']} val programs to {args.write_store}; train from it with "
          f"`cdmpp train --store {args.write_store}`")
    return 0


def cmd_bench_train(args) -> int:
    from cdmpp.bench import train_scale

    return train_scale.main(args)


def cmd_sample(args) -> int:
    from cdmpp.workflows import sample_ids

    if bool(args.pool) == bool(args.programs):
        print("cdmpp sample: give either --pool DATASET (with --device) or --programs PATH...", file=sys.stderr)
        return 2
    if args.programs:
        return _sample_programs(args)
    if not args.device:
        print("cdmpp sample: --pool needs --device (the device to measure on; its programs are skipped)", file=sys.stderr)
        return 2
    ids = sample_ids(args.k, args.pool, args.device, args.model, args.sampler, args.task_table, args.seed)
    return _write_chosen(ids, args.out, "record ids")


def _write_chosen(lines: list[str], out: str | None, what: str) -> int:
    """The chosen programs, one per line, to ``out`` or stdout; exit status 1 when none was chosen."""
    text = "".join(line + "\n" for line in lines)
    if out:
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {len(lines)} {what} to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0 if lines else 1


def _sample_programs(args) -> int:
    """``cdmpp sample --programs``: the k of any featurizable programs to measure, by name."""
    from cdmpp.cli.predict import featurize_named, read_programs
    from cdmpp.predict.predictor import Predictor
    from cdmpp.program.inputs import ProgramError
    from cdmpp.workflows import sample_features

    try:
        named = read_programs(args.programs)
    except (OSError, ProgramError) as e:
        print(f"cdmpp sample: {e}", file=sys.stderr)
        return 2
    predictor = Predictor.load(args.model)
    feats, errors = featurize_named(predictor, [p for _, p in named], args.target, args.trusted)
    for i, reason in sorted(errors.items()):
        print(f"cdmpp sample: {named[i][0]}: {reason} (skipped)", file=sys.stderr)
    ok = [i for i, f in enumerate(feats) if f is not None]
    chosen = sample_features(args.k, [feats[i] for i in ok], args.model, args.sampler, args.seed, args.target)
    return _write_chosen([named[ok[i]][0] for i in chosen], args.out, "program names")


def cmd_finetune(args) -> int:
    from cdmpp.workflows import finetune_checkpoint

    if _refuse_overwrite(args.out, args.force, "finetune"):
        return 2
    with open(args.ids) as f:
        ids = f.read().split()
    try:
        model = finetune_checkpoint(args.model, args.dataset, args.device, ids, args.out, args.steps,
                                    args.task_table, args.devices, scope=args.scope, how=args.how)
    except (ValueError, KeyError) as e:
        print(f"cdmpp finetune: {e}", file=sys.stderr)
        return 2
    print(f"saved {model.summary['model_version']} to {args.out} "
          f"({model.summary['finetune']['n']} programs measured on {args.device})")
    return 0


def add_eval_commands(sub, bsub) -> None:
    data = argparse.ArgumentParser(add_help=False)
    data.add_argument("--dataset", default=defaults.DATASET, help="dataset folder")
    data.add_argument("--task-table", default=defaults.TASK_TABLE)
    data.add_argument("--devices", default=defaults.DEVICES, help="device spec table")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--force", action="store_true", help="train/finetune: replace an existing checkpoint")

    e = sub.add_parser("eval", parents=[data], help="one setting of the protocol for one seed: cdmpp, its ablations "
                                                    "and peers on one split, one report (the protocol's runner)")
    e.add_argument("--name", required=True, help="report name: reports/NAME.json and .md")
    e.add_argument("--split", choices=("random", "cross-model", "cross-device"), default="random")
    e.add_argument("--held-out", default="resnet18,mobilenet_v2,bert_tiny", help="cross-model: networks to hold out")
    e.add_argument("--target-device", help="cross-device: the device to adapt to")
    e.add_argument("--k", default="0,16,64", help="cross-device: shot counts (0 = zero-shot)")
    e.add_argument("--recipe", default="default", help="training recipe (train/NAME.toml)")
    e.add_argument("--peers", default="xgb,mlp", help="peers beside cdmpp and the pooled GBT, protocol method names: "
                                                      "xgb (TVM's XGBModel and the XGBoost regressor), mlp (empty: none)")
    e.add_argument("--ablations", default="no-pe,no-da,random-sampler", help="no-pe, no-da, random-sampler")
    e.add_argument("--max-minutes", type=float, default=8.0,
                   help="cap on each trained model (default 8); the recipe's epochs are the budget. Before issue 57 "
                        "this was one budget shared by all methods")
    e.add_argument("--minutes-per-method", type=float, help="the cap on each trained model, instead of --max-minutes")
    e.add_argument("--reports-dir", default=defaults.REPORTS)
    e.add_argument("--limit", type=int, help="use only the first N records (smoke runs)")
    e.add_argument("--train-fraction", type=float, default=1.0,
                   help="random/cross-model: train on this share of the training programs, same test set "
                        "(a learning curve; default 1)")
    e.add_argument("--progress", action="store_true", help="show progress bars")
    e.add_argument("--threads", type=int, default=1, help="torch/XGBoost threads per method (default 1)")
    e.set_defaults(func=cmd_eval)

    proto = argparse.ArgumentParser(add_help=False)  # what `protocol` and `learning-curve` share
    # no default here: a subparser's set_defaults would change this action, which both commands share
    proto.add_argument("--settings", help="settings to run, comma-separated: random-new, cross-model, "
                                          "leave-one-chip-out, cross-device-new, cross-device-seen, paper, "
                                          "paper-5-leaf (default: all; learning-curve: random-new,cross-model)")
    proto.add_argument("--chip-train", choices=("all", "same-kind"), default="same-kind",
                       help="leave-one-chip-out trains on the other devices whose code is of the held-out chip's "
                            "kind, CPU or GPU, as the shipped recipe trains one model per kind (same-kind, default), "
                            "or on every other device (all)")
    proto.add_argument("--chips", help="leave-one-chip-out: chips to hold out, by their devices' hardware name "
                                       "(default: every chip with >= 2,000 programs and under half of the data)")
    proto.add_argument("--seeds", default="0,1,2", help="split and model seeds (default 0,1,2: the development seeds)")
    proto.add_argument("--locked", action="store_true",
                       help="the locked test: seeds 1000-1002 and cross-model held-out networks googlenet, gpt2_small, "
                            "dcgan_gen, which no recipe choice has seen (run to report, never to choose)")
    proto.add_argument("--methods", default="cdmpp,pooled-gbt",
                       help="cdmpp, transformer-alone (cdmpp's transformer without its GBT, same fit; within-device "
                            "settings), pooled-gbt (with the seen-programs baselines), twins (only those: twin-Amdahl, "
                            "twin-roofline and twin-ratio), pooled-gbt-roofline, pooled-gbt-latency, pooled-gbt-mape "
                            "(the GBT on log(latency / roofline bound), on log latency, on log latency with a MAPE "
                            "loss), gbt-blend (the latency and MAPE-loss GBTs blended, the weight chosen on "
                            "validation), chip-peers (leave-one-chip-out: only the shots-only GBT and the chip's own "
                            "GBT), cdmpp-finetune (with shots: the network fine-tuned on KMeans shots, a row beside "
                            "ShotChoice's), xgb (TVM's XGBModel), mlp (Tenset MLP), xgb-regressor (XGBoost on TVM features + device "
                            "specs); names: cdmpp/evaluation/methods/registry.py")
    proto.add_argument("--peer-minutes", type=float, default=2.0, help="cap on each xgb / mlp training run (default 2)")
    proto.add_argument("--recipe", default="default")
    proto.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a training setting on top of the recipe (TOML value; repeatable), e.g. gbt_blend=false")
    proto.add_argument("--label", default="cdmpp", help="row name of the cdmpp model (ablations)")
    proto.add_argument("--minutes", type=float, default=120.0,
                       help="safety cap on each cdmpp training run (default 120); the recipe's epochs are the budget, "
                            "so a loaded machine gives the same model (--set epochs=N to change it)")
    proto.add_argument("--device-ids", default=",".join(defaults.PROTOCOL_DEVICES),
                       help="devices whose programs are used (pinned, so added data does not move the numbers; "
                            "default %(default)s)")
    proto.add_argument("--target-device", default=defaults.PROTOCOL_TARGET,
                       help="cross-device settings: the device held out (default %(default)s)")
    proto.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes")
    proto.add_argument("--threads", type=int, default=1,
                       help="torch / XGBoost threads of each job (default 1; the shipped model trains with all cores)")
    proto.add_argument("--limit", type=int, help="use only the first N records (smoke runs)")
    proto.add_argument("--progress", action="store_true",
                       help="a progress bar (steps, rate, ETA) on stderr while cdmpp trains; a row is logged as it is scored")
    proto.add_argument("--states", metavar="DIR",
                       help="where cdmpp's training runs are saved after every epoch until their rows are written, so "
                            "the same command started again after a stop goes on from there (default: RUNS.states/ "
                            "beside --runs)")
    proto.add_argument("--summarize-only", action="store_true",
                       help="train nothing: rewrite the summary (.json and .md) from the rows already in --runs")

    pr = sub.add_parser("protocol", parents=[data, proto], help="the evaluation protocol (docs/evaluation.md): every "
                                                                "setting and seed, cdmpp vs peers; writes a summary JSON")
    pr.add_argument("--k", default="0,16,64,5%", help="cross-device shot counts; N%% = share of the target's programs")
    pr.add_argument("--chip-k", default="0,1%,5%,16,64", help="leave-one-chip-out's shot counts")
    pr.add_argument("--samplers", default="kmeans,random")
    pr.add_argument("--runs", default=defaults.PROTOCOL_RUNS, help="every scored row is appended here")
    pr.add_argument("--summary", default=defaults.REPORTS + "/summary.json", help="summary of --runs (empty: none)")
    pr.set_defaults(func=cmd_protocol)

    lc = sub.add_parser("learning-curve", parents=[data, proto],
                        help="the protocol's random-new and cross-model settings trained on shares of each seed's "
                             "training programs (same test set): error vs training-set size")
    lc.add_argument("--train-fractions", default="0.125,0.25,0.5,1",
                    help="shares of each seed's training programs (nested; default 0.125,0.25,0.5,1)")
    lc.add_argument("--runs", default=defaults.REPORTS + "/learning-curve-runs.jsonl", help="every scored row is appended here")
    lc.add_argument("--out", default=defaults.REPORTS + "/learning-curve.json",
                    help="the curve (.json and .md; empty: none)")
    lc.set_defaults(func=cmd_learning_curve)

    t = sub.add_parser("train", parents=[data], help="train on a whole dataset (all devices) and save a checkpoint")
    t.add_argument("--recipe", default="default")
    t.add_argument("--out", default=defaults.MODEL_OUT, help="checkpoint folder")
    t.add_argument("--max-minutes", type=float, help="override the recipe's time budget")
    t.add_argument("--val", type=float, default=0.1, help="validation fraction (default 0.1)")
    t.add_argument("--val-by", choices=("task", "program"), default="task",
                   help="draw the validation share by task (default: selection for tasks never trained on) or by "
                        "program hash")
    t.add_argument("--limit", type=int, help="use only the first N records")
    t.add_argument("--device-ids", help="comma-separated devices to train on (default: every device in the data)")
    t.add_argument("--exclude-networks", help="comma-separated networks whose tasks are left out of training (a "
                                              "checkpoint for benchmarks on networks it never saw)")
    t.add_argument("--write-store", metavar="DIR",
                   help="featurize and split the dataset as training would (--val, --val-by, --seed, --limit, "
                        "--device-ids, --exclude-networks) and write it to DIR as a feature store, then stop")
    t.add_argument("--store", metavar="DIR",
                   help="train from a store --write-store wrote: the training programs read from disk in chunks "
                        "(memory-mapped), so memory does not grow with them; the validation programs in memory. "
                        "The split and dataset options are the store's; --seed seeds the model")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                   help="where the transformer trains: cpu (default), cuda, or auto (cuda when torch sees a GPU). "
                        "Under `torchrun --nproc_per_node N cdmpp train ...` the N processes share every batch "
                        "(DistributedDataParallel; gloo on cpu, nccl on cuda) and rank 0 saves")
    t.add_argument("--other-parts-from", metavar="CHECKPOINT",
                   help="train only the kinds of code in the data (e.g. --device-ids of the GPUs) and save them beside "
                        "CHECKPOINT's parts of the other kinds, unchanged (a checkpoint of one model per kind)")
    t.set_defaults(func=cmd_train)

    bt = bsub.add_parser("train", help="peak memory of training the shipped recipe (GBT blend and anchors included) "
                                       "from a memory-mapped feature store of N programs (real programs repeated: a "
                                       "memory benchmark), per million programs")
    bt.add_argument("--programs", type=int, default=100_000, help="programs in the store (default 100,000)")
    bt.add_argument("--base", type=int, default=4096, help="real programs repeated to fill it (default 4096)")
    bt.add_argument("--val", type=int, default=256, help="other real programs to validate on, in memory (default 256)")
    bt.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    bt.add_argument("--gbt-trees", type=int, default=20, help="trees of the blended GBT (default 20)")
    bt.add_argument("--batch-size", type=int, default=256)
    bt.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    bt.add_argument("--threads", type=int, default=2, help="torch threads of the training process (default 2)")
    bt.add_argument("--store", help="folder for the store (kept and reused with --keep; default: a temporary one)")
    bt.add_argument("--keep", action="store_true", help="keep the store")
    bt.add_argument("--dataset", default=defaults.DATASET)
    bt.add_argument("--task-table", default=defaults.TASK_TABLE)
    bt.add_argument("--devices", default=defaults.DEVICES)
    bt.add_argument("--json", help="write the result here")
    bt.set_defaults(func=cmd_bench_train)

    s = sub.add_parser("sample", help="choose k programs to measure on a new device (KMeans on embeddings)")
    s.add_argument("--k", type=int, required=True)
    s.add_argument("--pool", help="dataset folder whose programs are the candidates (prints record ids)")
    s.add_argument("--programs", nargs="+", metavar="PATH",
                   help="or any programs: TVMScript files, workload + trace JSON, MetaSchedule database folders "
                        "(prints the chosen programs' names)")
    s.add_argument("--target", default="llvm", choices=("llvm", "cuda"), help="--programs: their target kind")
    s.add_argument("--trusted", action="store_true", help="--programs: parse in this process, not a sandbox")
    s.add_argument("--device", help="--pool: the device to measure on (its programs are skipped)")
    s.add_argument("--model", help="checkpoint whose embeddings to cluster (default: model-free features)")
    s.add_argument("--sampler", choices=("kmeans", "random"), default="kmeans")
    s.add_argument("--out", help="write the record ids here (default: stdout)")
    s.add_argument("--task-table", default=defaults.TASK_TABLE)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_sample)

    ft = sub.add_parser("finetune", parents=[data], help="adapt a checkpoint to a device with programs measured there "
                                             "(cross-validation on them chooses how)")
    ft.add_argument("--model", required=True, help="checkpoint folder")
    ft.add_argument("--device", required=True)
    ft.add_argument("--ids", required=True, help="file of record ids (from `cdmpp sample`)")
    ft.add_argument("--out", required=True, help="new checkpoint folder")
    ft.add_argument("--how", choices=["choice", "network"], default="choice",
                    help="choice (default): cross-validation on the shots picks the model's prediction as is, "
                         "corrected by their ratio, a GBT of the shots alone or a blend; network: fine-tune the network")
    ft.add_argument("--steps", type=int, default=None,
                    help="Adam steps (default: about 20 passes over the shots, at most 100)")
    ft.add_argument("--scope", choices=["head", "all"], default="head",
                    help="weights to tune: decoder + device encoder (head, default; better on the cross-device "
                         "report) or all")
    ft.set_defaults(func=cmd_finetune)
