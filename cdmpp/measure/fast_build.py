"""The build job of the fast measurer (``cdmpp.measure.fast``), run in a build worker process: a task's
programs sampled (or replayed from traces), hashed, and built into one shared library, each PrimFunc
under a symbol of its own; if the whole module fails to build, each program on its own, so one bad
program costs only itself. The code is MetaSchedule's default builder's: ``RemoveWeightLayoutRewriteBlock``
and ``tvm.tirx.build``."""

from __future__ import annotations

import json
import os
import tempfile
import time

from cdmpp.errors import error_message
from cdmpp.measure.measurer import Built
from cdmpp.measure.processes import die_with_parent, pin


def build_worker_init(threads: int, cores: list[int] | None) -> None:
    from cdmpp.program import tvm_env

    die_with_parent()
    pin(cores)
    tvm_env.keep_torch_out()
    tvm_env.setup(threads)


def prepare_task(task_key: str, mod_json: str, target_json: str, out_dir: str, traces: list | None = None,
                 n: int = 0, seed: int = 0, skip: frozenset = frozenset()) -> tuple[list[Built], float, int]:
    """In a build worker: the task's programs (``traces`` replayed, else ``n`` sampled with ``seed``),
    minus the program hashes in ``skip``, built into one shared library. Returns the programs (each with
    its share of the job's CPU seconds, the linker's included), the seconds spent sampling and how many
    were skipped."""
    cpu0 = _cpu_s()
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    from cdmpp.program.features import program_hash
    from cdmpp.program.inputs import apply_trace, to_json_value

    t0 = time.perf_counter()
    target = tvm.target.Target(json.loads(target_json))  # str(target) is its JSON form
    if target.kind.name == "cuda":  # its sketches use the CUDA tensor intrinsics
        tvm_env.load_cuda_intrinsics()
    mod = tvm.ir.load_json(mod_json)
    progs: list[tuple[Built, object]] = []
    seen: set[str] = set()
    skipped = 0
    if traces is not None:
        for tr in traces:
            try:
                smod = apply_trace(mod, tr)
            except Exception as e:  # a trace that no longer applies: record it, go on
                progs.append((Built(task_key, "", tr, error="trace: " + error_message(e, lines=3, limit=600)), None))
                continue
            h = program_hash(smod)
            skipped += h in skip
            if h not in skip and h not in seen:
                seen.add(h)
                progs.append((Built(task_key, h, tr), smod))
    else:
        from cdmpp.measure.schedules import sample_schedules

        for sch in sample_schedules(mod, target, n, seed=seed):
            h = program_hash(sch.mod)
            skipped += h in skip
            if h not in skip and h not in seen:
                seen.add(h)
                progs.append((Built(task_key, h, to_json_value(sch.trace.as_json())), sch.mod))
    sample_s = time.perf_counter() - t0
    todo = [(b, m) for b, m in progs if m is not None]
    if todo:
        _build(tvm, todo, target, out_dir)
    cpu = (_cpu_s() - cpu0) / max(1, len(progs))
    for b, _ in progs:
        b.cpu_s = cpu
    return [b for b, _ in progs], sample_s, skipped


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the linker)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _build(tvm, todo: list, target, out_dir: str) -> None:
    """All programs in one module; if that fails, each on its own so one bad program costs only itself."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    funcs = {}
    for i, (b, smod) in enumerate(todo):
        b.fname = f"cdmpp_p{i}"
        func = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(smod)["main"]
        b.args = [(str(a.dtype), [int(x) for x in a.shape]) for a in ArgInfo.from_prim_func(func)]
        funcs[b.fname] = func.with_attr("global_symbol", b.fname)
    t0 = time.perf_counter()
    try:
        so = _compile(tvm, funcs, target, out_dir)
        per = (time.perf_counter() - t0) / len(todo)
        for b, _ in todo:
            b.so, b.build_s = so, per
        return
    except Exception:
        pass
    for b, _ in todo:
        t1 = time.perf_counter()
        try:
            b.so = _compile(tvm, {b.fname: funcs[b.fname]}, target, out_dir)
        except Exception as e:
            b.error = "build: " + error_message(e, lines=3, limit=600)
        b.build_s = time.perf_counter() - t1


def _compile(tvm, funcs: dict, target, out_dir: str) -> str:
    rt = tvm.tirx.build(tvm.IRModule(funcs), target=target)
    fd, path = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    rt.export_library(path)
    return path
