"""Turn what a user hands us into one scheduled TIR module and a target.

Accepted forms (see ``load_program``): a ``tvm.tirx.PrimFunc``, an ``IRModule`` with one PrimFunc, a
``tvm.s_tir.Schedule``, TVMScript text, or a MetaSchedule workload + trace (the JSON that MetaSchedule's
JSON database stores: ``{"workload": Workload.as_json(), "trace": Trace.as_json()}``). Anything else,
or anything that does not parse, raises ``ProgramError`` with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cdmpp.errors import error_message
from cdmpp.program import tvm_env


class ProgramError(ValueError):
    """A program or target that cdmpp cannot use; the message says what is wrong."""


TARGET_KINDS = ("llvm", "cuda")


@dataclass
class Program:
    """A scheduled tensor program: an IRModule holding exactly one PrimFunc, and its target."""

    mod: Any  # tvm.IRModule
    target: Any  # tvm.target.Target

    @property
    def is_gpu(self) -> bool:
        return "gpu" in [str(k) for k in self.target.keys]


def parse_target(target: Any = "llvm"):
    """``"llvm"``/``"cuda"``/a dict/a ``Target`` → a full ``Target`` (mcpu, num-cores filled in)."""
    tvm = tvm_env.setup()
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str):
        kind = target.strip().split()[0] if target.strip() else ""
        if kind not in TARGET_KINDS:
            raise ProgramError(f"unknown target {target!r}: expected one of {', '.join(TARGET_KINDS)}")
        return tvm_env.make_target(kind)
    if isinstance(target, dict):
        if target.get("kind") not in TARGET_KINDS:
            raise ProgramError(f"unknown target kind {target.get('kind')!r}: expected one of {', '.join(TARGET_KINDS)}")
        try:
            return tvm.target.Target(target)
        except Exception as e:  # TVM raises its own error types
            raise ProgramError(f"invalid target {target!r}: {error_message(e)}") from None
    raise ProgramError(f"unsupported target type {type(target).__name__}")


def load_program(obj: Any, target: Any = "llvm") -> Program:
    """Accept a program in any supported form and return a ``Program``."""
    tvm = tvm_env.setup()
    from tvm.s_tir import Schedule

    target = parse_target(target)
    if isinstance(obj, Program):
        return obj
    if isinstance(obj, Schedule):
        mod = obj.mod
    elif isinstance(obj, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": obj})
    elif isinstance(obj, tvm.IRModule):
        mod = obj
    elif isinstance(obj, dict):
        mod = _from_workload_trace(obj)
    elif isinstance(obj, str):
        text = obj.strip()
        if text.startswith("{"):
            try:
                return load_program(json.loads(text), target)
            except json.JSONDecodeError as e:
                raise ProgramError(f"program looks like JSON but does not parse: {e}") from None
        mod = _from_tvmscript(text)
    else:
        raise ProgramError(
            f"unsupported program type {type(obj).__name__}: expected PrimFunc, IRModule, Schedule, "
            "TVMScript text or a {'workload', 'trace'} dict"
        )
    return Program(_single_primfunc_module(mod), target)


def _from_tvmscript(text: str):
    tvm = tvm_env.setup()
    if not text:
        raise ProgramError("empty TVMScript text")
    try:
        parsed = tvm.script.from_source(text)
    except Exception as e:
        raise ProgramError(f"TVMScript does not parse: {error_message(e)}") from None
    return parsed


def _from_workload_trace(obj: dict):
    tvm = tvm_env.setup()
    from tvm.s_tir.meta_schedule.database import Workload

    missing = {"workload", "trace"} - set(obj)
    if missing:
        raise ProgramError(f"workload+trace program lacks {sorted(missing)}")
    try:
        workload = obj["workload"]
        if isinstance(workload, str):  # a bare tvm.ir.save_json of the module
            mod = tvm.ir.load_json(workload)
        else:
            mod = Workload.from_json(workload).mod
    except Exception as e:
        raise ProgramError(f"workload does not load: {error_message(e)}") from None
    return apply_trace(_single_primfunc_module(mod), obj["trace"])


def apply_trace(mod, trace_json):
    """The scheduled module: a MetaSchedule trace (JSON form) replayed on its unscheduled workload."""
    tvm_env.setup()
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    try:
        sch = Schedule(mod)
        Trace.apply_json_to_schedule(trace_json, sch)
    except Exception as e:
        raise ProgramError(f"trace does not apply to its workload: {error_message(e)}") from None
    return sch.mod


def _single_primfunc_module(mod):
    tvm = tvm_env.setup()
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    if not isinstance(mod, tvm.IRModule):
        raise ProgramError(f"expected an IRModule, got {type(mod).__name__}")
    funcs = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if len(funcs) != 1:
        raise ProgramError(f"expected exactly one PrimFunc in the module, found {len(funcs)}")
    gv, func = funcs[0]
    if gv.name_hint != "main" or len(mod.functions) != 1:
        mod = tvm.IRModule({"main": func})
    return mod


def workload_trace_json(workload_mod, trace) -> dict:
    """The MetaSchedule-database form of a program: the unscheduled module and the trace applied to it."""
    tvm_env.setup()
    from tvm.s_tir.meta_schedule.database import Workload

    return {"workload": Workload(workload_mod).as_json(), "trace": to_json_value(trace.as_json())}


def to_json_value(obj: Any) -> Any:
    """TVM containers and immediates (as found in ``Trace.as_json()``) → plain JSON values."""
    tvm = tvm_env.setup()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return obj.value
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): to_json_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__iter__"):
        return [to_json_value(v) for v in obj]
    raise TypeError(f"cannot turn {type(obj).__name__} into JSON")

