"""Import TVM the way cdmpp needs it: fast, with the right threads and a full target.

Three traps of TVM 0.27 (see shared TVM-NOTES): ``tvm.s_tir.tensor_intrin`` takes ~50 s to import
(every MetaSchedule builder worker pays it), TVM runs one thread unless told otherwise, and LLVM
targets without ``mcpu`` generate generic x86 code. Every cdmpp module gets TVM from here.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

_READY = False


def _stub_tensor_intrin() -> None:
    """Register ``tvm.s_tir.tensor_intrin`` as an empty package, then load only the x86 intrinsics."""
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    import tvm.s_tir as s_tir  # noqa: F401  (parent must exist)

    folder = os.path.join(os.path.dirname(s_tir.__file__), "tensor_intrin")
    stub = types.ModuleType(name)
    stub.__path__ = [folder]
    stub.__file__ = os.path.join(folder, "__init__.py")
    sys.modules[name] = stub
    importlib.import_module(name + ".x86")


def setup(num_threads: int | None = None):
    """Import and prepare TVM once per process; returns the ``tvm`` module.

    ``num_threads`` sets ``TVM_NUM_THREADS`` (inherited by builder/runner workers) if not already set.
    """
    global _READY
    if num_threads is not None:
        os.environ["TVM_NUM_THREADS"] = str(num_threads)
    else:
        os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    import tvm

    if not _READY:
        _known_source_files()
        _stub_tensor_intrin()
        _popen_workers_without_torch()
        _READY = True
    return tvm


def keep_torch_out() -> None:
    """For a process that needs TVM, not PyTorch (build, run and featurize workers), before TVM is imported:
    tvm_ffi imports torch whenever it can, which doubles TVM's import (4 s instead of 2 s here) and its memory
    (~200 MB). A None entry makes ``import torch`` raise ImportError, which tvm_ffi takes as "not installed"."""
    sys.modules.setdefault("torch", None)  # a process that already has torch keeps it


def _popen_workers_without_torch() -> None:
    """TVM starts each popen worker (MetaSchedule's builders and runners, a new one per ``LocalBuilder.build``)
    as ``python -m tvm.exec.popen_worker``, which imports torch through tvm_ffi: 5 s of CPU per worker instead
    of 2. Start them through ``cdmpp.program.popen_worker`` instead, the same worker with torch kept out. The
    body is ``PopenWorker._start``'s of TVM 0.27 on POSIX, with the module name changed."""
    import subprocess

    from tvm.support import popen_pool

    if sys.platform == "win32":
        return

    def _start(self):
        if self._proc is not None:
            return
        main_read, worker_write = os.pipe()
        worker_read, main_write = os.pipe()
        cmd = [sys.executable, "-m", "cdmpp.program.popen_worker", str(worker_read), str(worker_write)]
        self._proc = subprocess.Popen(cmd, pass_fds=(worker_read, worker_write), stdout=self._stdout,
                                      stderr=self._stderr)
        os.close(worker_read)
        os.close(worker_write)
        self._reader = os.fdopen(main_read, "rb")
        self._writer = os.fdopen(main_write, "wb")

    popen_pool.PopenWorker._start = _start


def worker_initializer() -> None:
    """Initializer for MetaSchedule builder/runner pools (must live in an installed module)."""
    setup(int(os.environ.get("TVM_NUM_THREADS", "1")))


def load_cuda_intrinsics() -> None:
    """CUDA sketches (tensor cores) need the CUDA intrinsics; load them only when a CUDA target is used."""
    setup()
    importlib.import_module("tvm.s_tir.tensor_intrin.cuda")


def _known_source_files() -> None:
    """TVMScript looks up the source file of every frame on the stack for each function it parses. For a file
    that does not exist ``inspect.getmodule`` scans all of ``sys.modules``: frozen frames (the import system's
    while a module is imported, runpy's under ``python -m``) and TVMScript's own compiled snippets (``<ast>``).
    The CUDA intrinsics took 14 s to load in a fresh process and 90 s in a test worker holding 3,000 modules; a
    program's TVMScript parsed there in 91 ms instead of 29. Entered in inspect's own cache, each look-up gives
    at once what the scan gave (the frozen module; none for ``<ast>``)."""
    import inspect

    for name in ("importlib._bootstrap", "importlib._bootstrap_external", "runpy", "zipimport"):
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)
    inspect.modulesbyfile.setdefault("<ast>", "<ast>")  # a name no module has: getmodule answers None


def host_mcpu() -> str:
    setup()
    from tvm.target import codegen

    return codegen.llvm_get_system_cpu()


def make_target(kind: str = "llvm", num_cores: int | None = None, mcpu: str | None = None, arch: str | None = None):
    """Build a full ``tvm.target.Target`` from a short description.

    ``kind``: ``llvm`` (host CPU, ``mcpu`` defaults to this machine's) or ``cuda`` (``arch`` defaults to sm_80).
    """
    tvm = setup()
    if kind == "llvm":
        cfg = {"kind": "llvm", "mcpu": mcpu or host_mcpu(), "num-cores": int(num_cores or os.cpu_count() or 1)}
    elif kind == "cuda":
        load_cuda_intrinsics()
        cfg = {"kind": "cuda", "arch": arch or "sm_80", "max_threads_per_block": 1024,
               "max_shared_memory_per_block": 49152, "thread_warp_size": 32,
               "host": {"kind": "llvm", "mcpu": host_mcpu(), "num-cores": int(os.cpu_count() or 1)}}
    else:
        raise ValueError(f"unknown target kind {kind!r}: expected 'llvm' or 'cuda'")
    return tvm.target.Target(cfg)
