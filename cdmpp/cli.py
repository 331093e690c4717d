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
