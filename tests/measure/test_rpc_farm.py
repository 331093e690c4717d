"""``cdmpp collect --rpc-tracker``: a measurement farm on loopback, a real TVM RPC tracker and two RPC servers
(``python -m tvm.exec.rpc_tracker`` / ``rpc_server``, as on a farm's machines), against a local collect of
the same tiny job: the same records, in the same form, the run saying it measured over RPC and where.

The servers import only ``tvm`` and ``tvm.rpc`` (never ``tvm.s_tir.tensor_intrin``, TVM-NOTES' 52 s trap),
and time kernels with the ``TVM_NUM_THREADS`` they were started with: 1, as the device's spec says."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.processes import descendants, free_port, running, still_running

pytestmark = pytest.mark.slow

KEY = f"cdmpp-test-{os.getpid()}"
PER_TASK = 3


def _env(tmp) -> dict:
    return dict(os.environ, TVM_NUM_THREADS="1", TMPDIR=str(tmp), CDMPP_CACHE=str(tmp / "cache"))


def _wait_for(what: str, check, timeout_s: float, procs=()):
    """Poll ``check`` until it returns something true; fail (with ``what``) after ``timeout_s`` or when one
    of ``procs`` has died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"{what}: exited early: {dead}"
        time.sleep(0.5)
    pytest.fail(f"{what}: not after {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """(tracker port, server logs): a tracker and two servers of key ``KEY`` on 127.0.0.1, both free at the
    tracker; every process (and what it forked) killed afterwards."""
    tmp = tmp_path_factory.mktemp("farm")
    procs, logs = [], []

    def start(name, *args):
        log = tmp / f"{name}.log"
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                                      stderr=open(log, "w"), env=_env(tmp), cwd=tmp, start_new_session=True))
        return procs[-1]

    try:
        base = free_port()
        start("tracker", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(base),
              "--port-end", str(base + 50))
        bound = lambda: re.search(r"bind to 127\.0\.0\.1:(\d+)", logs[0].read_text())  # the first free port
        port = int(_wait_for("the tracker listens", bound, 120, procs).group(1))
        for i in range(2):
            base = free_port()
            start(f"server{i}", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(base),
                  "--port-end", str(base + 100), "--tracker", f"127.0.0.1:{port}", "--key", KEY)
        from cdmpp.program import tvm_env

        rpc = tvm_env.setup(1).rpc
        free = lambda: rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get(KEY, {}).get("free") == 2
        _wait_for("two servers free at the tracker", free, 300, procs)
        yield port, logs[1:]
    finally:
        below = set().union(*(descendants(p.pid) for p in procs))
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        for pid in below:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        assert not still_running(below)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """(folder, task table, device table): two small tasks."""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    from cdmpp.zoo.tasks import Task, TaskTable, task_key

    tvm = tvm_env.setup(1)
    tmp = tmp_path_factory.mktemp("job")
    table = TaskTable()
    for name, mod in [("matmul", workloads.matmul(32, 32, 32)), ("softmax", workloads.softmax(16, 64))]:
        table.add([Task(task_key(mod), name, tvm.ir.save_json(mod), None, {"toy@1": 1})])
    table.save(str(tmp / "tasks.json"))
    return tmp, tmp / "tasks.json", tmp / "devices.json"


def _collect(job, dataset: str, *extra) -> str:
    tmp, tasks, devices = job
    cmd = [sys.executable, "-m", "cdmpp.cli", "collect", "--task-table", str(tasks), "--devices", str(devices),
           "--dataset", str(tmp / dataset), "--threads", "1", "--per-task", str(PER_TASK), "--repeat", "3",
           "--min-repeat-ms", "5", "--builders", "1", "--batch-size", "4", "--artifacts", "none",
           "--budget-minutes", "8", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(tmp), cwd=tmp, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"done: {2 * PER_TASK} measured, 0 failed" in out.stdout, out.stdout + out.stderr[-3000:]
    return str(tmp / dataset)


def _records_and_runs(dataset: str) -> tuple[dict, dict]:
    from cdmpp.records.store import RecordStore

    with open(os.path.join(dataset, "runs.jsonl")) as f:
        runs = {r["run"]: r for r in map(json.loads, filter(str.strip, f))}
    return {r["id"]: r for r in RecordStore(dataset).iter_records()}, runs


def test_collect_through_a_tracker_stores_what_a_local_collect_stores(farm, job):
    port, server_logs = farm
    # local first: it probes this machine into the temp device table (the quiet-share rule is off: the
    # test shares a busy machine); over RPC the device is named, as a farm's remote machine would be
    local, local_runs = _records_and_runs(_collect(job, "local", "--quiet-share", "1.0"))
    device = next(iter(local.values()))["device"]
    # the default quiet-share: the collector's own load must not hold up (or re-run) a remote measurement
    remote, remote_runs = _records_and_runs(
        _collect(job, "rpc", "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", KEY, "--device", device))

    assert len(local) == 2 * PER_TASK and remote.keys() == local.keys()  # the same programs, the same ids
    for rid, r in remote.items():
        lr = local[rid]
        assert r.keys() == lr.keys(), sorted(r.keys() ^ lr.keys())
        assert (r["device"], r["task"], r["program_hash"], r["trace"]) == (lr["device"], lr["task"],
                                                                         lr["program_hash"], lr["trace"])
        assert rid == f"{device}|{r['task']}|{r['program_hash']}" and r["error"] is None
        for rec in (r, lr):
            assert rec["seconds"] and all(math.isfinite(s) and s > 0 for s in rec["seconds"]), rec["seconds"]
        # the same chip on both sides: the same order of magnitude
        assert 0.1 < min(r["seconds"]) / min(lr["seconds"]) < 10, (r["seconds"], lr["seconds"])
        assert r["others_cpu"] == 0.0 and r["disturbed"] is False  # no local guard over RPC

    (run,) = {r["run"] for r in remote.values()}
    assert remote_runs[run]["rpc"] == f"127.0.0.1:{port}/{KEY}" and remote_runs[run]["measurer"] == "metaschedule"
    assert remote_runs[run]["device"] == device and remote_runs[run]["threads"] == 1
    (lrun,) = {r["run"] for r in local.values()}
    assert local_runs[lrun]["rpc"] is None

    # every program ran in a server session, and both servers took some
    served = [len(re.findall(r"load_module ", log.read_text())) for log in server_logs]
    assert sum(served) == len(remote) and all(served), served


def test_collect_over_rpc_needs_the_remote_device(job, tmp_path):
    from cdmpp.cli import main

    tmp, tasks, _ = job
    common = ["collect", "--task-table", str(tasks), "--devices", str(tmp_path / "devices.json"),
              "--dataset", str(tmp_path / "ds"), "--threads", "1", "--rpc-tracker", "127.0.0.1:9", "--rpc-key", KEY]
    assert main(common) == 2  # no --device: this machine's probe would label a remote's programs
    assert main([*common, "--device", "nowhere-1t/llvm-avx2"]) == 2  # not in the table
    assert not os.path.exists(tmp_path / "ds")
