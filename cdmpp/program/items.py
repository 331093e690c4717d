"""A program as a request carries it: TVMScript text, a workload+trace JSON text or dict, or a trace alone
that applies to the request's shared workload. ``load_item`` turns one into a ``Program``."""

from __future__ import annotations

import json
from typing import Any

from cdmpp.errors import error_message
from cdmpp.program import tvm_env
from cdmpp.program.inputs import Program, ProgramError, apply_trace, load_program


class SharedWorkloadError(ProgramError):
    """The request's shared workload does not load: every item that needs it fails."""


def load_workload(workload: Any, target):
    """The shared workload as a one-PrimFunc module (``Workload.as_json()`` or a ``tvm.ir.save_json`` string)."""
    tvm = tvm_env.setup()
    from tvm.s_tir.meta_schedule.database import Workload

    try:
        mod = tvm.ir.load_json(workload) if isinstance(workload, str) else Workload.from_json(workload).mod
        return load_program(mod, target).mod
    except Exception as e:
        raise SharedWorkloadError(f"shared workload does not load: {error_message(e)}") from None


def load_item(item: Any, target, shared: Any = None) -> Program:
    """One wire item as a ``Program``. ``shared``: a callable that returns the shared workload's module
    (loaded once, on first use) for items that carry a trace but no workload."""
    if isinstance(item, str) and item.lstrip().startswith("{"):
        try:
            item = json.loads(item)
        except json.JSONDecodeError as e:
            raise ProgramError(f"program looks like JSON but does not parse: {e}") from None
    if isinstance(item, dict) and "workload" not in item and shared is not None:
        mod = shared()
        if "trace" not in item:
            raise ProgramError("workload+trace program lacks ['trace']")
        return load_program(apply_trace(mod, item["trace"]), target)
    return load_program(item, target)
