"""``cdmpp import ansor|autotvm``: log lines parsed, TVM 0.19 TVMScript translated for 0.27, records appended
(fast, on committed fixture lines and a stand-in worker); and, slow, a real 20-trial Ansor log made with TVM
0.19 in the side environment, imported, every record's program and label checked."""

import json
import os
import subprocess

import pytest

from tests.data import DEVICES_JSON, TASKS

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
DEVICE = "amd-epyc-znver4-1t/llvm-avx512"


def fixture(name):
    return os.path.join(FIX, name)


def test_parse_ansor_lines():
    from cdmpp.records.import_logs import parse_line

    lines = open(fixture("ansor-matmul64.json")).read().splitlines()
    p = parse_line("ansor", lines[0])
    assert p["workload_key"] == '["cdmpp_matmul", 64, 64, 64]' and p["target"].startswith("llvm")
    assert p["seconds"] == [5.5067e-05, 5.42855e-05] and p["error_no"] == 0
    assert parse_line("ansor", lines[0])["key"] == p["key"] != parse_line("ansor", lines[1])["key"]
    assert parse_line("ansor", lines[3])["error_no"] == 4  # a failed run
    with pytest.raises(ValueError, match="not JSON"):
        parse_line("ansor", lines[4])
    with pytest.raises(ValueError, match="not an ansor record"):
        parse_line("ansor", '{"input": []}')


def test_parse_autotvm_lines():
    from cdmpp.records.import_logs import parse_line

    line = open(fixture("autotvm-dense.log")).readline()
    p = parse_line("autotvm", line)
    assert json.loads(p["workload_key"])[0] == "dense_nopack.x86" and p["seconds"][0] == pytest.approx(6.5095e-06)
    with pytest.raises(ValueError, match="not an autotvm record"):
        parse_line("autotvm", open(fixture("ansor-matmul64.json")).readline())
    with pytest.raises(ValueError, match="unknown log format"):
        parse_line("tenset", line)


def test_translate_reads_with_tvm_027():
    from cdmpp.program.features import Featurizer
    from cdmpp.program.inputs import load_program
    from cdmpp.records.side_env import parse, translate

    text = open(fixture("tvm019-ansor-matmul.tvmscript")).read()
    out = translate(text)
    assert "T.allocate" not in out and "T.iter_var" not in out and "T.alloc_buffer((256,)" in out
    assert "data=C_local.data" in out and "i_c_outer_outer_outer = T.int32()" not in out
    mod = parse(text)
    f = Featurizer()([load_program(mod)])[0]
    assert f.leaf_features.shape[0] == 2  # C_local's accumulation and C's copy (the init store is skipped)
    wl = parse(open(fixture("tvm019-matmul-workload.tvmscript")).read())
    from cdmpp.program.features import program_flops

    assert program_flops(wl) == 2 * 64 ** 3
    with pytest.raises(ValueError, match="T.realize"):
        translate("    with T.realize(C[0:4], ''):\n        pass\n")
    with pytest.raises(ValueError, match="does not parse"):
        parse("def main(:\n")


SCOPED = """# from tvm.script import tir as T
@T.prim_func
def main(C: T.Buffer((4,), "float32")):
    for i in T.parallel(4):
        with T.allocate([1], "float32", "global") as acc:
            acc_1 = T.Buffer((1,), data=acc)
            acc_1[0] = T.float32(0.0)
            for k in range(8):
                acc_1[0] = acc_1[0] + T.float32(1.0)
            C[i] = acc_1[0]
        C[i] = C[i] * T.float32(2.0)
"""


def test_translate_scoped_allocate():
    """AutoTVM's ``with T.allocate(...) as X:`` becomes an allocation for the rest of its sequence."""
    from cdmpp.records.side_env import parse, translate

    out = translate(SCOPED)
    assert '        acc = T.alloc_buffer((1,), "float32", scope="global")\n        acc_1 = T.decl_buffer' in out
    assert "\n        for k in range(8):\n            acc_1[0]" in out and "\n        C[i] = C[i]" in out
    assert "C[i] = C[i] * T.float32(2.0)" in parse(SCOPED).script()


class StandIn:
    """Answers as the TVM 0.19 worker does, from the committed TVMScript (no side environment needed)."""

    def __init__(self):
        self.asked = 0

    def ask(self, req):
        self.asked += 1
        if req["kind"] == "workloads":
            return {"ok": True, "registered": 1}
        d = json.loads(req["line"])
        if d["i"][1][1][0][0] == "SP" and d["i"][1][1][0][4] == [1, 8, 1]:  # the second line: as if it did not replay
            return {"ok": False, "error": "TVMError: state does not apply"}
        return {"ok": True, "program": open(fixture("tvm019-ansor-matmul.tvmscript")).read(),
                "workload": open(fixture("tvm019-matmul-workload.tvmscript")).read(),
                "workload_key": d["i"][0][0], "name": "cdmpp_matmul", "target": d["i"][0][1],
                "seconds": d["r"][0], "error_no": 0, "flops": 524288.0}

    def close(self):
        pass


def test_import_log_records_and_idempotence(tmp_path):
    from cdmpp.devices.table import DeviceTable
    from cdmpp.records.dataset import load_dataset
    from cdmpp.records.import_logs import import_log
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable

    ds, table = str(tmp_path / "ds"), DeviceTable(DEVICES_JSON)
    w = StandIn()
    r = import_log("ansor", fixture("ansor-matmul64.json"), ds, DEVICE, TaskTable.load(TASKS), table, worker=w)
    assert (r["added"], r["does_not_replay"], r["failed_run"], r["unreadable"], r["same_program"]) == (1, 1, 1, 1, 1)
    assert any(":2: does not replay" in p for p in r["problems"]) and any(":5: not JSON" in p for p in r["problems"])
    (rec,) = list(RecordStore(ds).iter_records(DEVICE))
    assert rec["trace"] is None and rec["program"].count("T.alloc_buffer") == 1 and rec["flops"] == 524288.0
    assert rec["seconds"] == [5.5067e-05, 5.42855e-05] and rec["source"].endswith("ansor-matmul64.json:1")
    run = RecordStore(ds).runs()[rec["run"]]
    assert run["imported"]["format"] == "ansor-log" and run["spec"]["id"] == DEVICE
    asked = w.asked
    again = import_log("ansor", fixture("ansor-matmul64.json"), ds, DEVICE, TaskTable.load(TASKS), table, worker=w)
    assert (again["added"], again["already_present"], again["same_program"]) == (0, 1, 1)
    assert w.asked == asked + 2  # the line that did not replay and the second of a stored program, not the first
    got = load_dataset(ds, TaskTable.load(TASKS), cache_dir=str(tmp_path / "cache"), progress=False)
    assert len(got) == 1 and got.programs[0].seconds == pytest.approx(5.42855e-05)
    assert got.programs[0].features.flops == 524288.0


def test_import_log_bad_input(tmp_path):
    from cdmpp.records.import_logs import import_log

    with pytest.raises(FileNotFoundError, match="no such log"):
        import_log("ansor", str(tmp_path / "missing.json"), str(tmp_path / "ds"), DEVICE, worker=StandIn())
    with pytest.raises(ValueError, match="unknown log format"):
        import_log("tenset", fixture("ansor-matmul64.json"), str(tmp_path / "ds"), DEVICE, worker=StandIn())
    r = import_log("autotvm", fixture("autotvm-dense.log"), str(tmp_path / "ds"), "nvidia-h100/cuda-sm90", worker=StandIn())
    assert r["wrong_target_kind"] == 4 and r["added"] == 0


MAKE_LOG = r'''
import json, sys, tvm
from tvm import auto_scheduler, te

@auto_scheduler.register_workload
def cdmpp_matmul(n, m, k):
    A = te.placeholder((n, k), name="A"); B = te.placeholder((k, m), name="B")
    r = te.reduce_axis((0, k), name="r")
    return [A, B, te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")]

task = auto_scheduler.SearchTask(func=cdmpp_matmul, args=(64, 64, 64), target=tvm.target.Target("llvm"))
task.tune(auto_scheduler.TuningOptions(num_measure_trials=20, verbose=0,
          runner=auto_scheduler.LocalRunner(repeat=2, number=2, min_repeat_ms=0, timeout=30),
          measure_callbacks=[auto_scheduler.RecordToFile(sys.argv[1])]),
          search_policy=auto_scheduler.SketchPolicy(task, verbose=0))
with open(sys.argv[2], "w") as f:
    f.write(json.dumps({"workload_key": task.workload_key, "tensors": tvm.ir.save_json(list(task.compute_dag.tensors))}) + "\n")
'''


@pytest.mark.slow
def test_real_ansor_log_round_trip(tmp_path):
    """TVM 0.19 tunes a 64x64x64 matmul for 20 trials; every record of its log becomes a record whose
    program reads with TVM 0.27 (hash as stored) and whose label is the record's fastest cost."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.program.features import program_hash
    from cdmpp.program.inputs import load_program
    from cdmpp.records import side_env
    from cdmpp.records.dataset import load_dataset
    from cdmpp.records.import_logs import import_log
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable

    try:
        side_env.check()
    except side_env.SideEnvError as e:
        pytest.skip(str(e))
    log, wl, script = tmp_path / "mm.json", tmp_path / "mm.workloads.jsonl", tmp_path / "make_log.py"
    script.write_text(MAKE_LOG)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([side_env.side_python(), str(script), str(log), str(wl)], check=True, timeout=600, env=env,
                   capture_output=True)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    ok = [d for d in lines if d["r"][1] == 0]
    assert len(lines) >= 15 and ok
    ds = str(tmp_path / "ds")
    r = import_log("ansor", str(log), ds, DEVICE, TaskTable.load(TASKS), DeviceTable(DEVICES_JSON), workloads=str(wl))
    assert r["does_not_replay"] == 0 and r["does_not_translate"] == 0 and r["unreadable"] == 0, r["problems"]
    assert r["added"] + r["same_program"] == len(ok) and r["failed_run"] == len(lines) - len(ok)
    recs = list(RecordStore(ds).iter_records(DEVICE))
    by_line = {int(x["source"].rsplit(":", 1)[1]): x for x in recs}
    for lineno, rec in by_line.items():
        costs = lines[lineno - 1]["r"][0]
        assert rec["seconds"] == costs and label(rec) == min(costs)
        assert program_hash(load_program(rec["program"]).mod) == rec["program_hash"]
    again = import_log("ansor", str(log), ds, DEVICE, workloads=str(wl))
    assert again["added"] == 0 and again["already_present"] == r["added"]
    got = load_dataset(ds, TaskTable.load(TASKS), cache_dir=str(tmp_path / "cache"), progress=False)
    assert len(got) == len(recs) and all(p.features.flops == 2 * 64 ** 3 for p in got.programs)
