"""Benchmarks (``cdmpp bench ...``): throughput figures for the README, never run as tests."""

from __future__ import annotations

import time


def bench_featurize(n: int, threads: int, seed: int) -> dict:
    """Featurize ``n`` real sampled programs (a mix of workloads and schedules); programs per second."""
    from cdmpp import schedules, tvm_env, workloads
    from cdmpp.features import Featurizer
    from cdmpp.program import load_program

    tvm_env.setup(threads)
    target = tvm_env.make_target("llvm")
    per = -(-n // len(workloads.SAMPLES))
    programs = []
    for make in workloads.SAMPLES.values():
        programs += [load_program(s.mod, target) for s in schedules.sample_schedules(make(), target, per, seed)]
    programs = programs[:n]
    fz = Featurizer(num_threads=threads)
    fz(programs[:5])  # warm up
    t0 = time.perf_counter()
    feats = fz(programs)
    dt = time.perf_counter() - t0
    return {"programs": len(feats), "seconds": round(dt, 3), "programs_per_s": round(len(feats) / dt, 1),
            "threads": threads, "leaves_mean": round(sum(f.n_leaves for f in feats) / len(feats), 2)}


def main(args) -> int:
    if args.bench == "featurize":
        r = bench_featurize(args.n, args.threads, args.seed)
        print(f"featurized {r['programs']} programs in {r['seconds']} s on {r['threads']} thread(s): "
              f"{r['programs_per_s']} programs/s (mean {r['leaves_mean']} leaves)")
        return 0
    raise SystemExit(f"unknown benchmark {args.bench}")
