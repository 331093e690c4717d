"""How fast ``cdmpp import metaschedule`` is (issue 54: a 10,000-record database in under 5 minutes).

Writes a MetaSchedule JSON database of N distinct random schedules of four workloads (matmul, conv2d,
softmax, layer norm; made-up run_secs: the importer never runs a program) once into WORK/db, then times
an import into a fresh dataset, a re-import, and the replay alone (trace applied + program hash), which
is what an import cannot skip.

``python benchmarks/import_metaschedule.py [--records 10000] [--work /tmp/cdmpp-import-bench]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time


def make_database(db_dir: str, n: int) -> None:
    from cdmpp.program import tvm_env

    tvm_env.setup(1)
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.measure.schedules import sample_schedules
    from cdmpp.zoo import workloads

    target = tvm_env.make_target("llvm", num_cores=2)
    os.makedirs(db_dir, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=db_dir)
    mods = [workloads.matmul(128, 128, 128), workloads.conv2d(), workloads.softmax(), workloads.layer_norm()]
    rng = random.Random(0)
    for i, mod in enumerate(mods):
        want = n // len(mods) + (i < n % len(mods))
        wl = db.commit_workload(mod)
        args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        schs = sample_schedules(mod, target, want, seed=i)
        for sch in schs:
            db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, [rng.uniform(1e-5, 1e-3) for _ in range(3)],
                                                             target, args))
        print(f"workload {i}: {len(schs)} tuning records", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--work", default="/tmp/cdmpp-import-bench")
    args = ap.parse_args()
    db_dir, ds = os.path.join(args.work, "db"), os.path.join(args.work, "ds")
    if not os.path.exists(os.path.join(db_dir, "database_tuning_record.json")):
        t0 = time.perf_counter()
        make_database(db_dir, args.records)
        print(f"database written in {time.perf_counter() - t0:.0f} s")
    from cdmpp import defaults
    from cdmpp.devices.table import DeviceTable
    from cdmpp.program.features import program_hash
    from cdmpp.program.inputs import apply_trace
    from cdmpp.records.importers import import_metaschedule
    from cdmpp.zoo.tasks import TaskTable

    shutil.rmtree(ds, ignore_errors=True)
    device = "amd-epyc-znver4-2t/llvm-avx512"
    out = {}
    for name in ("import", "reimport"):
        t0 = time.perf_counter()
        r = import_metaschedule(db_dir, ds, device, TaskTable.load(defaults.TASK_TABLE), DeviceTable())
        out[name] = {"seconds": round(time.perf_counter() - t0, 1), "added": r["added"],
                     "already_present": r["already_present"], "errors": r["errors"],
                     "records_per_s": round((r["added"] + r["already_present"]) / (time.perf_counter() - t0), 1)}
        print(name, json.dumps(out[name]), flush=True)
    from tvm.s_tir.meta_schedule.database import Workload

    with open(os.path.join(db_dir, "database_workload.json")) as f:
        mods = [Workload.from_json(json.loads(x)).mod for x in f if x.strip()]
    with open(os.path.join(db_dir, "database_tuning_record.json")) as f:
        recs = [json.loads(x) for x in f if x.strip()]
    t0 = time.perf_counter()
    for widx, (trace, *_rest) in recs:
        program_hash(apply_trace(mods[widx], trace))
    replay = time.perf_counter() - t0
    print(f"replay alone: {replay:.1f} s for {len(recs)} records ({len(recs) / replay:.0f}/s), "
          f"{100 * replay / out['import']['seconds']:.0f} % of the import")


if __name__ == "__main__":
    main()
