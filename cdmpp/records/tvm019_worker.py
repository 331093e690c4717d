"""The TVM 0.19 side of ``cdmpp import ansor|autotvm``: run by the side environment's Python, never imported
by cdmpp (TVM 0.27 has no auto_scheduler or autotvm, and the two TVMs cannot share a process).

Reads JSON lines on stdin, answers one JSON line each on stdout:
  {"kind": "ansor"|"autotvm", "line": LOG_LINE}  ->  {"ok": true, "program": TVMSCRIPT, "workload": TVMSCRIPT,
      "workload_key": KEY, "name": NAME, "target": TARGET, "seconds": [...], "error_no": N, "flops": F}
                                                  or {"ok": false, "error": MESSAGE}
  {"kind": "module", "json": SAVE_JSON}          ->  {"ok": true, "script": TVMSCRIPT}: an IRModule that TVM < 0.20 saved
  {"kind": "workloads", "path": FILE}            ->  {"ok": true, "registered": N}: an Ansor workload table
      (JSON lines {"workload_key", "tensors": tvm.ir.save_json(tensors)}, or a Tenset-style pickle of tasks)

The program is the record's schedule applied to its compute (Ansor: ``apply_steps_from_state``; AutoTVM:
the template instantiated with the record's config), lowered only as far as Ansor's own feature extraction
lowers (storage flattened and simplified; loop kinds, unrolling and pragmas kept), printed as TVMScript.
The workload is the unscheduled compute as a block PrimFunc (``te.create_prim_func``).

``python tvm019_worker.py --selftest`` imports TVM 0.19 and exits (what ``setup-side-env`` checks)."""

import json
import pickle
import sys
import traceback

import tvm
from tvm import auto_scheduler, autotvm, te
from tvm.driver.build_module import schedule_to_module

import tvm.topi  # noqa: F401  registers topi's AutoTVM templates (conv2d_NCHWc.x86, dense_pack.x86, ...)

_TASKS = {}  # AutoTVM (name, args, target) -> task, its config space built once


def _lower(sch, args) -> str:
    """TVMScript of a TE schedule after the passes Ansor's feature extractor runs (no unroll, no codegen)."""
    mod = schedule_to_module(sch, args, "main")
    seq = tvm.transform.Sequential([
        tvm.tir.transform.InjectPrefetch(), tvm.tir.transform.StorageFlatten(64),
        tvm.tir.transform.NarrowDataType(32), tvm.tir.transform.Simplify(),
        tvm.tir.transform.InjectVirtualThread(), tvm.tir.transform.Simplify()])  # vthreads: 0.27 has no such binding
    with tvm.transform.PassContext(opt_level=3):
        mod = seq(mod)
    return mod.script()


def _workload(tensors) -> str:
    return tvm.IRModule({"main": te.create_prim_func(list(tensors))}).script()


def ansor(line: str) -> dict:
    inp, res = auto_scheduler.measure_record.load_record_from_string(line)
    task = auto_scheduler.SearchTask(workload_key=inp.task.workload_key, target=inp.task.target,
                                     hardware_params=inp.task.hardware_params)
    dag = task.compute_dag
    sch, args = dag.apply_steps_from_state(inp.state)
    key = inp.task.workload_key
    try:
        name = json.loads(key)[0] if key.startswith("[") else key
    except ValueError:
        name = key
    return {"program": _lower(sch, args), "workload": _workload(dag.tensors), "workload_key": key,
            "name": str(name), "target": str(inp.task.target),
            "seconds": [float(c.value if hasattr(c, "value") else c) for c in res.costs],
            "error_no": int(res.error_no), "flops": float(dag.flop_ct)}


def autotvm_record(line: str) -> dict:
    inp, res = autotvm.record.decode(line)
    if inp is None:
        raise ValueError("not an AutoTVM record (autotvm.record.decode gave nothing)")
    k = (inp.task.name, repr(inp.task.args), str(inp.target))
    if k not in _TASKS:
        _TASKS[k] = autotvm.task.create(inp.task.name, inp.task.args, inp.target)
    task = _TASKS[k]
    with inp.target:
        sch, args = task.instantiate(inp.config)
        program = _lower(sch, args)
        _, wargs = task.instantiate(task.config_space.get(0))  # one fixed config: a layout-stable workload
    return {"program": program, "workload": _workload(wargs), "workload_key": json.dumps(
                [inp.task.name, autotvm.task.task.serialize_args(inp.task.args)]),
            "name": inp.task.name, "target": str(inp.target),
            "seconds": [float(c) for c in res.costs], "error_no": int(res.error_no), "flops": float(task.flop)}


def register_workloads(path: str) -> int:
    """Register an Ansor workload table: JSON lines of {workload_key, tensors} or pickled (Tenset) tasks."""
    n = 0
    if path.endswith(".pkl"):
        with open(path, "rb") as f:
            obj = pickle.load(f)  # a SearchTask registers its workload when unpickled
        for item in obj if isinstance(obj, (list, tuple)) else [obj]:
            items = item if isinstance(item, (list, tuple)) else [item]
            n += sum(isinstance(t, auto_scheduler.SearchTask) for t in items)
        return n
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                auto_scheduler.workload_registry.register_workload_tensors(
                    d["workload_key"], list(tvm.ir.load_json(d["tensors"])))
                n += 1
    return n


def handle(req: dict) -> dict:
    kind = req.get("kind")
    if kind == "ansor":
        return ansor(req["line"])
    if kind == "autotvm":
        return autotvm_record(req["line"])
    if kind == "module":  # an IRModule saved by TVM < 0.20 (an older MetaSchedule database's workload)
        return {"script": tvm.ir.load_json(req["json"]).script()}
    if kind == "workloads":
        return {"registered": register_workloads(req["path"])}
    raise ValueError(f"unknown request kind {kind!r}")


def main() -> int:
    if "--selftest" in sys.argv:
        print(json.dumps({"ok": True, "tvm": tvm.__version__}))
        return 0
    out = sys.stdout
    sys.stdout = sys.stderr  # TVM's own prints must not corrupt the answers
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            ans = {"ok": True, **handle(json.loads(line))}
        except Exception as e:  # one bad record is an answer, never the end of the worker
            msg = str(e).strip().splitlines()
            ans = {"ok": False, "error": f"{e.__class__.__name__}: {(msg[-1] if msg else '')[:300]}",
                   "trace": traceback.format_exc()[-800:]}
        out.write(json.dumps(ans) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
