"""One way to turn an exception into the line a user reads (a request's error, a record's ``error``)."""

from __future__ import annotations


def error_message(e: BaseException | str, lines: int = 1, limit: int = 300) -> str:
    """The informative part of an error, on one line. TVMScript diagnostics start with ``error: ...``
    followed by a source excerpt: that line and its location. Otherwise the last ``lines`` non-empty lines
    joined by `` | ``: TVM's C++ errors end with ``...Error: message``, after the stack."""
    text = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    for ln in text:
        if ln.lower().startswith("error:"):
            line = ln[len("error:"):].strip()
            loc = next((x[3:].strip() for x in text if x.startswith("-->")), "")
            return (f"{line} (at {loc})" if loc else line)[:limit]
    if not text:
        return type(e).__name__ if isinstance(e, BaseException) else "unknown error"
    return " | ".join(text[-lines:])[:limit]
