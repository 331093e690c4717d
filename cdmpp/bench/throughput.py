"""Benchmarks (``cdmpp bench ...``): throughput figures for the README, never run as tests."""

from __future__ import annotations

import time


def bench_featurize(n: int, threads: int, seed: int) -> dict:
    """Featurize ``n`` real sampled programs (a mix of workloads and schedules); programs per second."""
    from cdmpp.measure import schedules
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    from cdmpp.program.features import Featurizer
    from cdmpp.program.inputs import load_program

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


def bench_collect(task_table: str, devices: str, threads: int, mcpu: str | None, tasks: int, per_task: int,
                  seed: int, measurer: str, overlap: bool | None, quiet_share: float, run_budget_s: float,
                  dataset: str | None = None) -> dict:
    """Collect ``per_task`` programs of ``tasks`` tasks drawn at random (``seed``) from the table into a
    throw-away dataset (or ``dataset``); programs/s and where the time went."""
    import os
    import random
    import tempfile

    from cdmpp.program import tvm_env
    from cdmpp.measure.campaigns import collect
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.devices.probe import probe_local_cpu
    from cdmpp.devices.table import DeviceTable
    from cdmpp.zoo.tasks import TaskTable

    tvm_env.setup(threads)
    table = TaskTable.load(task_table)
    keys = sorted(table.tasks)
    random.Random(seed).shuffle(keys)
    sub = table.filter(task_keys=keys[:tasks])
    target = tvm_env.make_target("llvm", num_cores=threads, mcpu=mcpu)
    table_devices = DeviceTable(devices)
    device = probe_local_cpu(threads, mcpu=mcpu)
    device = table_devices.get(device.id) if device.id in table_devices.ids() else device
    cfg = MeasureConfig(quiet_share=quiet_share, run_budget_s=run_budget_s)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        s = collect(sub, dataset or tmp, device, target, per_task=per_task, cfg=cfg, seed=seed,
                    measurer=measurer, overlap=overlap, artifact_dir=None)
    s.update(device=device.id, measurer=measurer, overlap=s.get("overlap", overlap), loadavg_1m_before=load0,
             loadavg_1m_after=os.getloadavg()[0])
    s.setdefault("programs_per_s", round(s["measured"] / max(1e-9, s["seconds"]), 3))
    waited = sum(s.get("times", {}).get(k, 0.0) for k in ("wait_quiet", "paused"))
    s["programs_per_s_not_waiting"] = round(s["measured"] / max(1e-9, s["seconds"] - waited), 3)
    return s


def main(args) -> int:
    if args.bench == "collect":
        import json

        r = bench_collect(args.task_table, args.devices, args.threads, args.mcpu, args.tasks, args.per_task,
                          args.seed, args.measurer, args.overlap, args.quiet_share, args.run_budget_s,
                          dataset=args.dataset)
        print(json.dumps(r))
        print(f"{r['device']} ({r['measurer']}{', overlap' if r['overlap'] else ''}): {r['measured']} programs "
              f"measured, {r['failed']} failed in {r['seconds']} s: {r['programs_per_s']} programs/s "
              f"({r['programs_per_s_not_waiting']} not counting waits for a quiet machine); load average "
              f"{r['loadavg_1m_before']:.2f} before, {r['loadavg_1m_after']:.2f} after")
        if "times" in r:
            print("seconds: " + ", ".join(f"{k} {v}" for k, v in r["times"].items())
                  + "  (sample_cpu/build_cpu: wall seconds summed over the build workers; worker_cpu: their CPU "
                    "seconds, sampling, lowering, LLVM and linking)")
        return 0
    if args.bench == "featurize":
        r = bench_featurize(args.n, args.threads, args.seed)
        print(f"featurized {r['programs']} programs in {r['seconds']} s on {r['threads']} thread(s): "
              f"{r['programs_per_s']} programs/s (mean {r['leaves_mean']} leaves)")
        return 0
    raise SystemExit(f"unknown benchmark {args.bench}")
