"""The ``cdmpp`` command line. Every command imports TVM/torch lazily so ``cdmpp --help`` stays fast."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from importlib import resources


def _sample_path(name: str = "conv2d.tvmscript") -> str:
    return str(resources.files("cdmpp") / "samples" / name)


def cmd_featurize(args) -> int:
    from cdmpp.features import compact_ast_of, featurize, FEATURE_NAMES
    from cdmpp.program import ProgramError, load_program

    path = args.program or _sample_path()
    try:
        with open(path) as f:
            text = f.read()
        program = load_program(text, args.target)
        feats = featurize(program)
    except (OSError, ProgramError) as e:
        print(f"cdmpp featurize: {path}: {e}", file=sys.stderr)
        return 2
    ast = compact_ast_of(program, feats.n_leaves)
    print(f"program {path}")
    print(f"target  {program.target}")
    print(f"hash    {feats.program_hash}   flops {feats.flops:.0f}")
    print(f"compact AST: {len(ast.nodes)} tokens, {ast.n_leaves} leaves, depth {ast.depth()}")
    print(ast.summary())
    print(f"leaf features: {feats.leaf_features.shape[0]} x {feats.leaf_features.shape[1]}; positions {feats.positions.tolist()}")
    for i, row in enumerate(feats.leaf_features):
        top = sorted(range(len(row)), key=lambda j: -abs(row[j]))[:6]
        print(f"  leaf {i} ({ast.leaf_buffers[i]}): " + ", ".join(f"{FEATURE_NAMES[j]}={row[j]:.2f}" for j in top))
    return 0


def _artifact_dir(args) -> str | None:
    """Where built programs are kept for later passes: beside the dataset's feature cache."""
    from cdmpp.data import default_cache_dir

    if args.artifacts == "none":
        return None
    return args.artifacts or os.path.join(default_cache_dir(args.dataset), "artifacts")


def _add_artifacts_arg(parser) -> None:
    parser.add_argument("--artifacts", metavar="DIR",
                        help="keep built programs here so later passes skip the build (default: "
                             "~/.cache/cdmpp/<dataset>/artifacts, ~10 KB each; 'none' to keep nothing)")


def cmd_collect(args) -> int:
    from cdmpp import tvm_env
    from cdmpp.collect import MeasureConfig, collect
    from cdmpp.devices import DeviceTable, probe_local_cpu
    from cdmpp.zoo.tasks import TaskTable

    threads = args.threads if args.target == "llvm" else 1  # CUDA: the host runs one thread
    tvm_env.setup(threads)
    table = TaskTable.load(args.task_table)
    nets = args.networks.split(",") if args.networks else None
    names = args.tasks.split(",") if args.tasks else None
    like = args.tasks_like.split(",") if args.tasks_like else None
    if nets or names or like:
        table = table.filter(networks=nets, task_names=names, task_like=like)
    if len(table) == 0:
        print("cdmpp collect: no task matches the filters (--tasks takes exact names; --tasks-like substrings)",
              file=sys.stderr)
        return 2
    if args.target == "cuda":
        from cdmpp.devices import probe_cuda_gpu

        device = probe_cuda_gpu()
        target = device.make_target()
    else:
        target = tvm_env.make_target("llvm", num_cores=threads, mcpu=args.mcpu)
        device = probe_local_cpu(threads, mcpu=args.mcpu)
    devices = DeviceTable(args.devices)
    if device.id not in devices.ids():
        devices.add(device)
    if args.programs_from and args.programs_from not in devices.ids():
        print(f"cdmpp collect: --programs-from {args.programs_from}: unknown device (see {args.devices})", file=sys.stderr)
        return 2
    rpc = None
    if args.rpc_tracker:
        host, port = args.rpc_tracker.rsplit(":", 1)
        rpc = (host, int(port), args.rpc_key)
    cfg = MeasureConfig(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, cache_flush=args.cache_flush,
                        builders=args.builders, quiet_share=args.quiet_share, max_wait_s=60 * args.max_wait_minutes,
                        run_budget_s=args.run_budget_s)
    fast = {"auto": None, "fast": True, "metaschedule": False}[args.measurer]
    print(f"collecting {len(table)} tasks x {args.per_task} schedules on {device.id} into {args.dataset}"
          + (f", {args.programs_from}'s programs first" if args.programs_from else ""), file=sys.stderr)
    s = collect(table, args.dataset, device, target, per_task=args.per_task, budget_minutes=args.budget_minutes,
                cfg=cfg, batch_size=args.batch_size, seed=args.seed, rpc=rpc, artifact_dir=_artifact_dir(args),
                programs_from=args.programs_from, fast=fast, overlap=args.overlap)
    print(f"done: {s['measured']} measured, {s['failed']} failed, {s['skipped_done']} already stored, "
          f"{s['tasks']} tasks, {s['seconds']} s" + (" (stopped by budget)" if s["stopped_by_budget"] else "")
          + (f", {s['programs_per_s']} programs/s; seconds spent: {s['times']}" if "times" in s else ""))
    return 0


def _add_guard_args(parser) -> None:
    """The quiet-machine rule of every measuring command (``cdmpp.collect.CpuGuard``)."""
    parser.add_argument("--quiet-share", type=float, default=0.05, metavar="SHARE",
                        help="programs run only while other processes use less than this share of all cores; "
                             "a run phase they exceeded it in is measured again (default %(default)s)")
    parser.add_argument("--max-wait-minutes", type=float, default=30.0, metavar="MIN",
                        help="longest wait for a quiet machine before measuring anyway (such records are "
                             "marked disturbed and measured again later; default %(default)s)")


def cmd_noise(args) -> int:
    from cdmpp import tvm_env
    from cdmpp.collect import MeasureConfig, remeasure_noise
    from cdmpp.devices import DeviceTable
    from cdmpp.zoo.tasks import TaskTable

    spec = DeviceTable(args.devices).get(args.device)
    tvm_env.setup(spec.threads)
    cfg = MeasureConfig(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, quiet_share=args.quiet_share,
                        max_wait_s=60 * args.max_wait_minutes)
    r = remeasure_noise(args.dataset, TaskTable.load(args.task_table), spec, spec.make_target(), n=args.n, cfg=cfg,
                        min_gap_minutes=args.min_gap_minutes, artifact_dir=_artifact_dir(args),
                        probe_runs=set(args.run) if args.run else None)
    print(f"{r['device']}: {r['programs']} programs re-measured; |new - label| / label median "
          f"{100 * r['median_rel_diff']:.1f} %, p90 {100 * r['p90_rel_diff']:.1f} % (labels with 1/2/.. passes: "
          f"{r['label_passes']}); against first passes only: median {100 * r['first_pass_median_rel_diff']:.1f} %, "
          f"p90 {100 * r['first_pass_p90_rel_diff']:.1f} %")
    if r["same_passes_programs"]:
        print(f"like for like ({r['same_passes_programs']} labels against checks of as many passes, "
              f">= {args.min_gap_minutes:g} min apart): median {100 * r['same_passes_median_rel_diff']:.1f} %, "
              f"p90 {100 * r['same_passes_p90_rel_diff']:.1f} %")
    return 0


def cmd_remeasure(args) -> int:
    from cdmpp import tvm_env
    from cdmpp.collect import MeasureConfig, remeasure
    from cdmpp.devices import DeviceTable
    from cdmpp.zoo.tasks import TaskTable

    try:
        spec = DeviceTable(args.devices).get(args.device)
    except KeyError as e:
        print(f"cdmpp remeasure: {e.args[0]}", file=sys.stderr)
        return 2
    tvm_env.setup(spec.threads)
    cfg = MeasureConfig(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, builders=args.builders,
                        quiet_share=args.quiet_share, max_wait_s=60 * args.max_wait_minutes)
    try:
        s = remeasure(TaskTable.load(args.task_table), args.dataset, spec, spec.make_target(), passes=args.passes,
                      min_gap_minutes=args.min_gap_minutes, budget_minutes=args.budget_minutes, cfg=cfg,
                      batch_size=args.batch_size, probe_only=args.probe_only, unstable_only=args.unstable_only,
                      random_share=args.random_share,
                      runs=set(args.run) if args.run else None, artifact_dir=_artifact_dir(args))
    except ValueError as e:
        print(f"cdmpp remeasure: {e}", file=sys.stderr)
        return 2
    print(f"done: {s['measured']} re-measured, {s['failed']} failed, {s['too_recent']} measured less than "
          f"{args.min_gap_minutes:g} min ago (left for later), {s['seconds']} s"
          + (" (stopped by budget)" if s["stopped_by_budget"] else ""))
    return 0


def cmd_bench(args) -> int:
    from cdmpp import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cdmpp", description="Latency prediction for TVM tensor programs.")
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("featurize", help="print a program's compact AST and leaf features")
    f.add_argument("program", nargs="?", help="TVMScript or workload+trace JSON file (default: a shipped conv2d)")
    f.add_argument("--target", default="llvm", help="llvm or cuda (default llvm)")
    f.set_defaults(func=cmd_featurize)

    c = sub.add_parser("collect", help="measure random schedules of network tasks on this machine (resumable)")
    c.add_argument("--task-table", default="datasets/tasks-llvm.json.gz", help="task table from `cdmpp tasks`")
    c.add_argument("--dataset", default="datasets/measurements", help="dataset folder (appended to)")
    c.add_argument("--devices", default="datasets/devices.json", help="device spec table (added to)")
    c.add_argument("--networks", help="comma-separated networks to take tasks from (default all)")
    c.add_argument("--tasks", help="comma-separated task names to keep (exact names)")
    c.add_argument("--tasks-like", metavar="SUBSTRINGS", help="comma-separated substrings: keep tasks whose name "
                                                             "contains one (e.g. conv2d)")
    c.add_argument("--target", choices=["llvm", "cuda"], default="llvm",
                   help="llvm: this CPU; cuda: this machine's GPU (device id and specs probed from it)")
    c.add_argument("--programs-from", metavar="DEVICE",
                   help="measure this device's stored programs first (twins), then new ones")
    c.add_argument("--measurer", choices=["auto", "fast", "metaschedule"], default="auto",
                   help="fast: one module per task, one runner process, adaptive repeats; metaschedule: "
                        "MetaSchedule's LocalBuilder/LocalRunner (RPC, --cache-flush, kept artifacts); "
                        "auto: fast unless --rpc-tracker or --cache-flush (default auto)")
    c.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="fast measurer: build the next tasks on the other cores while a task runs "
                        "(threads < cores only; default: on for 1-thread programs on a machine with more cores)")
    c.add_argument("--run-budget-s", type=float, default=1.0,
                   help="seconds of repeats per program: slow programs get fewer (default 1.0)")
    c.add_argument("--per-task", type=int, default=32, help="schedules per task (default 32)")
    c.add_argument("--budget-minutes", type=float, help="stop after this many minutes")
    c.add_argument("--threads", type=int, default=2, help="threads the programs run with (default 2)")
    c.add_argument("--mcpu", help="LLVM cpu to target (default: this machine's)")
    c.add_argument("--batch-size", type=int, default=32, help="programs built together (default 32)")
    c.add_argument("--builders", type=int, default=2, help="parallel build workers (default 2)")
    c.add_argument("--repeat", type=int, default=15, help="most repeats per program; the label is the fastest "
                                                          "(15; the fast measurer stops earlier once it is stable)")
    c.add_argument("--min-repeat-ms", type=int, default=15, help="minimum duration of one repeat (15)")
    c.add_argument("--cache-flush", action="store_true", help="flush the CPU cache before each repeat")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--rpc-tracker", help="HOST:PORT of a TVM RPC tracker (measure remotely)")
    c.add_argument("--rpc-key", default="", help="device key at the tracker")
    _add_artifacts_arg(c)
    _add_guard_args(c)
    c.set_defaults(func=cmd_collect)

    nz = sub.add_parser("noise", help="re-measure a device's fixed probe set and report run-to-run noise")
    nz.add_argument("--device", required=True, help="device id (datasets/devices.json) of this machine")
    nz.add_argument("--n", type=int, default=100, help="probe-set size, when it is first chosen (default 100)")
    nz.add_argument("--run", action="append", metavar="RUN_ID",
                    help="a probe set of its own among these collection runs' records (repeatable): how one "
                         "collector's labels agree with a later check")
    nz.add_argument("--dataset", default="datasets/measurements")
    nz.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    nz.add_argument("--devices", default="datasets/devices.json")
    nz.add_argument("--repeat", type=int, default=15)
    nz.add_argument("--min-repeat-ms", type=int, default=15)
    nz.add_argument("--min-gap-minutes", type=float, default=30.0,
                    help="earlier checks combined with this one (like-for-like figure) lie at least this far apart")
    _add_artifacts_arg(nz)
    _add_guard_args(nz)
    nz.set_defaults(func=cmd_noise)

    rm = sub.add_parser("remeasure", help="measure stored programs again, later; labels become the fastest "
                                          "over passes (resumable)")
    rm.add_argument("--device", required=True, help="device id (datasets/devices.json) of this machine")
    rm.add_argument("--passes", type=int, default=2, help="passes each label should have (default 2)")
    rm.add_argument("--min-gap-minutes", type=float, default=30.0,
                    help="a new pass only this long after the program's last one (default 30)")
    rm.add_argument("--budget-minutes", type=float, help="stop after this many minutes")
    rm.add_argument("--probe-only", action="store_true", help="only the device's fixed probe set (cdmpp noise)")
    rm.add_argument("--unstable-only", action="store_true",
                    help="only labels whose fastest repeat was not stable when collected (the fast measurer's "
                         "`stable` field), plus --random-share of the others")
    rm.add_argument("--random-share", type=float, default=0.02,
                    help="with --unstable-only: this fixed random share of the stable labels too, for the noise "
                         "report (default %(default)s)")
    rm.add_argument("--run", action="append", metavar="RUN_ID",
                    help="only programs first measured by this collection run (datasets/.../runs.jsonl; repeatable)")
    rm.add_argument("--dataset", default="datasets/measurements")
    rm.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    rm.add_argument("--devices", default="datasets/devices.json")
    rm.add_argument("--batch-size", type=int, default=32)
    rm.add_argument("--builders", type=int, default=2)
    rm.add_argument("--repeat", type=int, default=15)
    rm.add_argument("--min-repeat-ms", type=int, default=15)
    _add_artifacts_arg(rm)
    _add_guard_args(rm)
    rm.set_defaults(func=cmd_remeasure)

    b = sub.add_parser("bench", help="benchmarks (not tests)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bf = bsub.add_parser("featurize", help="programs per second of featurization")
    bf.add_argument("--n", type=int, default=240, help="number of sampled programs (default 240)")
    bf.add_argument("--threads", type=int, default=1, help="threads for TVM's extractor (default 1)")
    bf.add_argument("--seed", type=int, default=0)
    bf.set_defaults(func=cmd_bench)
    bc = bsub.add_parser("collect", help="collector throughput (programs/s) and where its time goes")
    bc.add_argument("--tasks", type=int, default=12, help="tasks drawn at random from the table (default 12)")
    bc.add_argument("--per-task", type=int, default=16, help="programs per task (default 16)")
    bc.add_argument("--threads", type=int, default=1, help="threads the programs run with (default 1)")
    bc.add_argument("--mcpu", help="LLVM cpu to target (default: this machine's)")
    bc.add_argument("--measurer", choices=["fast", "metaschedule"], default="fast")
    bc.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                    help="build the next tasks while one runs (default: as `cdmpp collect`)")
    bc.add_argument("--run-budget-s", type=float, default=1.0)
    bc.add_argument("--quiet-share", type=float, default=0.05,
                    help="as in `cdmpp collect` (default %(default)s)")
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument("--dataset", help="keep the records in this dataset folder (default: a temporary one)")
    bc.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    bc.add_argument("--devices", default="datasets/devices.json")
    bc.set_defaults(func=cmd_bench)
    _add_service_commands(sub, bsub)
    _add_eval_commands(sub)
    return p


# ---- evaluation and the train / sample / fine-tune workflow (cdmpp.experiments) -------------------

def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def cmd_eval(args) -> int:
    from cdmpp.experiments import EvalOptions, run_eval

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
    print(f"wrote {args.reports_dir}/{args.name}.json and .md ({report['elapsed_seconds']:.0f} s)", file=sys.stderr)
    return 0


def cmd_protocol(args) -> int:
    import shlex
    import tomllib

    import dataclasses
    import json

    from cdmpp.protocol import ProtocolOptions, aggregate, markdown, run_protocol, summary_markdown

    overrides = tomllib.loads("\n".join(args.set)) if args.set else {}
    opts = ProtocolOptions(dataset=args.dataset, task_table=args.task_table, devices=args.devices,
                           device_ids=_csv(args.device_ids), target_device=args.target_device,
                           settings=_csv(args.settings), seeds=[int(s) for s in _csv(args.seeds)], ks=_csv(args.k),
                           samplers=_csv(args.samplers), methods=_csv(args.methods), recipe=args.recipe,
                           overrides=overrides, label=args.label, minutes=args.minutes, runs=args.runs,
                           peer_minutes=args.peer_minutes)
    command = "cdmpp " + shlex.join(sys.argv[1:])
    if args.summarize_only:  # rows already in --runs (e.g. a run of more peers appended): summary only
        summary = aggregate(opts.runs, command)
        summary["options"] = {**dataclasses.asdict(opts)}
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump(summary, f, indent=1)
    else:
        summary = run_protocol(opts, jobs=args.jobs, command=command, summary_path=args.summary or None)
    if args.summary:
        with open(os.path.splitext(args.summary)[0] + ".md", "w") as f:
            f.write(summary_markdown(summary))
    print(markdown(summary))
    return 0


def _refuse_overwrite(out: str, force: bool, command: str) -> bool:
    """A trained checkpoint is never replaced by accident: the caller must pass --force."""
    if os.path.exists(os.path.join(out, "predictor.json")) and not force:
        print(f"cdmpp {command}: {out} already holds a checkpoint; pass --force to replace it", file=sys.stderr)
        return True
    return False


def cmd_train(args) -> int:
    from cdmpp.experiments import train_checkpoint

    if _refuse_overwrite(args.out, args.force, "train"):
        return 2
    try:
        model = train_checkpoint(args.recipe, args.dataset, args.out, args.task_table, args.devices,
                                 args.max_minutes, args.val, args.seed, args.limit,
                                 device_ids=_csv(args.device_ids) or None,
                                 exclude_networks=_csv(args.exclude_networks) or None)
    except ValueError as e:
        print(f"cdmpp train: {e}", file=sys.stderr)
        return 2
    s = model.summary
    print(f"saved {s['model_version']} to {args.out}: {s['n_train']} train / {s['n_val']} val programs, "
          f"val MAPE {100 * s['val']['mape']:.1f} %, {s['train_seconds']} s")
    return 0


def cmd_sample(args) -> int:
    from cdmpp.experiments import sample_ids

    ids = sample_ids(args.k, args.pool, args.device, args.model, args.sampler, args.task_table, args.seed)
    text = "\n".join(ids) + ("\n" if ids else "")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {len(ids)} record ids to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0 if ids else 1


def cmd_finetune(args) -> int:
    from cdmpp.experiments import finetune_checkpoint

    if _refuse_overwrite(args.out, args.force, "finetune"):
        return 2
    with open(args.ids) as f:
        ids = f.read().split()
    try:
        model = finetune_checkpoint(args.model, args.dataset, args.device, ids, args.out, args.steps,
                                    args.task_table, args.devices, scope=args.scope)
    except (ValueError, KeyError) as e:
        print(f"cdmpp finetune: {e}", file=sys.stderr)
        return 2
    print(f"saved {model.summary['model_version']} to {args.out} "
          f"({model.summary['finetune']['n']} programs measured on {args.device})")
    return 0


def _add_eval_commands(sub) -> None:
    data = argparse.ArgumentParser(add_help=False)
    data.add_argument("--dataset", default="datasets/measurements", help="dataset folder")
    data.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    data.add_argument("--devices", default="datasets/devices.json", help="device spec table")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--force", action="store_true", help="train/finetune: replace an existing checkpoint")

    e = sub.add_parser("eval", parents=[data], help="train cdmpp, ablations and peers on one split; write a report")
    e.add_argument("--name", required=True, help="report name: reports/NAME.json and .md")
    e.add_argument("--split", choices=("random", "cross-model", "cross-device"), default="random")
    e.add_argument("--held-out", default="resnet18,mobilenet_v2,bert_tiny", help="cross-model: networks to hold out")
    e.add_argument("--target-device", help="cross-device: the device to adapt to")
    e.add_argument("--k", default="0,16,64", help="cross-device: shot counts (0 = zero-shot)")
    e.add_argument("--recipe", default="default", help="training recipe (train/NAME.toml)")
    e.add_argument("--peers", default="xgb,mlp", help="peers: xgb, mlp (empty: none)")
    e.add_argument("--ablations", default="no-pe,no-da,random-sampler", help="no-pe, no-da, random-sampler")
    e.add_argument("--max-minutes", type=float, default=8.0, help="time budget for all training (default 8)")
    e.add_argument("--minutes-per-method", type=float,
                   help="instead of sharing --max-minutes: every trained model gets this cap (fairer, slower)")
    e.add_argument("--reports-dir", default="reports")
    e.add_argument("--limit", type=int, help="use only the first N records (smoke runs)")
    e.add_argument("--train-fraction", type=float, default=1.0,
                   help="random/cross-model: train on this share of the training programs, same test set "
                        "(a learning curve; default 1)")
    e.add_argument("--progress", action="store_true", help="show progress bars")
    e.add_argument("--threads", type=int, default=1, help="torch/XGBoost threads per method (default 1)")
    e.set_defaults(func=cmd_eval)

    pr = sub.add_parser("protocol", parents=[data], help="the evaluation protocol (docs/evaluation.md): every "
                                                         "setting and seed, cdmpp vs peers; writes a summary JSON")
    pr.add_argument("--settings", default=",".join(("random-new", "cross-model", "cross-device-new", "cross-device-seen")))
    pr.add_argument("--seeds", default="0,1,2", help="split and model seeds (default 0,1,2)")
    pr.add_argument("--k", default="0,16,64,5%", help="cross-device shot counts; N%% = share of the target's programs")
    pr.add_argument("--samplers", default="kmeans,random")
    pr.add_argument("--methods", default="cdmpp,pooled-gbt",
                    help="cdmpp, pooled-gbt (with the twin-ratio baseline), pooled-gbt-roofline (the GBT on log(latency / roofline bound)), xgb (TVM's XGBModel), mlp (Tenset MLP)")
    pr.add_argument("--peer-minutes", type=float, default=2.0, help="cap on each xgb / mlp training run (default 2)")
    pr.add_argument("--recipe", default="default")
    pr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a training setting on top of the recipe (TOML value; repeatable), e.g. pooling=\"sum\"")
    pr.add_argument("--label", default="cdmpp", help="row name of the cdmpp model (ablations)")
    pr.add_argument("--minutes", type=float, default=4.0, help="cap on each cdmpp training run (default 4)")
    pr.add_argument("--device-ids", default="amd-epyc-znver4-2t/llvm-avx512,amd-epyc-znver4-1t/llvm-avx512",
                    help="devices whose programs are used (pinned, so added data does not move the numbers)")
    pr.add_argument("--target-device", default="amd-epyc-znver4-1t/llvm-avx512")
    pr.add_argument("--runs", default="reports/protocol-runs.jsonl", help="every scored row is appended here")
    pr.add_argument("--summary", default="reports/summary.json", help="summary of --runs (empty: none)")
    pr.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (1 thread each)")
    pr.add_argument("--summarize-only", action="store_true",
                    help="train nothing: rewrite the summary (.json and .md) from the rows already in --runs")
    pr.set_defaults(func=cmd_protocol)

    t = sub.add_parser("train", parents=[data], help="train on a whole dataset (all devices) and save a checkpoint")
    t.add_argument("--recipe", default="default")
    t.add_argument("--out", default="cdmpp/models/default", help="checkpoint folder")
    t.add_argument("--max-minutes", type=float, help="override the recipe's time budget")
    t.add_argument("--val", type=float, default=0.1, help="validation fraction per device (default 0.1)")
    t.add_argument("--limit", type=int, help="use only the first N records")
    t.add_argument("--device-ids", help="comma-separated devices to train on (default: every device in the data)")
    t.add_argument("--exclude-networks", help="comma-separated networks whose tasks are left out of training (a "
                                              "checkpoint for benchmarks on networks it never saw)")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("sample", help="choose k programs to measure on a new device (KMeans on embeddings)")
    s.add_argument("--k", type=int, required=True)
    s.add_argument("--pool", required=True, help="dataset folder whose programs are the candidates")
    s.add_argument("--device", required=True, help="the device to measure on (its programs are skipped)")
    s.add_argument("--model", help="checkpoint whose embeddings to cluster (default: model-free features)")
    s.add_argument("--sampler", choices=("kmeans", "random"), default="kmeans")
    s.add_argument("--out", help="write the record ids here (default: stdout)")
    s.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_sample)

    ft = sub.add_parser("finetune", parents=[data], help="fine-tune a checkpoint with programs measured on a device")
    ft.add_argument("--model", required=True, help="checkpoint folder")
    ft.add_argument("--device", required=True)
    ft.add_argument("--ids", required=True, help="file of record ids (from `cdmpp sample`)")
    ft.add_argument("--out", required=True, help="new checkpoint folder")
    ft.add_argument("--steps", type=int, default=100)
    ft.add_argument("--scope", choices=["head", "all"], default="head",
                    help="weights to tune: decoder + device encoder (head, default; better on the cross-device "
                         "report) or all")
    ft.set_defaults(func=cmd_finetune)


# ---- the HTTP service and compiler integration (cdmpp.service, cdmpp.bench_serve, cdmpp.bench_tune) -----

def cmd_serve(args) -> int:
    """Run uvicorn with the app factory; settings travel as CDMPP_* variables, so every worker sees them."""
    import uvicorn

    if args.model:
        os.environ["CDMPP_MODEL"] = args.model
    if args.featurize_procs < 1:
        print("cdmpp serve: --featurize-procs must be at least 1 (programs are never parsed in the server "
              "process)", file=sys.stderr)
        return 2
    os.environ["CDMPP_FEATURIZE_PROCS"] = str(args.featurize_procs)
    if args.allow_tvmscript:
        os.environ["CDMPP_ALLOW_TVMSCRIPT"] = "1"
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"cdmpp serve: --token-env {args.token_env} is not set or empty", file=sys.stderr)
            return 2
        os.environ["CDMPP_TOKEN"] = token
    uvicorn.run("cdmpp.service.app:create_app", factory=True, host=args.host, port=args.port,
                workers=args.workers, access_log=not args.no_access_log, log_level=args.log_level)
    return 0


def cmd_bench_serve(args) -> int:
    from cdmpp import bench_serve

    return bench_serve.main(args)


def _add_network_args(p) -> None:
    p.add_argument("--device", default="amd-epyc-znver4-2t/llvm-avx512", help="device id (default %(default)s)")
    p.add_argument("--schedules", default="best-measured",
                   help="best-measured (the fastest stored program of each task on the device), default "
                        "(TVM's unscheduled code) or a MetaSchedule database folder (default %(default)s)")
    p.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    p.add_argument("--dataset", default="datasets/measurements")
    p.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")


def cmd_network(args) -> int:
    import dataclasses
    import json

    from cdmpp import network as net
    from cdmpp.devices import DeviceTable
    from cdmpp.predictor import Predictor
    from cdmpp.zoo.tasks import TaskTable

    predictor = Predictor.load(args.model)
    target = DeviceTable().get(args.device).make_target()
    programs = net.task_programs(args.network, TaskTable.load(args.task_table), args.schedules, args.device,
                                 args.dataset, target)
    p = net.predict_network(predictor, args.network, args.device, programs)
    if args.json:
        print(json.dumps(dataclasses.asdict(p), indent=1))
    else:
        for t in p.tasks:
            print(f"{t['weight']:3d} x {1e3 * t['seconds']:9.4f} ms  {t['source']:13s} {t['task']}")
        print(f"{p.network} on {p.device}: {1e3 * p.seconds:.3f} ms (90 % interval {1e3 * p.lo90:.3f}-"
              f"{1e3 * p.hi90:.3f} ms), {len(p.tasks)} tasks, {sum(t['weight'] for t in p.tasks)} kernel calls")
    return 0


def cmd_bench_network(args) -> int:
    from cdmpp import bench_network

    return bench_network.main(args)


def cmd_bench_costmodel(args) -> int:
    import json

    from cdmpp import bench_costmodel

    tasks = _csv(args.tasks) or bench_costmodel.DEFAULT_TASKS
    r = bench_costmodel.run(tasks, args.n, [int(t) for t in _csv(args.threads)], args.model, args.device,
                            args.dataset, args.task_table, args.seed)
    print(json.dumps(r, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


def cmd_bench_tune(args) -> int:
    from cdmpp import bench_tune

    return bench_tune.main(args)


def _add_service_commands(sub, bsub) -> None:
    sv = sub.add_parser("serve", help="serve predictions over HTTP (FastAPI + uvicorn)",
                        description="Environment: CDMPP_MODEL, CDMPP_MAX_BATCH, CDMPP_MAX_BODY_BYTES, CDMPP_TIMEOUT_S, "
                                    "CDMPP_TOKEN, CDMPP_THREADS, CDMPP_TORCH_THREADS, CDMPP_CACHE_SIZE, CDMPP_FEATURIZE_PROCS, "
                                    "CDMPP_ALLOW_TVMSCRIPT, CDMPP_ITEM_CPU_S, CDMPP_WORKER_MEM_MB, CDMPP_WORKER_USER "
                                    "(serve/README.md, with the threat model)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--workers", type=int, default=1, help="worker processes (each loads the model; default 1)")
    sv.add_argument("--model", help="checkpoint folder (default: $CDMPP_MODEL or the shipped model)")
    sv.add_argument("--featurize-procs", type=int, default=os.cpu_count() or 1,
                    help="sandbox processes per worker that parse and featurize new programs (default: one per "
                         "CPU; at least 1: request content is never parsed in the server process)")
    sv.add_argument("--allow-tvmscript", action="store_true",
                    help="accept TVMScript text over HTTP (off by default: it is parsed by running Python, so "
                         "turn it on only when every caller is trusted); workload+trace is always accepted")
    sv.add_argument("--token-env", help="name of an environment variable holding the bearer token to require")
    sv.add_argument("--no-access-log", action="store_true", help="do not log every request")
    sv.add_argument("--log-level", default="info")
    sv.set_defaults(func=cmd_serve)

    bs = bsub.add_parser("serve", help="throughput and latency of a real server under compiler-like load")
    bs.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    bs.add_argument("--clients", type=int, default=16)
    bs.add_argument("--batch", type=int, default=64, help="programs per request (default 64)")
    bs.add_argument("--batches", type=int, default=160, help="requests in the mixed phase (default 160)")
    bs.add_argument("--cold-batches", type=int, default=16, help="requests in the cold phase (default 16)")
    bs.add_argument("--repeat-share", type=float, default=0.9, help="share of re-asked programs per batch (0.9)")
    bs.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    bs.add_argument("--threads", type=int, default=2, help="prediction threads per worker (default 2)")
    bs.add_argument("--featurize-procs", type=int, default=os.cpu_count() or 1,
                    help="featurizer processes per server worker (default: one per CPU)")
    bs.add_argument("--form", choices=["trace", "tvmscript"], default="trace",
                    help="wire form of programs: workload+trace (shared workload) or TVMScript text")
    bs.add_argument("--duration", type=float, default=120.0, help="time bound per phase in seconds (default 120)")
    bs.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    bs.add_argument("--device", help="device id (default: the model's first llvm device)")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--in-process", action="store_true",
                    help="also parse, featurize and predict the cold phase's programs in this process on one thread, "
                         "after the server stopped: the per-program cost of the wire path against it "
                         "(compare like with like: --clients 1 --featurize-procs 1)")
    bs.add_argument("--json", help="also write the result here")
    bs.set_defaults(func=cmd_bench_serve)

    bt = bsub.add_parser("tune", help="MetaSchedule tuning with cdmpp vs XGBoost vs random cost models")
    bt.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    bt.add_argument("--trials", type=int, default=256, help="measured trials per task, cost model and seed "
                                                             "(default %(default)s)")
    bt.add_argument("--per-iter", type=int, default=16, help="trials per search iteration (default 16)")
    bt.add_argument("--cost-models", default="cdmpp,cdmpp-frozen,xgb,random",
                    help="comma-separated: cdmpp (pretrained, learns from the tuner's measurements), cdmpp-frozen, "
                         "xgb, xgb-nowarmup, random (default %(default)s)")
    bt.add_argument("--tasks", help="comma-separated network@batch/task_name (default: 5 tasks of the held-out "
                                    "networks resnet18, mobilenet_v2, bert_tiny)")
    bt.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    bt.add_argument("--device", help="device id of this machine in the model (default: matched by mcpu and threads)")
    bt.add_argument("--threads", type=int, default=2, help="threads the tuned programs run with (default 2)")
    bt.add_argument("--no-finetune", action="store_true", help="cdmpp without online fine-tuning")
    bt.add_argument("--seeds", default="0,1", help="comma-separated search seeds (default %(default)s)")
    bt.add_argument("--out", default="reports/tune.json")
    bt.set_defaults(func=cmd_bench_tune)

    bn = bsub.add_parser("network", help="predicted vs measured end-to-end latency of zoo networks on this machine")
    bn.add_argument("--networks", help="comma-separated network@batch (default: every network at batch 1)")
    _add_network_args(bn)
    bn.add_argument("--out", default="reports/network.json")
    bn.set_defaults(func=cmd_bench_network)

    nw = sub.add_parser("network", help="predict a network's latency: weighted sum over its tasks' programs")
    nw.add_argument("network", help="network@batch from the task table, e.g. resnet18@1")
    _add_network_args(nw)
    nw.add_argument("--json", action="store_true", help="print the prediction with every task as JSON")
    nw.set_defaults(func=cmd_network)

    bc = bsub.add_parser("costmodel", help="programs/s of CDMPPCostModel.predict vs TVM's XGBModel on the same new "
                                           "candidates, at each tuning thread count")
    bc.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    bc.add_argument("--n", type=int, default=512, help="new candidates, spread over the tasks (default 512)")
    bc.add_argument("--threads", default="1,2", help="comma-separated tuning-context thread counts (default 1,2)")
    bc.add_argument("--tasks", help="comma-separated network@batch/task_name with measured programs in the dataset "
                                    "(default: a conv2d, a dense, a softmax, a depthwise conv2d)")
    bc.add_argument("--device", default="amd-epyc-znver4-2t/llvm-avx512",
                    help="device id: its stored programs train XGBModel (default amd-epyc-znver4-2t/llvm-avx512)")
    bc.add_argument("--dataset", default="datasets/measurements")
    bc.add_argument("--task-table", default="datasets/tasks-llvm.json.gz")
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument("--json", help="also write the result here")
    bc.set_defaults(func=cmd_bench_costmodel)


@contextlib.contextmanager
def stop_signals_interrupt():
    """SIGTERM (``kill``, process managers) stops a command the way Ctrl-C does, so that its cleanup runs:
    by default it ends Python at once, and a stopped collection left its batch of build folders behind.
    While a batch is measured, the Measurer stops at its next build or run instead (``request_stop``).
    Yields the list of signals received: a KeyboardInterrupt raised while TVM calls back into Python
    comes back out of TVM as a RuntimeError."""
    from cdmpp.collect import STOP, request_stop

    received: list[int] = []

    def interrupt(signum, frame):
        received.append(signum)
        if not request_stop():
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        STOP.clear()


def main(argv: list[str] | None = None) -> int:
    """Bad input (unknown device, missing file, malformed program or dataset) ends with one line that
    says what is wrong and exit status 2; a stop signal with status 130; anything else is a bug and keeps
    its traceback."""
    args = build_parser().parse_args(argv)
    with stop_signals_interrupt() as received:
        try:
            return int(args.func(args) or 0)
        except (ValueError, KeyError, FileNotFoundError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            print(f"cdmpp {args.command}: {msg}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, RuntimeError) as e:
            if isinstance(e, RuntimeError) and not received:
                raise
            print(f"cdmpp {args.command}: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
