"""Payloads of the hostile tests: TVMScript that runs Python when parsed, and the marker files an
attempt would create if it got through."""

import tempfile
import uuid
from importlib import resources
from pathlib import Path

TMP = Path(tempfile.gettempdir())
RUN = uuid.uuid4().hex[:12]
MARKERS: list[Path] = []  # every path an attempt tries to create


def marker_path(where: Path, tag: str) -> str:
    """A file that an attempt tries to create: its existence afterwards means the attempt got through."""
    p = where / f"cdmpp-pwned-{RUN}-{tag}"
    MARKERS.append(p)
    return str(p)


# ---- payloads ---------------------------------------------------------------------------------------------
SAMPLE = (resources.files("cdmpp") / "samples" / "conv2d.tvmscript").read_text()
STORE = "pad_temp[v_i0, v_i1, v_i2, v_i3] = T.if_then_else("
IMP = 'T.grid.__globals__["__builtins__"]["__import__"]'


def tvmscript_with(expr: str) -> str:
    """The shipped conv2d with ``expr`` evaluated inside one store (the issue's injection point)."""
    assert STORE in SAMPLE
    return SAMPLE.replace(STORE, STORE.replace("= T.if_then_else(", f"= T.float32({expr}) + T.if_then_else("), 1)
