"""Programs: what cdmpp accepts (``load_program``), their compact AST and features. Imported lazily."""

from __future__ import annotations

__all__ = ["load_program", "Program", "ProgramError"]


def __getattr__(name: str):
    if name in __all__:
        from cdmpp.program import inputs

        return getattr(inputs, name)
    raise AttributeError(f"module 'cdmpp.program' has no attribute {name!r}")
