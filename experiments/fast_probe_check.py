"""A single pass of the fast measurer over a device's fixed probe set (``probe-<device>.json``, 100 stored
programs), compared with their stored labels (fastest repeat over 3 passes) and, with ``--against``, with
an earlier single pass of this script. Measures into nothing (records are not stored); writes the labels
to ``--out``. Nothing else should run meanwhile (``/work/cpu-slot``).

    python benchmarks/fast_probe_check.py --out /tmp/p1.json [--overlap] [--against /tmp/p0.json]
"""
import argparse
import json
import statistics
import time


def spread(pairs):
    d = sorted(abs(a - b) / b for a, b in pairs)
    s = sorted((a - b) / b for a, b in pairs)
    if not d:
        return "no pairs"
    return (f"{len(d)} programs: median {100 * statistics.median(d):.1f} %, p90 {100 * d[int(0.9 * (len(d) - 1))]:.1f} %"
            f" (signed median {100 * statistics.median(s):+.1f} %)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="amd-epyc-znver4-1t/llvm-avx512")
    ap.add_argument("--dataset", default="datasets/measurements")
    ap.add_argument("--out", required=True)
    ap.add_argument("--against", help="labels of an earlier run of this script")
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--quiet-share", type=float, default=0.05)
    a = ap.parse_args()

    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.program import tvm_env
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore, slug
    from cdmpp.zoo.tasks import TaskTable

    threads = int(a.device.split("/")[0].split("-")[-1].rstrip("t"))
    tvm_env.setup(threads)
    from cdmpp.measure.fast import FastMeasurer

    ids = json.load(open(f"{a.dataset}/probe-{slug(a.device)}.json"))["ids"]
    recs = {r["id"]: r for r in RecordStore(a.dataset).iter_records(a.device) if r["id"] in set(ids)}
    table = TaskTable.load("datasets/tasks-llvm.json.gz")
    by_task = {}
    for rid in ids:
        by_task.setdefault(recs[rid]["task"], []).append(recs[rid])
    target = tvm_env.make_target("llvm", num_cores=threads, mcpu="znver4" if "avx512" in a.device else "x86-64-v3")
    cfg = MeasureConfig(quiet_share=a.quiet_share, run_budget_s=1.0)
    jobs = [{"task_key": k, "mod_json": table[k].mod_json, "traces": [r["trace"] for r in rs], "skip": frozenset()}
            for k, rs in by_task.items()]
    new, t0 = {}, time.time()
    with FastMeasurer(target, cfg, threads, overlap=a.overlap) as m:
        for job, res in m.measure_jobs(jobs):
            for b, secs, err, others in ([] if isinstance(res, str) else res):
                if secs and not err:
                    new[f"{a.device}|{job['task_key']}|{b.program_hash}"] = {"label": min(secs), "n": len(secs),
                                                                              "others": others}
        times = {k: round(v, 1) for k, v in m.times.items()}
    json.dump({"labels": new, "times": times, "seconds": round(time.time() - t0, 1), "overlap": a.overlap,
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, open(a.out, "w"), indent=1)
    print(f"{len(new)} of {len(ids)} probe programs measured in {time.time() - t0:.0f} s; times {times}")
    print("against the stored labels (3 passes):", spread([(v["label"], label(recs[k])) for k, v in new.items()
                                                          if k in recs and label(recs[k])]))
    print("against the first pass alone:", spread([(v["label"], label(recs[k], 1)) for k, v in new.items()
                                                  if k in recs and label(recs[k], 1)]))
    if a.against:
        old = json.load(open(a.against))["labels"]
        print(f"against {a.against}:", spread([(v["label"], old[k]["label"]) for k, v in new.items() if k in old]))


if __name__ == "__main__":
    main()
