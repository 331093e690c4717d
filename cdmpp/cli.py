"""The ``cdmpp`` command line. Every command imports TVM/torch lazily so ``cdmpp --help`` stays fast."""

from __future__ import annotations

import argparse
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


def cmd_collect(args) -> int:
    from cdmpp import tvm_env
    from cdmpp.collect import MeasureConfig, collect
    from cdmpp.devices import DeviceTable, probe_local_cpu
    from cdmpp.zoo.tasks import TaskTable

    tvm_env.setup(args.threads)
    table = TaskTable.load(args.task_table)
    nets = args.networks.split(",") if args.networks else None
    names = args.tasks.split(",") if args.tasks else None
    if nets or names:
        table = table.filter(networks=nets, task_names=names)
    if len(table) == 0:
        print("cdmpp collect: no task matches the filters", file=sys.stderr)
        return 2
    target = tvm_env.make_target("llvm", num_cores=args.threads, mcpu=args.mcpu)
    device = probe_local_cpu(args.threads, mcpu=args.mcpu)
    devices = DeviceTable(args.devices)
    if device.id not in devices.ids():
        devices.add(device)
    rpc = None
    if args.rpc_tracker:
        host, port = args.rpc_tracker.rsplit(":", 1)
        rpc = (host, int(port), args.rpc_key)
    cfg = MeasureConfig(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, cache_flush=args.cache_flush,
                        builders=args.builders)
    print(f"collecting {len(table)} tasks x {args.per_task} schedules on {device.id} into {args.dataset}", file=sys.stderr)
    s = collect(table, args.dataset, device, target, per_task=args.per_task, budget_minutes=args.budget_minutes,
                cfg=cfg, batch_size=args.batch_size, seed=args.seed, rpc=rpc)
    print(f"done: {s['measured']} measured, {s['failed']} failed, {s['skipped_done']} already stored, "
          f"{s['tasks']} tasks, {s['seconds']} s" + (" (stopped by budget)" if s["stopped_by_budget"] else ""))
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
    c.add_argument("--tasks", help="comma-separated task names (or substrings) to keep")
    c.add_argument("--per-task", type=int, default=32, help="schedules per task (default 32)")
    c.add_argument("--budget-minutes", type=float, help="stop after this many minutes")
    c.add_argument("--threads", type=int, default=2, help="threads the programs run with (default 2)")
    c.add_argument("--mcpu", help="LLVM cpu to target (default: this machine's)")
    c.add_argument("--batch-size", type=int, default=32, help="programs built together (default 32)")
    c.add_argument("--builders", type=int, default=2, help="parallel build workers (default 2)")
    c.add_argument("--repeat", type=int, default=5)
    c.add_argument("--min-repeat-ms", type=int, default=50)
    c.add_argument("--cache-flush", action="store_true", help="flush the CPU cache before each repeat")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--rpc-tracker", help="HOST:PORT of a TVM RPC tracker (measure remotely)")
    c.add_argument("--rpc-key", default="", help="device key at the tracker")
    c.set_defaults(func=cmd_collect)

    b = sub.add_parser("bench", help="benchmarks (not tests)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bf = bsub.add_parser("featurize", help="programs per second of featurization")
    bf.add_argument("--n", type=int, default=240, help="number of sampled programs (default 240)")
    bf.add_argument("--threads", type=int, default=1, help="threads for TVM's extractor (default 1)")
    bf.add_argument("--seed", type=int, default=0)
    bf.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
