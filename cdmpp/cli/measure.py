"""``cdmpp featurize | collect | noise | remeasure | bench featurize/collect``: programs and measurements."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib import resources

from cdmpp import defaults


def _sample_path(name: str = "conv2d.tvmscript") -> str:
    return str(resources.files("cdmpp") / "samples" / name)


def cmd_assembly(args) -> int:
    from cdmpp.records.builds import build_device

    try:
        n = build_device(args.device, args.dataset, args.out or defaults.assembly_dir(args.dataset), args.task_table,
                         args.part, args.parts, innermost=args.innermost)
    except (KeyError, ValueError) as e:
        print(f"cdmpp assembly: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    print(f"built {n} programs")
    return 0


def cmd_featurize(args) -> int:
    from cdmpp.program.features import FEATURE_NAMES, compact_ast_of, featurize
    from cdmpp.program.inputs import ProgramError, load_program

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

    if args.artifacts == "none":
        return None
    return args.artifacts or os.path.join(defaults.cache_dir(args.dataset), "artifacts")


def _add_artifacts_arg(parser) -> None:
    parser.add_argument("--artifacts", metavar="DIR",
                        help="keep built programs here so later passes skip the build (default: "
                             "~/.cache/cdmpp/<dataset>/artifacts, ~10 KB each; 'none' to keep nothing)")


def cmd_collect(args) -> int:
    from cdmpp.devices.probe import probe_local_cpu
    from cdmpp.devices.table import DeviceTable
    from cdmpp.measure.campaigns import collect
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.program import tvm_env
    from cdmpp.zoo.tasks import TaskTable

    # the budget counts from here: probing, loading and waiting for a quiet machine are part of the command
    deadline = time.monotonic() + 60 * args.budget_minutes if args.budget_minutes else None
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
    if args.from_search and (args.programs_from or args.rpc_tracker or args.cache_flush or args.measurer == "metaschedule"):
        print("cdmpp collect: --from-search measures locally with the fast measurer: drop --programs-from, "
              "--rpc-tracker, --cache-flush and --measurer metaschedule", file=sys.stderr)
        return 2
    devices = DeviceTable(args.devices)
    if args.rpc_tracker or args.device:  # a remote device: its spec, probed on it, is in the table
        if not (args.rpc_tracker and args.device and args.rpc_key):
            print("cdmpp collect: --rpc-tracker, --rpc-key and --device go together (a local collect probes this "
                  "machine)", file=sys.stderr)
            return 2
        if args.device not in devices.ids():
            print(f"cdmpp collect: --device {args.device}: not in {args.devices}; probe the remote machine there "
                  "(`cdmpp devices probe --threads N > spec.json`) and add it here (`cdmpp devices add spec.json`)",
                  file=sys.stderr)
            return 2
        device = devices.get(args.device)
        target = device.make_target()
    elif args.target == "cuda":
        from cdmpp.devices.cuda import probe_cuda_gpu

        device = probe_cuda_gpu()
        target = device.make_target()
    else:
        target = tvm_env.make_target("llvm", num_cores=threads, mcpu=args.mcpu)
        # a probe under load is taken again after up to two short waits: together at most a tenth of the budget
        wait_s = 5.0 if deadline is None else min(5.0, 60 * args.budget_minutes / 10 / 2)
        device = probe_local_cpu(threads, mcpu=args.mcpu, wait_s=wait_s)
    if not args.rpc_tracker:
        _store_probe(devices, device)
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
    if args.from_search:
        return _collect_from_search(args, table, device, target, cfg, deadline)
    print(f"collecting {len(table)} tasks x {args.per_task} schedules on {device.id} into {args.dataset}"
          + (f", {args.programs_from}'s programs first" if args.programs_from else ""), file=sys.stderr)
    s = collect(table, args.dataset, device, target, per_task=args.per_task, budget_minutes=args.budget_minutes,
                cfg=cfg, batch_size=args.batch_size, seed=args.seed, rpc=rpc, artifact_dir=_artifact_dir(args),
                programs_from=args.programs_from,
                measurer=None if args.measurer == "auto" else args.measurer, overlap=args.overlap, deadline=deadline)
    print(f"done: {s['measured']} measured, {s['failed']} failed, {s['skipped_done']} already stored, "
          f"{s['tasks']} tasks, {s['seconds']} s" + (" (stopped by budget)" if s["stopped_by_budget"] else "")
          + (f", {s['programs_per_s']} programs/s; seconds spent: {s['times']}" if "times" in s else ""))
    return 0


def _collect_from_search(args, table, device, target, cfg, deadline) -> int:
    from cdmpp.measure.search import collect_from_search

    print(f"searching {len(table)} tasks x {args.per_task} trials ({args.search_cost_model} cost model) on {device.id} "
          f"into {args.dataset}", file=sys.stderr)
    s = collect_from_search(table, args.dataset, device, target, args.per_task, cfg, per_iter=args.search_per_iter,
                            cost_model=args.search_cost_model, seed=args.seed, deadline=deadline,
                            shared_model=args.search_shared_model)
    print(f"done: {s['measured']} measured, {s['failed']} failed, {s['skipped_done']} already stored, "
          f"{s['tasks_searched']} of {s['tasks']} tasks searched, {s['seconds']} s"
          + (" (stopped by budget)" if s["stopped_by_budget"] else "") + f", {s['programs_per_s']} programs/s")
    return 0


def _store_probe(devices, device) -> None:
    """Add a newly probed device to the table; replace a stored probe of it that was taken under load by a
    clean one. A probe under load is stored with its warning (and said here), never silently."""
    old = devices.get(device.id) if device.id in devices else None
    warning = device.probe.get("warning")
    if old is None:
        devices.add(device)
    elif old.probe.get("under_load") and not device.probe.get("under_load"):
        device.relation = old.relation
        devices.replace(device)
        print(f"{device.id}: its stored specs were probed under load; replaced by this quiet probe "
              f"(memory bandwidth {old.mem_bw_gbs} -> {device.mem_bw_gbs} GB/s)", file=sys.stderr)
        return
    else:
        warning = None  # the stored spec stands; this probe was only to know which device this is
    if warning:
        print(f"warning: {device.id}: {warning}", file=sys.stderr)


def _add_guard_args(parser) -> None:
    """The quiet-machine rule of every measuring command (``cdmpp.devices.guard.CpuGuard``)."""
    parser.add_argument("--quiet-share", type=float, default=0.05, metavar="SHARE",
                        help="programs run only while other processes use less than this share of all cores; "
                             "a run phase they exceeded it in is measured again (default %(default)s)")
    parser.add_argument("--max-wait-minutes", type=float, default=30.0, metavar="MIN",
                        help="longest wait for a quiet machine before measuring anyway (such records are "
                             "marked disturbed and measured again later; default %(default)s)")


def cmd_data(args) -> int:
    from cdmpp.records.dataset import summarize

    if not os.path.isdir(args.dataset):
        raise FileNotFoundError(f"no dataset folder at {args.dataset} (pass --dataset DIR)")
    s = summarize(args.dataset)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    head = ("device", "labelled", "search candidates", "twins", "failed", "disturbed", "tasks")
    rows = [(d, *(f"{v[k]:,}" for k in ("programs", "search_candidates", "twins", "failed", "disturbed", "tasks")))
            for d, v in s["devices"].items()]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for line in [head, *rows]:
        print("  ".join(x.ljust(w) if j == 0 else x.rjust(w) for j, (x, w) in enumerate(zip(line, widths))))
    total = sum(v["programs"] for v in s["devices"].values())
    print(f"\n{total:,} labelled programs on {len(rows)} devices in {args.dataset} (twins: the same program labelled "
          f"on another device too; failed and disturbed records are kept, not labels)")
    for p in s["problems"][:5]:
        print(f"cdmpp data: {p}", file=sys.stderr)
    return 0


def cmd_noise(args) -> int:
    from cdmpp.devices.table import DeviceTable
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.remeasure import remeasure_noise
    from cdmpp.program import tvm_env
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
    from cdmpp.devices.table import DeviceTable
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.remeasure import remeasure
    from cdmpp.program import tvm_env
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
        hashes = None
        if args.implausible_twins:
            from cdmpp.measure.remeasure import implausible_twins

            hashes = implausible_twins(args.dataset, spec, DeviceTable(args.devices).get(args.implausible_twins))
            print(f"{len(hashes)} programs with twin labels no thread count explains")
        s = remeasure(TaskTable.load(args.task_table), args.dataset, spec, spec.make_target(), passes=args.passes,
                      min_gap_minutes=args.min_gap_minutes, budget_minutes=args.budget_minutes, cfg=cfg,
                      batch_size=args.batch_size, probe_only=args.probe_only, unstable_only=args.unstable_only,
                      random_share=args.random_share,
                      runs=set(args.run) if args.run else None, artifact_dir=_artifact_dir(args), hashes=hashes)
    except (ValueError, KeyError) as e:
        print(f"cdmpp remeasure: {e.args[0]}", file=sys.stderr)
        return 2
    print(f"done: {s['measured']} re-measured, {s['failed']} failed, {s['too_recent']} measured less than "
          f"{args.min_gap_minutes:g} min ago (left for later), {s['seconds']} s"
          + (" (stopped by budget)" if s["stopped_by_budget"] else ""))
    return 0


def cmd_bench(args) -> int:
    from cdmpp.bench import throughput as bench

    return bench.main(args)


def add_measure_commands(sub):
    """The commands of this module; returns the ``bench`` sub-parsers, which other modules add to."""

    f = sub.add_parser("featurize", help="print a program's compact AST and leaf features")
    f.add_argument("program", nargs="?", help="TVMScript or workload+trace JSON file (default: a shipped conv2d)")
    f.add_argument("--target", default="llvm", help="llvm or cuda (default llvm)")
    f.set_defaults(func=cmd_featurize)

    c = sub.add_parser("collect", help="measure random schedules of network tasks on this machine (resumable)")
    c.add_argument("--task-table", default=defaults.TASK_TABLE, help="task table from `python -m cdmpp.zoo.tasks`")
    c.add_argument("--dataset", default=defaults.DATASET, help="dataset folder (appended to)")
    c.add_argument("--devices", default=defaults.DEVICES, help="device spec table (added to)")
    c.add_argument("--networks", help="comma-separated networks to take tasks from (default all)")
    c.add_argument("--tasks", help="comma-separated task names to keep (exact names)")
    c.add_argument("--tasks-like", metavar="SUBSTRINGS", help="comma-separated substrings: keep tasks whose name "
                                                             "contains one (e.g. conv2d)")
    c.add_argument("--target", choices=["llvm", "cuda"], default="llvm",
                   help="llvm: this CPU; cuda: this machine's GPU (device id and specs probed from it)")
    c.add_argument("--programs-from", metavar="DEVICE",
                   help="measure this device's stored programs first (twins), then new ones")
    c.add_argument("--from-search", action="store_true",
                   help="instead of random schedules: run MetaSchedule's evolutionary search per task (--per-task "
                        "trials) and record every candidate it measures, tagged as searched (fast measurer)")
    c.add_argument("--search-cost-model", choices=["cdmpp", "xgb", "random"], default="cdmpp",
                   help="with --from-search: the model steering the search (default cdmpp, the shipped model)")
    c.add_argument("--search-per-iter", type=int, default=64,
                   help="with --from-search: candidates measured per search iteration (default 64, ms.tune_tir's)")
    c.add_argument("--search-shared-model", action=argparse.BooleanOptionalAction, default=True,
                   help="with --from-search: one cost model learns from every task, as ms.tune_tir shares it "
                        "(default); --no-search-shared-model: a fresh one per task. Tagged in each record")
    c.add_argument("--measurer", choices=["auto", "fast", "metaschedule"], default="auto",
                   help="fast: one module per task, one runner process, adaptive repeats; metaschedule: "
                        "MetaSchedule's LocalBuilder/LocalRunner (RPC, --cache-flush, kept artifacts); "
                        "auto: fast unless --rpc-tracker or --cache-flush (default auto)")
    c.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="fast measurer: build the next tasks on the other cores while a task runs "
                        "(threads < cores only; default: on for 1-thread CPU and for GPU programs on a machine with more cores)")
    c.add_argument("--run-budget-s", type=float, default=1.0,
                   help="seconds of repeats per program: slow programs get fewer (default 1.0)")
    c.add_argument("--per-task", type=int, default=32, help="schedules per task (default 32)")
    c.add_argument("--budget-minutes", type=float, help="stop after this many minutes, counted from the start: "
                                                      "probing and waiting for a quiet machine included")
    c.add_argument("--threads", type=int, default=2, help="threads the programs run with (default 2)")
    c.add_argument("--mcpu", help="LLVM cpu to target (default: this machine's)")
    c.add_argument("--batch-size", type=int, default=32, help="programs built together (default 32)")
    c.add_argument("--builders", type=int, default=2, help="parallel build workers (default 2)")
    c.add_argument("--repeat", type=int, default=15, help="most repeats per program; the label is the fastest "
                                                          "(15; the fast measurer stops earlier once it is stable)")
    c.add_argument("--min-repeat-ms", type=int, default=15, help="minimum duration of one repeat (15)")
    c.add_argument("--cache-flush", action="store_true", help="flush the CPU cache before each repeat")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--rpc-tracker", help="HOST:PORT of a TVM RPC tracker: build here, run on its servers "
                                         "(with --rpc-key and --device; README: a measurement farm)")
    c.add_argument("--rpc-key", default="", help="the servers' key at the tracker")
    c.add_argument("--device", metavar="ID", help="with --rpc-tracker: the remote device's id in --devices (its "
                                                  "spec probed there, `cdmpp devices add`ed here); records and "
                                                  "target are that device's")
    _add_artifacts_arg(c)
    _add_guard_args(c)
    c.set_defaults(func=cmd_collect)

    asm = sub.add_parser("assembly", help="build a device's measured programs for its target and count their "
                                          "instructions (the inputs of a recipe with assembly_counts; resumable)")
    asm.add_argument("--device", required=True, metavar="ID", help="the device whose programs to build (its target)")
    asm.add_argument("--dataset", default=defaults.DATASET, help="dataset folder (read)")
    asm.add_argument("--task-table", default=defaults.TASK_TABLE, help="task table from `python -m cdmpp.zoo.tasks`")
    asm.add_argument("--out", help="counts folder (default: assembly beside the dataset folder)")
    asm.add_argument("--part", type=int, default=0, help="build this part of the programs (0-based; default 0)")
    asm.add_argument("--parts", type=int, default=1, help="of this many, e.g. one process per core (default 1)")
    asm.add_argument("--innermost", action="store_true",
                     help="build again the programs built before their innermost loops' counts were kept (6 Dec), "
                          "for those counts only")
    asm.set_defaults(func=cmd_assembly)

    dt = sub.add_parser("data", help="what a dataset holds per device: labelled programs, search candidates, "
                                     "twins, failed and disturbed records, tasks")
    dt.add_argument("--dataset", default=defaults.DATASET, help="dataset folder")
    dt.add_argument("--json", action="store_true", help="print JSON (with labelled programs per network)")
    dt.set_defaults(func=cmd_data)

    nz = sub.add_parser("noise", help="re-measure a device's fixed probe set and report run-to-run noise")
    nz.add_argument("--device", required=True, help="device id (datasets/devices.json) of this machine")
    nz.add_argument("--n", type=int, default=100, help="probe-set size, when it is first chosen (default 100)")
    nz.add_argument("--run", action="append", metavar="RUN_ID",
                    help="a probe set of its own among these collection runs' records (repeatable): how one "
                         "collector's labels agree with a later check")
    nz.add_argument("--dataset", default=defaults.DATASET)
    nz.add_argument("--task-table", default=defaults.TASK_TABLE)
    nz.add_argument("--devices", default=defaults.DEVICES)
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
    rm.add_argument("--implausible-twins", metavar="DEVICE",
                    help="only programs whose label here and on DEVICE (this CPU at another thread count) imply a "
                         "speedup no thread count gives (more threads > 1.5x slower, or > 1.3x the thread ratio "
                         "faster; kernels >= 100 us); each gets one more pass")
    rm.add_argument("--run", action="append", metavar="RUN_ID",
                    help="only programs first measured by this collection run (datasets/.../runs.jsonl; repeatable)")
    rm.add_argument("--dataset", default=defaults.DATASET)
    rm.add_argument("--task-table", default=defaults.TASK_TABLE)
    rm.add_argument("--devices", default=defaults.DEVICES)
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
    bc.add_argument("--task-table", default=defaults.TASK_TABLE)
    bc.add_argument("--devices", default=defaults.DEVICES)
    bc.set_defaults(func=cmd_bench)
    return bsub
