"""CPU time of the fast measurer's runner process against the timed kernel runs, on 6 random tasks x 16 programs
(1 thread, guard off): what the runner costs beyond the kernels' own time. ``python benchmarks/fast_runner_overhead.py``"""
import os, time, json
from cdmpp.program import tvm_env
def cpu(pid):
    f=open(f"/proc/{pid}/stat").read().rsplit(")",1)[1].split(); return (float(f[11])+float(f[12]))/os.sysconf("SC_CLK_TCK")
def main():
    tvm = tvm_env.setup(1)
    from cdmpp.measure.campaigns import task_seed
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.fast import FastMeasurer
    from cdmpp.zoo.tasks import TaskTable
    import random
    tt = TaskTable.load("datasets/tasks-llvm.json.gz"); keys = sorted(tt.tasks); random.Random(0).shuffle(keys)
    target = tvm_env.make_target("llvm", num_cores=1)
    cfg = MeasureConfig(quiet_share=1.0, run_budget_s=1.0)
    with FastMeasurer(target, cfg, threads=1, pause_dir="/tmp/cd") as m:
        jobs=[{"task_key": k, "mod_json": tt[k].mod_json, "n": 16, "seed": task_seed(k, 0), "skip": frozenset()} for k in keys[:6]]
        orig = m.runner.run; acc = {"cpu": 0.0, "wall": 0.0, "timed": 0.0, "n": 0}
        def run(b, rcfg):
            if m.runner.proc is None or not m.runner.proc.is_alive(): m.runner._start()
            c0, w0 = cpu(m.runner.proc.pid), time.perf_counter()
            secs, err = orig(b, rcfg)
            acc["cpu"] += cpu(m.runner.proc.pid) - c0 if m.runner.proc else 0; acc["wall"] += time.perf_counter() - w0
            if secs:
                best = min(secs); number = max(1, -(-rcfg["min_repeat_ms"]/1e3 // best)) if best < rcfg["min_repeat_ms"]/1e3 else 1
                acc["timed"] += best + sum(secs) * number
            acc["n"] += 1
            return secs, err
        m.runner.run = run
        for job, res in m.measure_jobs(jobs):
            pass
        print(json.dumps({k: round(v, 2) for k, v in acc.items()}), json.dumps({k: round(v,1) for k,v in m.times.items()}))
if __name__ == "__main__":
    main()
