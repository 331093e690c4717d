"""``cdmpp bench serve``: throughput and latency of a real server under compiler-like load.

What it does: sample real schedules of a mix of zoo tasks (convolutions, dense layers, pooling, softmax,
layer norm, GELU from resnet18 and bert_tiny), start ``cdmpp serve`` in a subprocess on 127.0.0.1,
and drive it with ``clients`` concurrent clients, each sending ``batch``-program requests. A request
holds the candidates of one task, as a MetaSchedule search asks its cost model; a share
(``repeat_share``) of each batch re-asks programs already sent, as a search re-scores its population.
Two phases: *cold* (every program new: the server parses and featurizes all of them) and *mixed*
(the steady state of a search). Request bodies are encoded before the clock starts, so the clients
(same 2 cores) spend little CPU. The server's /metrics gives the time split: parsing, feature
extraction, model. Programs are asked unbuilt (``"build": false``), as the cost model asks a tuner's
candidates; ``build=True`` asks as a plain request does, each new CPU program built for the model's counts.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np

from cdmpp import defaults

# (network@batch, task name) pairs: a mix of what a compiler tunes.
BENCH_TASKS = [
    ("resnet18@1", "fused_conv2d_subtract_divide_multiply_add1_relu"),
    ("resnet18@1", "fused_conv2d4_subtract2_divide2_multiply2_add5_relu2"),
    ("resnet18@1", "fused_conv2d8_subtract4_divide4_multiply4_add11_add12_relu4"),
    ("resnet18@1", "max_pool2d"),
    ("resnet18@1", "fused_matmul_add13"),
    ("bert_tiny@1", "fused_matmul5_add3"),
    ("bert_tiny@1", "matmul2"),
    ("bert_tiny@1", "layer_norm"),
    ("bert_tiny@1", "fused_softmax_broadcast_to2"),
    ("bert_tiny@1", "fused_reshape11_gelu_reshape12"),
]


@dataclass
class TaskPrograms:
    name: str
    workload: object  # Workload.as_json() of the task (shared by its trace items)
    items: list[bytes]  # each program, JSON-encoded once


def sample_pool(task_table: str, per_task: list[int], form: str, seed: int) -> list[TaskPrograms]:
    """Distinct sampled schedules of each bench task (``per_task[i]`` of task i), JSON-encoded in ``form``."""
    from cdmpp.measure import schedules
    from cdmpp.program import tvm_env
    from cdmpp.program.inputs import to_json_value
    from cdmpp.zoo.tasks import TaskTable, load_task_mod

    tvm_env.setup(1)
    from tvm.s_tir.meta_schedule.database import Workload

    target = tvm_env.make_target("llvm", num_cores=2)
    table = TaskTable.load(task_table)
    pool = []
    for (occ, name), n in zip(BENCH_TASKS, per_task):
        task = next((t for t, _ in table.tasks_of(occ) if t.name == name), None)
        if task is None:
            print(f"bench serve: task {name} of {occ} not in {task_table}; skipped", file=sys.stderr)
            continue
        mod = load_task_mod(task)
        schs = schedules.sample_schedules(mod, target, n, seed)
        if form == "tvmscript":
            items = [json.dumps(s.mod.script()).encode() for s in schs]
        else:
            # each item is the JSON *text* of {"trace": ...} over the task's shared workload (the fast form)
            items = [json.dumps(json.dumps({"trace": to_json_value(s.trace.as_json())}, separators=(",", ":"))).encode()
                     for s in schs]
        pool.append(TaskPrograms(f"{occ}/{name}", Workload(mod).as_json() if form == "trace" else None, items))
    return pool


def plan_requests(pool: list[TaskPrograms], n_batches: int, batch: int, repeat_share: float, cold: bool,
                  sent: dict[str, list[int]], rng: random.Random, build: bool = False):
    """Request bodies for one phase. ``sent`` (task → indices already sent) is updated as programs are used.

    Cold: every program is new. Mixed: ``repeat_share`` of each batch re-asks already-sent programs of
    the task, the rest are new; a task that runs out of new programs repeats more (counted honestly).
    """
    bodies, n_repeat, n_total = [], 0, 0
    for b in range(n_batches):
        tp = pool[b % len(pool)]
        done = sent.setdefault(tp.name, [])
        done_set = set(done)
        fresh = [i for i in range(len(tp.items)) if i not in done_set]
        want_new = batch if cold else batch - int(round(repeat_share * batch))
        new = fresh[:want_new]
        reps = [rng.choice(done) for _ in range(batch - len(new))] if done else []
        idx = new + reps
        if not idx:
            continue
        rng.shuffle(idx)
        done.extend(new)
        n_repeat += len(reps)
        n_total += len(idx)
        bodies.append(_body(tp, idx, build))
    return bodies, n_repeat, n_total


_DEVICE_PLACEHOLDER = b"__DEVICE__"


def _body(tp: TaskPrograms, idx: list[int], build: bool = False) -> bytes:
    head = b'{"device":"' + _DEVICE_PLACEHOLDER + b'",' + (b'' if build else b'"build":false,')
    if tp.workload is not None:
        head += b'"workload":' + json.dumps(tp.workload).encode() + b","
    return head + b'"programs":[' + b",".join(tp.items[i] for i in idx) + b"]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str | None, workers: int, threads: int, port: int, featurize_procs: int = 1,
                 env_extra: dict | None = None):
    """``cdmpp serve`` in a subprocess; returns (process, base url) once /healthz answers. Its stderr goes to an
    unnamed file, not a pipe: nobody reads a pipe while the bench runs, and a server whose log outgrew the pipe's
    buffer (64 KB) would stall on its next line."""
    import httpx

    env = {**os.environ, "CDMPP_THREADS": str(threads), **(env_extra or {})}
    cmd = [sys.executable, "-m", "cdmpp.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--workers", str(workers), "--featurize-procs", str(featurize_procs), "--no-access-log"]
    if model:
        cmd += ["--model", model]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"server exited with {proc.returncode}: {log.read()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    return proc, url  # the server keeps writing to its own copy of the file
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        proc.kill()
        raise RuntimeError("server did not become healthy in 180 s")


def drive(url: str, bodies: list[bytes], device: str, clients: int, duration_s: float) -> dict:
    """Send ``bodies`` from ``clients`` threads (each its own connection); per-request latency."""
    import httpx

    dev = device.encode()
    queue = list(reversed([b.replace(_DEVICE_PLACEHOLDER, dev, 1) for b in bodies]))
    lock = threading.Lock()
    lat, n_programs, errors = [], [0], []
    deadline = time.monotonic() + duration_s

    def worker():
        with httpx.Client(base_url=url, timeout=120, headers={"content-type": "application/json"}) as c:
            while time.monotonic() < deadline:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                t0 = time.perf_counter()
                r = c.post("/v1/predict", content=body)
                dt = time.perf_counter() - t0
                with lock:
                    if r.status_code == 200:
                        lat.append(dt)
                        n_programs[0] += len(r.json()["predictions"])
                    else:
                        errors.append(f"{r.status_code}: {r.text[:200]}")

    t0 = time.perf_counter()
    ths = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    a = np.array(lat) if lat else np.array([np.nan])
    return {"requests": len(lat), "programs": n_programs[0], "errors": len(errors), "first_errors": errors[:3],
            "wall_s": round(wall, 2), "programs_per_s": round(n_programs[0] / wall, 1),
            "p50_ms": round(float(np.percentile(a, 50)) * 1e3, 1),
            "p99_ms": round(float(np.percentile(a, 99)) * 1e3, 1),
            "mean_ms": round(float(a.mean()) * 1e3, 1), "unfinished": len(queue)}


def in_process(bodies: list[bytes], device: str, model: str | None) -> dict:
    """The same requests parsed, featurized (built where a body asks it) and predicted in this process on one
    thread, as a sandbox worker and the model do it, without HTTP, JSON bodies, caches and pipes: the reference
    that the wire path's cost per new program is compared with (issue 21 allows it 20 % more)."""
    import torch

    from cdmpp.predict.predictor import Predictor
    from cdmpp.program.inputs import parse_target
    from cdmpp.sandbox.worker import featurize_items

    torch.set_num_threads(1)
    predictor, tgt = Predictor.load(model), parse_target("llvm")
    build_for = predictor.build_target(device)
    reqs = [json.loads(b.replace(_DEVICE_PLACEHOLDER, device.encode(), 1)) for b in bodies]

    def one(r) -> int:
        feats, errors, _, _ = featurize_items(r["programs"], list(range(len(r["programs"]))), tgt, r.get("workload"),
                                              tvmscript=False, build=build_for if r.get("build", True) else None)
        if errors:
            raise RuntimeError(f"in-process featurization failed: {errors[:3]}")
        predictor.predict_features(feats, device, "llvm")
        return len(feats)

    one(reqs[0])  # warm-up: the featurizer and the model's first call
    t0 = time.perf_counter()
    n = sum(one(r) for r in reqs)
    wall = time.perf_counter() - t0
    return {"programs": n, "wall_s": round(wall, 2), "programs_per_s": round(n / wall, 1)}


def scrape(url: str) -> dict[str, float]:
    """The unlabelled counters of /metrics (one worker's, when several run)."""
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


def _split(before: dict, after: dict) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    hits, misses = d.get("cdmpp_feature_cache_hits_total", 0), d.get("cdmpp_feature_cache_misses_total", 0)
    return {"prediction_cache_hits": int(d.get("cdmpp_prediction_cache_hits_total", 0)),
            "feature_cache_hits": int(hits), "cache_misses": int(misses),
            "server_parse_s": round(d.get("cdmpp_parse_seconds_total", 0), 2),
            "server_featurize_s": round(d.get("cdmpp_featurize_seconds_total", 0), 2),
            "server_model_s": round(d.get("cdmpp_model_seconds_total", 0), 2)}


def bench_serve(model: str | None = None, clients: int = 16, batch: int = 64, batches: int = 160,
                cold_batches: int = 16, repeat_share: float = 0.9, workers: int = 1, threads: int = 2,
                featurize_procs: int = 1, form: str = "trace", duration_s: float = 120.0, task_table: str = defaults.TASK_TABLE,
                device: str | None = None, seed: int = 0, compare_in_process: bool = False, build: bool = False) -> dict:
    rng = random.Random(seed)
    n_tasks = len(BENCH_TASKS)
    new_per_batch = batch - int(round(repeat_share * batch))
    need = [batch * len(range(i, cold_batches, n_tasks)) + new_per_batch * len(range(i, batches, n_tasks))
            for i in range(n_tasks)]
    t0 = time.perf_counter()
    pool = sample_pool(task_table, need, form, seed)
    sample_s = time.perf_counter() - t0
    sent: dict[str, list[int]] = {}
    cold_bodies, _, cold_n = plan_requests(pool, cold_batches, batch, repeat_share, True, sent, rng, build)
    mixed_bodies, n_rep, n_mixed = plan_requests(pool, batches, batch, repeat_share, False, sent, rng, build)
    proc, url = start_server(model, workers, threads, _free_port(), featurize_procs,
                             {"CDMPP_ALLOW_TVMSCRIPT": "1"} if form == "tvmscript" else None)
    try:
        import httpx

        if device is None:
            devs = [d["id"] for d in httpx.get(url + "/v1/devices", timeout=10).json()["devices"]]
            device = next((d for d in devs if "llvm" in d), devs[0])
        m0 = scrape(url)
        cold = drive(url, cold_bodies, device, clients, duration_s)
        m1 = scrape(url)
        mixed = drive(url, mixed_bodies, device, clients, duration_s)
        m2 = scrape(url)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    cold.update(_split(m0, m1))
    mixed.update(_split(m1, m2))
    mixed["repeat_share_sent"] = round(n_rep / max(n_mixed, 1), 3)
    extra = {}
    if compare_in_process and form == "trace":  # after the server stopped, so nothing else runs
        ref = in_process(cold_bodies, device, model)
        ref["http_cold_over_in_process"] = round(ref["programs_per_s"] / max(cold["programs_per_s"], 1e-9), 3)
        extra["in_process"] = ref
    return {**extra, "device": device, "form": form, "build": build, "clients": clients, "batch": batch, "workers": workers,
            "threads": threads, "featurize_procs": featurize_procs, "tasks": [t.name for t in pool], "distinct_programs": sum(len(t.items) for t in pool),
            "sampling_s": round(sample_s, 1), "cold": cold, "mixed": mixed, "repeat_share": repeat_share,
            "machine_cpus": os.cpu_count()}


def report(r: dict) -> str:
    lines = [f"cdmpp bench serve: {r['clients']} clients x {r['batch']}-program batches, {r['workers']} worker(s) "
             f"x {r['threads']} thread(s) + {r['featurize_procs']} featurizer process(es), form={r['form']}, "
             f"{'built' if r.get('build') else 'unbuilt'}, device {r['device']}, {r['distinct_programs']} "
             f"distinct programs of {len(r['tasks'])} tasks, {r['machine_cpus']} cpus"]
    share = r["mixed"].get("repeat_share_sent", 0)
    for phase, label in (("cold", "cold (all new)"), ("mixed", f"mixed ({share:.0%} repeats)")):
        p = r[phase]
        busy = p["server_parse_s"] + p["server_featurize_s"] + p["server_model_s"]
        lines.append(f"  {label:22s} {p['programs']:6d} programs in {p['wall_s']:6.1f} s: {p['programs_per_s']:7.1f} "
                     f"programs/s, per batch p50 {p['p50_ms']:.0f} ms p99 {p['p99_ms']:.0f} ms; errors {p['errors']}"
                     + (f", unfinished {p['unfinished']}" if p["unfinished"] else ""))
        if busy:
            lines.append(f"  {'':22s} server time: parse {p['server_parse_s']} s, "
                         f"features {p['server_featurize_s']} s, "
                         f"model {p['server_model_s']} s; prediction-cache hits {p['prediction_cache_hits']}, "
                         f"feature-cache hits {p['feature_cache_hits']}, parsed {p['cache_misses']}")
    if "in_process" in r:
        q = r["in_process"]
        lines.append(f"  {'in process, 1 thread':22s} {q['programs']:6d} programs in {q['wall_s']:6.1f} s: "
                     f"{q['programs_per_s']:7.1f} programs/s (the cold requests parsed, featurized and predicted "
                     f"without HTTP); per new program HTTP costs {q['http_cold_over_in_process']:.2f}x")
    return "\n".join(lines)


def main(args) -> int:
    r = bench_serve(model=args.model, clients=args.clients, batch=args.batch, batches=args.batches,
                    cold_batches=args.cold_batches, repeat_share=args.repeat_share, workers=args.workers,
                    threads=args.threads, featurize_procs=args.featurize_procs, form=args.form, duration_s=args.duration, task_table=args.task_table,
                    device=args.device, seed=args.seed, compare_in_process=args.in_process, build=args.build)
    print(report(r))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0
