"""The worker side of the sandbox: a process forked from the zygote (``cdmpp.sandbox.zygote``) that limits
itself, then parses and featurizes the programs its parent sends until it is retired or killed.

Before a worker reads any input it closes every descriptor but its two pipes, moves into its own empty
folder, keeps an allow-listed environment, sends its output to /dev/null, limits itself (address space
``RLIMIT_AS``, no core dumps, ``RLIMIT_FSIZE`` 0, CPU seconds per program ``RLIMIT_CPU``, re-armed per item:
SIGXCPU kills a worker stuck in C code), drops to ``nobody`` when the server runs as root, confines itself
with Landlock where the kernel has it (no file created, written, truncated or removed anywhere, no exec, no
TCP) and a seccomp filter (the same by syscall, plus no sockets: ``cdmpp.sandbox.confine``) and installs an audit hook that refuses file writes, processes, sockets and
``ctypes`` from Python. The audit hook is defence in depth, not a boundary; Landlock, the process limits and
the unprivileged user are. Nothing a worker says about itself is trusted: the parent validates its answers
and decides when it retires (``cdmpp.sandbox.pool``)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import sys
import threading
import time
from typing import Any, Sequence

from cdmpp.errors import error_message
from cdmpp.program.inputs import ProgramError
from cdmpp.program.items import SharedWorkloadError, load_item, load_workload
from cdmpp.sandbox.wire import BUILDING, NO_COMPUTATION, TVMSCRIPT_OFF, encode_features, is_tvmscript, nonfinite


def featurize_items(items: list, indices: list[int], tgt, workload: Any = None, featurize=None,
                    tvmscript: bool = True, item_limit=None, build: dict | None = None, on_build=None):
    """Parse and featurize wire items: ``(features, [(index, reason)], parse s, feature s)``.

    Each item is parsed on its own, so a bad one is named; the shared workload is parsed once. Features
    are extracted for the batch at once, item by item only when the batch fails (to name the bad ones).
    ``item_limit(n)`` (the worker's) re-arms the CPU limit for the next ``n`` items. ``build``: a CPU target
    (dict) each program is also built for, its instruction counts in its features (``asm``; None where the
    build fails: ``cdmpp.program.assembly.with_counts``); ``on_build()`` is called before the first build.
    """
    featurize = featurize or _process_featurizer()
    arm = item_limit or (lambda n: None)
    t0 = time.perf_counter()
    parsed, errors, loaded = [], [], []

    def shared():
        if not loaded:
            loaded.append(load_workload(workload, tgt))
        return loaded[0]

    for i, item in zip(indices, items):
        arm(1)
        try:
            if is_tvmscript(item) and not tvmscript:
                raise ProgramError(TVMSCRIPT_OFF)
            parsed.append(load_item(item, tgt, shared if workload is not None else None))
        except SharedWorkloadError:
            raise
        except ProgramError as e:
            errors.append((i, str(e)))
        except RecursionError:
            errors.append((i, "program is nested too deeply"))
        except MemoryError:
            errors.append((i, "program needs more memory than a featurizer worker may use"))
        except Exception as e:  # anything TVM raises on odd input is still the input's fault
            errors.append((i, f"program does not load: {error_message(e)}"))
    t1 = time.perf_counter()
    if errors:
        return [], errors, t1 - t0, 0.0
    try:
        arm(len(parsed))
        feats = featurize(parsed, tgt)
    except Exception:
        feats = []
        for i, prog in zip(indices, parsed):
            arm(1)
            try:
                feats.append(featurize([prog], tgt)[0])
            except ProgramError as e:
                errors.append((i, str(e)))
            except Exception as e:
                errors.append((i, f"feature extraction failed: {error_message(e)}"))
    errors += [(i, NO_COMPUTATION) for i, f in zip(indices, feats) if f.n_leaves == 0]
    errors += [(i, why) for i, f in zip(indices, feats) if f.n_leaves and (why := nonfinite(f))]
    if build is not None and not errors:
        from cdmpp.program.assembly import with_counts
        from cdmpp.program.inputs import parse_target

        target = parse_target(build)
        if on_build is not None:
            on_build()  # the worker tells its parent: if the CPU limit ends it now, the build is why
        built = []
        for prog, f in zip(parsed, feats):
            arm(1)
            built.append(with_counts(f, prog.mod, target))
        feats = built
    return ([] if errors else feats), errors, t1 - t0, time.perf_counter() - t1


_FEATURIZER = None


def _process_featurizer():
    global _FEATURIZER
    if _FEATURIZER is None:
        from cdmpp.program.features import Featurizer

        _FEATURIZER = Featurizer()
    return _FEATURIZER



_DENIED_EVENTS = ("subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
                  "pty.spawn", "os.kill", "os.killpg", "socket.", "ctypes.", "os.remove", "os.rename",
                  "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate", "os.chmod", "os.chown",
                  "os.chflags", "os.utime", "os.setxattr", "os.removexattr", "shutil.", "os.putenv",
                  "os.unsetenv", "sys.remote_exec", "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.",
                  "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.mkfifo", "os.mknod")


_DENIED_IMPORTS = frozenset({"_posixsubprocess", "ctypes", "_ctypes", "socket", "_socket", "pty", "_ssl", "ssl"})


_SECRET_PROC = frozenset({"environ", "mem", "maps", "cmdline", "fd", "map_files"})  # another process's, or ours


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit_hook(folder: str, leaving: threading.Event):
    def hook(event: str, args: tuple) -> None:
        if leaving.is_set():  # the worker's own exit: it removes its folder
            return
        if event.startswith(_DENIED_EVENTS):
            raise PermissionError(f"not allowed in a cdmpp featurizer worker: {event}")
        if event == "import" and args and str(args[0]).split(".")[0] in _DENIED_IMPORTS:
            raise PermissionError(f"not allowed in a cdmpp featurizer worker: import {args[0]}")
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            if isinstance(path, int):
                return
            real = os.path.realpath(os.fsdecode(path))
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and not real.startswith(folder + os.sep):
                raise PermissionError(f"not allowed in a cdmpp featurizer worker: writing {real}")
            parts = real.split(os.sep)
            if len(parts) > 3 and parts[1] == "proc" and (parts[2] != str(os.getpid()) or parts[3] in _SECRET_PROC):
                raise PermissionError(f"not allowed in a cdmpp featurizer worker: reading {real}")
    return hook


_WARM: dict[str, Any] = {}


def warm_up(kinds: Sequence[str] = ("llvm",)) -> None:
    """Import TVM, build the targets of ``kinds`` (cuda: ~25 s) and run the featurizer once on the shipped
    sample (trusted package data), built for the CPU as a model that reads the assembly's counts asks, so every
    module a job needs (TVM's compile pipeline too) is loaded before a worker drops privileges (the interpreter's
    own files may be unreadable to ``nobody``: a wheel installed under a 0700 folder) and a forked worker starts
    warm."""
    if _WARM:
        return
    from importlib import resources

    from cdmpp.program import tvm_env
    from cdmpp.program.inputs import load_program, parse_target, to_json_value

    tvm_env.setup(1)
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import Workload

    llvm = _WARM["llvm"] = parse_target("llvm")
    for k in kinds:
        _WARM[k] = _WARM.get(k) or parse_target(k)
    sample = (resources.files("cdmpp") / "samples" / "conv2d.tvmscript").read_text()
    mod = load_program(sample, llvm).mod
    wt = {"workload": Workload(mod).as_json(), "trace": to_json_value(Schedule(mod).trace.as_json())}
    feats, errors, _, _ = featurize_items([sample, json.dumps(wt)], [0, 1], llvm, build={"kind": "llvm"})
    if errors or any(f.asm is None for f in feats):
        raise RuntimeError(f"sandbox warm-up failed: {errors or 'the sample did not build'}")


def worker_main(job_fd: int, answer_fd: int, folder: str, mem_mb: int, item_cpu_s: float, uid: int, gid: int,
                kinds: list[str]) -> None:
    """Limit and confine this process, drop to ``uid``/``gid`` (when >= 0), then serve jobs read from
    ``job_fd`` until the pipe closes. Runs in a process forked from the warm zygote; no request content
    has been read before the limits are in place."""
    in_fd, out_fd = job_fd, answer_fd
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # stray prints (TVM, hostile code) go nowhere
        os.dup2(null, fd)
    lo = 3  # nothing inherited but the two pipes (the zygote's socket included)
    for keep in sorted({in_fd, out_fd}):
        os.closerange(lo, keep)
        lo = keep + 1
    top = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    os.closerange(lo, top if 0 < top < 1 << 24 else 1 << 20)  # close_range(2): as fast for any bound
    os.chdir(folder)
    for key in list(os.environ):  # the zygote's environment is allow-listed already; keep it that way
        if key not in ("PATH", "LANG", "TVM_NUM_THREADS"):
            del os.environ[key]
    os.environ.update(HOME=folder, TMPDIR=folder, TVM_NUM_THREADS="1")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    mem = mem_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu_hard = 3600  # a worker's lifetime CPU; it retires well before reaching it
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
    parent = os.getppid()
    leaving = threading.Event()

    def leave():  # exit, removing this worker's folder where it may (the parent removes it otherwise)
        leaving.set()
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, lambda *_: leave())

    def used() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def item_limit(n: int) -> None:
        soft = min(cpu_hard, int(used() + item_cpu_s * n) + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))

    def read(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = os.read(in_fd, n - len(out))
            if not chunk:
                leave()  # the parent is gone
            out += chunk
        return bytes(out)

    def send(msg: dict) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode()
        view = memoryview(struct.pack(">I", len(data)) + data)
        while view:
            view = view[os.write(out_fd, view):]

    from cdmpp.program.inputs import parse_target
    from cdmpp.sandbox.confine import landlock, seccomp

    warm_up()  # a no-op when forked from the zygote
    targets = {k: _WARM.get(k) or parse_target(k) for k in kinds}
    if gid >= 0:
        os.setgroups([])
        os.setgid(gid)
    if uid >= 0:
        os.setuid(uid)
    import ctypes  # not dumpable: /proc/self/mem and friends closed to this process's own user

    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    abi, detail = landlock()  # single-threaded still: both bind this thread and those it starts later
    filtered, filter_detail = seccomp()

    def exit_with_parent():  # the zygote exits with the server; a worker must not outlive them
        while os.getppid() == parent:
            time.sleep(0.5)
        leave()

    threading.Thread(target=exit_with_parent, daemon=True).start()
    subprocess = sys.modules.get("subprocess")
    if subprocess is not None:  # its fork_exec helper starts processes without an audit event
        subprocess._posixsubprocess = None
    sys.modules.pop("_posixsubprocess", None)
    sys.addaudithook(_audit_hook(os.path.realpath(folder), leaving))
    send({"ready": True, "pid": os.getpid(), "landlock": abi, "confinement": detail, "seccomp": filtered,
          "seccomp_detail": filter_detail})
    while True:
        msg = json.loads(read(struct.unpack(">I", read(4))[0]))
        try:
            feats, errors, p, t = featurize_items(msg["items"], msg["indices"], targets[msg["kind"]],
                                                  msg.get("workload"), tvmscript=bool(msg.get("tvmscript")),
                                                  item_limit=item_limit, build=msg.get("build"),
                                                  on_build=lambda: send(BUILDING))
        except SharedWorkloadError as e:
            feats, errors, p, t = [], [(i, str(e)) for i in msg["indices"]], 0.0, 0.0
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
        # retire after evaluating TVMScript or well before the lifetime CPU limit (the parent retires a
        # TVMScript worker anyway: code that ran here may have rewritten this very check)
        retiring = any(is_tvmscript(it) for it in msg["items"]) or used() > cpu_hard / 2
        send({"feats": [encode_features(f) for f in feats], "errors": errors, "parse_s": p, "feat_s": t,
              "retiring": retiring})
        if retiring:
            os._exit(0)
