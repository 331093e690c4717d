"""Untrusted programs are parsed and featurized here: in worker processes, never in the caller's.

Why: program text is code (TVMScript is parsed by evaluating Python) and TVM's JSON loader can crash or
spin on malformed input (serve/README.md, "Threat model"). Workers are forked from a forkserver that
imported and warmed up TVM once (a replacement is ready in well under a second). Before a worker reads
any input it moves into its own empty folder, drops the server's environment (tokens), sends its output
to /dev/null, limits itself (address space ``RLIMIT_AS``, no core dumps, no file writes ``RLIMIT_FSIZE``
0, CPU seconds per program ``RLIMIT_CPU``, re-armed per item: SIGXCPU kills a worker stuck in C code),
drops to ``nobody`` when the server runs as root, and installs an audit hook that refuses file writes
outside its folder, processes, sockets and ``ctypes``. The audit hook is defence in depth, not a
boundary; the process limits and the unprivileged user are. The parent kills a worker still busy at the
request deadline and replaces dead workers in the background.

Wire protocol (pipes, 4-byte big-endian length + JSON; no pickle from worker to parent, so a subverted
worker cannot run code in the parent through its answers): parent → ``{"items", "indices", "kind",
"workload", "tvmscript"}``; worker → ``{"feats": [{"rows": base64 float32, "n", "positions", "flops",
"hash"}], "errors": [[index, reason]], "parse_s", "feat_s", "retiring"}``.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from typing import Any, Sequence

import numpy as np

from cdmpp.program.inputs import ProgramError, TARGET_KINDS

MAX_MESSAGE = 1 << 30  # bytes of one worker answer (1,024 programs of 100 leaves: ~90 MB)
TVMSCRIPT_OFF = ("TVMScript input is off on this server: it is parsed by running Python. Send the "
                 "MetaSchedule workload + trace form, or start the server with --allow-tvmscript "
                 "(CDMPP_ALLOW_TVMSCRIPT=1) if every caller is trusted")


NO_COMPUTATION = ("program computes nothing: no buffer store is left to featurize (only loops that never run "
                  "or constant stores), so there is no latency to predict")


class Cancelled(RuntimeError):
    """The request was cancelled or ran past its deadline; its busy workers were killed."""


class SharedWorkloadError(ProgramError):
    """The request's shared workload does not load: every item that needs it fails."""


def is_tvmscript(item: Any) -> bool:
    """A text item that is not JSON: TVMScript (the only wire form that is evaluated as Python)."""
    return isinstance(item, str) and not item.lstrip().startswith("{")


# ---- the parent side ---------------------------------------------------------------------------------
class _Worker:
    """One worker process and the parent's ends of its two pipes (read and written as raw fds)."""

    def __init__(self, proc, to_worker, from_worker, folder: str):
        self.proc, self.to_worker, self.from_worker, self.folder = proc, to_worker, from_worker, folder
        self.fd = from_worker.fileno()
        self.buf = bytearray()

    def send(self, msg: dict) -> None:
        data = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
        data = struct.pack(">I", len(data)) + data
        fd, view = self.to_worker.fileno(), memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def feed(self) -> dict | None:
        """Read what is there; the message once complete. EOFError when the worker died."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            raise EOFError
        self.buf += chunk
        if len(self.buf) >= 4:
            n = struct.unpack(">I", self.buf[:4])[0]
            if n > MAX_MESSAGE:
                raise EOFError
            if len(self.buf) >= 4 + n:
                msg = json.loads(bytes(self.buf[4:4 + n]))
                del self.buf[:4 + n]
                return msg
        return None

    def kill(self) -> str:
        """Kill the worker (if still running), remove its folder; how it ended, for error messages."""
        if self.proc.exitcode is None:
            self.proc.kill()
        self.proc.join()
        for c in (self.to_worker, self.from_worker):
            c.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        rc = self.proc.exitcode
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name
            return {"SIGXCPU": "ran out of its CPU-time limit", "SIGKILL": "was killed",
                    "SIGSEGV": "crashed (segmentation fault)", "SIGABRT": "crashed (abort)"}.get(name, f"died ({name})")
        return f"exited with status {rc}"


class Sandbox:
    """A pool of ``procs`` sandboxed featurizer workers. Thread-safe; ``run`` is the one entry point.

    ``item_cpu_s``: CPU seconds a worker may spend on one program (parse + features) before the kernel
    kills it; ``mem_mb``: its address-space limit (TVM + the featurizer take ~1.1 GB of it);
    ``user``: who the workers run as when the parent is root; ``kinds``: the target kinds they accept.
    """

    def __init__(self, procs: int = 1, item_cpu_s: float = 20.0, mem_mb: int = 4096, user: str = "nobody",
                 kinds: tuple[str, ...] = ("llvm",), startup_timeout_s: float = 180.0):
        self.procs = max(1, int(procs))
        self.kinds = tuple(k for k in TARGET_KINDS if k in kinds)  # targets the workers prepare (cuda: ~25 s)
        self.item_cpu_s, self.mem_mb, self.user = item_cpu_s, mem_mb, user
        self.startup_timeout_s = startup_timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._live = 0  # workers started and ready (idle or busy)
        self._all: set[_Worker] = set()  # every worker process not yet killed, for close()
        self._starting = 0
        self._closed = False
        self.restarts = 0
        self.start_errors: list[str] = []
        remove_stale_folders()
        # the forkserver (started with the first worker) prepares these target kinds once for all workers
        os.environ.setdefault("CDMPP_SANDBOX_KINDS", ",".join(self.kinds))
        for _ in range(self.procs):
            self._replace()

    # -- pool state --
    def ready(self) -> int:
        """Workers ready to take work (busy ones included); less than ``procs`` while some restart."""
        return self._live

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._live < self.procs and time.monotonic() < deadline:
            if self.start_errors and not self._starting and not self._live:
                raise RuntimeError(f"sandbox workers do not start: {self.start_errors[-1]}")
            time.sleep(0.05)
        return self._live >= self.procs

    def _replace(self) -> None:
        """Start one worker in the background (a worker takes seconds to import TVM and warm up)."""
        with self._lock:
            if self._closed:
                return
            self._starting += 1
        threading.Thread(target=self._start_one, daemon=True, name="cdmpp-sandbox-start").start()

    def _start_one(self) -> None:
        w = None
        try:
            w = self._spawn()
            deadline = time.monotonic() + self.startup_timeout_s
            msg = None
            while msg is None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([w.fd], [], [], left)[0]:
                    raise RuntimeError(f"worker not ready in {self.startup_timeout_s:g} s")
                msg = w.feed()
            if not msg.get("ready"):
                raise RuntimeError(f"worker said {msg!r}")
        except Exception as e:
            how = self._kill(w) if w is not None else ""
            self.start_errors.append(f"{e or type(e).__name__} {how}".strip())
            with self._lock:
                self._starting -= 1
            if len(self.start_errors) < 3 * self.procs:  # transient (a loaded machine): try again
                self._replace()
            return
        with self._lock:
            self._starting -= 1
            closed = self._closed
            if not closed:
                self._live += 1
        if closed:
            self._kill(w)
            return
        self._idle.put(w)

    def _spawn(self) -> _Worker:
        """Fork a worker from the forkserver, which imported and warmed up TVM once (see ``_zygote``), so a
        replacement is ready in well under a second instead of the ~5 s of a fresh interpreter."""
        folder = tempfile.mkdtemp(prefix=f"cdmpp-sandbox-{os.getpid()}-")
        uid = gid = -1
        if os.geteuid() == 0:  # the worker drops to this user itself, once its imports are done (the
            import pwd         # interpreter may live where that user cannot read, e.g. under /root)

            pw = pwd.getpwnam(self.user)
            uid, gid = pw.pw_uid, pw.pw_gid
            os.chown(folder, uid, gid)
        os.chmod(folder, 0o700)
        ctx = _context()
        job_r, job_w = ctx.Pipe(duplex=False)
        ans_r, ans_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker_main, daemon=True, name="cdmpp-sandbox",
                           args=(job_r, ans_w, folder, self.mem_mb, self.item_cpu_s, uid, gid, list(self.kinds)))
        proc.start()
        job_r.close()
        ans_w.close()
        w = _Worker(proc, job_w, ans_r, folder)
        with self._lock:
            self._all.add(w)
        return w

    def _retire(self, w: _Worker, planned: bool = False) -> str:
        """Kill and replace ``w``; ``restarts`` counts the unplanned ones (deadline, limits, crashes)."""
        how = self._kill(w)
        with self._lock:
            self._live -= 1
            self.restarts += not planned
        self._replace()
        return how

    # -- work --
    def _acquire(self, deadline: float | None, cancel: threading.Event | None) -> _Worker:
        while True:
            if cancel is not None and cancel.is_set() or deadline is not None and time.monotonic() > deadline:
                raise Cancelled("request timed out waiting for a featurizer worker")
            try:
                w = self._idle.get(timeout=0.1)
            except queue.Empty:
                continue
            if w.proc.exitcode is None:
                return w
            self._retire(w)  # died while idle (killed from outside): not a program's fault

    def _idle_worker(self) -> _Worker | None:
        """A live idle worker, if one is free now."""
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                return None
            if w.proc.exitcode is None:
                return w
            self._retire(w)

    def run(self, items: list, indices: list[int], kind: str, workload: Any = None, tvmscript: bool = False,
            deadline: float | None = None, cancel: threading.Event | None = None, _retried: bool = False):
        """Parse and featurize ``items`` (wire forms; ``indices`` name them in errors) for target ``kind``.

        Returns ``(features, [(index, reason)], parse seconds, feature seconds)``. A worker that dies on a
        chunk of several items is replaced and the items retried one by one, so the culprit is named.
        Raises ``Cancelled`` (its workers killed) when ``cancel`` is set or ``deadline`` (monotonic) passes.
        """
        if kind not in self.kinds:
            raise ProgramError(f"target {kind!r} is not served here: expected one of {', '.join(self.kinds)} "
                               "(the target kinds of this model's devices)")
        if not items:
            return [], [], 0.0, 0.0
        # one chunk per worker, each sent to whichever worker is free first (a request never holds a worker
        # it is not using, and two requests share the pool as a process pool's queue would)
        n = min(len(items), self.procs)
        bounds = [round(k * len(items) / n) for k in range(n + 1)]
        pending = [(items[a:b], indices[a:b]) for a, b in zip(bounds, bounds[1:])]
        feats_by_index: dict[int, Any] = {}
        errors: list[tuple[int, str]] = []
        retry: list[tuple[Any, int]] = []
        parse_s = feat_s = 0.0
        busy: dict[int, tuple[_Worker, list, list]] = {}
        try:
            while pending or busy:
                while pending:  # wait for a worker only when nothing of this request is in flight
                    w = self._acquire(deadline, cancel) if not busy else self._idle_worker()
                    if w is None:
                        break
                    its, ixs = pending.pop(0)
                    try:
                        w.send({"items": its, "indices": ixs, "kind": kind, "workload": workload,
                                "tvmscript": tvmscript})
                        busy[w.fd] = (w, its, ixs)
                    except (OSError, ValueError):
                        self._blame(its, ixs, self._retire(w), errors, retry, _retried)
                if not busy:
                    continue
                if cancel is not None and cancel.is_set() or deadline is not None and time.monotonic() > deadline:
                    raise Cancelled("request timed out")
                ready, _, _ = select.select(list(busy), [], [], 0.01 if pending else 0.1)
                for fd in ready:
                    w, its, ixs = busy[fd]
                    try:
                        msg = w.feed()
                    except (EOFError, OSError, ValueError, RecursionError):
                        del busy[fd]
                        self._blame(its, ixs, self._retire(w), errors, retry, _retried)
                        continue
                    if msg is None:
                        continue
                    del busy[fd]
                    try:
                        fs = [_decode(f) for f in msg["feats"]]
                        errs = [(int(i), str(r)[:500]) for i, r in msg["errors"]]
                        if not errs and len(fs) != len(ixs):
                            raise ValueError("wrong number of results")
                    except (KeyError, TypeError, ValueError, RecursionError) as e:  # a subverted or broken worker
                        self._blame(its, ixs, f"answered nonsense ({e}); {self._retire(w)}", errors, retry, True)
                        continue
                    feats_by_index.update(zip(ixs, fs) if not errs else [])
                    errors += errs
                    parse_s += float(msg.get("parse_s", 0.0))
                    feat_s += float(msg.get("feat_s", 0.0))
                    if msg.get("retiring"):
                        self._retire(w, planned=True)
                    else:
                        self._idle.put(w)
        finally:
            for w, _, _ in busy.values():  # still working at the deadline: kill, replace
                self._retire(w)
        for item, i in retry:
            f, e, p, t = self.run([item], [i], kind, workload, tvmscript, deadline, cancel, True)
            feats_by_index.update(zip([i], f) if not e else [])
            errors += e
            parse_s, feat_s = parse_s + p, feat_s + t
        if errors:
            return [], sorted(errors), parse_s, feat_s
        return [feats_by_index[i] for i in indices], [], parse_s, feat_s

    @staticmethod
    def _blame(its, ixs, how: str, errors: list, retry: list, retried: bool) -> None:
        """A worker died on a chunk: a lone item is the culprit, unless the worker was killed from outside
        (SIGKILL: not something a program does under RLIMIT_AS) and not yet retried; others go one by one."""
        if len(its) == 1 and (retried or how != "was killed"):
            errors.append((ixs[0], f"the featurizer worker {how} on this program"))
        else:
            retry.extend(zip(its, ixs))

    def _kill(self, w: _Worker) -> str:
        with self._lock:
            self._all.discard(w)
        return w.kill()

    def close(self) -> None:
        """Kill every worker (busy ones too); a ``run`` in flight then fails its items."""
        with self._lock:
            self._closed = True
            workers, self._all = list(self._all), set()
        for w in workers:
            w.kill()
        self._live = 0


def remove_stale_folders(directory: str | None = None) -> list[str]:
    """Remove worker folders of servers that no longer run (``cdmpp-sandbox-<server pid>-*``). A worker
    removes its own folder when its server dies, where it may (a sticky /tmp); elsewhere the next
    sandbox started on the machine does it here."""
    directory = directory or tempfile.gettempdir()
    gone = []
    for name in os.listdir(directory):
        parts = name.split("-")
        if len(parts) >= 4 and name.startswith("cdmpp-sandbox-") and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
                continue  # its server still runs
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # someone else's, alive
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
            gone.append(name)
    return gone


def _decode(f: dict):
    from cdmpp.program.features import N_FEATURES, ProgramFeatures

    n = int(f["n"])
    rows = np.frombuffer(base64.b64decode(f["rows"], validate=True), dtype="<f4")
    if n < 0 or rows.size != n * N_FEATURES:
        raise ValueError(f"feature rows of {rows.size} values for {n} leaves")
    pos = np.asarray(f["positions"], dtype=np.int64)
    if pos.shape != (n,):
        raise ValueError("positions do not match the leaves")
    return ProgramFeatures(rows.reshape(n, N_FEATURES).astype(np.float32), pos, float(f["flops"]),
                           str(f["hash"])[:64])


def _encode(f) -> dict:
    return {"rows": base64.b64encode(np.ascontiguousarray(f.leaf_features, dtype="<f4").tobytes()).decode(),
            "n": f.n_leaves, "positions": [int(p) for p in f.positions], "flops": f.flops, "hash": f.program_hash}


_DEFAULTS: dict[str, Sandbox] = {}
_DEFAULT_LOCK = threading.Lock()


def default_sandbox(kind: str = "llvm") -> Sandbox:
    """One sandbox worker per target kind, shared by the ``Predictor``s of this process, started on first use."""
    with _DEFAULT_LOCK:
        sb = _DEFAULTS.get(kind)
        if sb is None:
            import atexit

            sb = _DEFAULTS[kind] = Sandbox(1, kinds=(kind,))
            atexit.register(sb.close)
    return sb


# ---- shared by the worker (and by trusted in-process callers) ------------------------------------------
def featurize_items(items: list, indices: list[int], tgt, workload: Any = None, featurize=None,
                    tvmscript: bool = True, item_limit=None):
    """Parse and featurize wire items: ``(features, [(index, reason)], parse s, feature s)``.

    Each item is parsed on its own, so a bad one is named; the shared workload is parsed once. Features
    are extracted for the batch at once, item by item only when the batch fails (to name the bad ones).
    ``item_limit(n)`` (the worker's) re-arms the CPU limit for the next ``n`` items.
    """
    from cdmpp.program.inputs import load_program

    featurize = featurize or _process_featurizer()
    arm = item_limit or (lambda n: None)
    t0 = time.perf_counter()
    parsed, errors, shared_mod = [], [], None
    for i, item in zip(indices, items):
        arm(1)
        try:
            if isinstance(item, str) and not item.lstrip().startswith("{") and not tvmscript:
                raise ProgramError(TVMSCRIPT_OFF)
            if isinstance(item, str) and item.lstrip().startswith("{"):
                item = _json_item(item)
            if isinstance(item, dict) and "workload" not in item and workload is not None:
                if shared_mod is None:
                    shared_mod = _load_workload(workload, tgt)
                parsed.append(load_program(_apply_trace(shared_mod, item), tgt))
            else:
                parsed.append(load_program(item, tgt))
        except SharedWorkloadError:
            raise
        except ProgramError as e:
            errors.append((i, str(e)))
        except RecursionError:
            errors.append((i, "program is nested too deeply"))
        except MemoryError:
            errors.append((i, "program needs more memory than a featurizer worker may use"))
        except Exception as e:  # anything TVM raises on odd input is still the input's fault
            errors.append((i, f"program does not load: {_first_line(e)}"))
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
                errors.append((i, f"feature extraction failed: {_first_line(e)}"))
    errors += [(i, NO_COMPUTATION) for i, f in zip(indices, feats) if f.n_leaves == 0]
    return ([] if errors else feats), errors, t1 - t0, time.perf_counter() - t1


_FEATURIZER = None


def _process_featurizer():
    global _FEATURIZER
    if _FEATURIZER is None:
        from cdmpp.program.features import Featurizer

        _FEATURIZER = Featurizer()
    return _FEATURIZER


def _json_item(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ProgramError(f"program looks like JSON but does not parse: {e}") from None


def _load_workload(workload: Any, tgt):
    """The shared workload as a one-PrimFunc module (``Workload.as_json()`` or a ``tvm.ir.save_json`` string)."""
    from cdmpp.program import tvm_env
    from cdmpp.program.inputs import load_program

    tvm = tvm_env.setup()
    from tvm.s_tir.meta_schedule.database import Workload

    try:
        mod = tvm.ir.load_json(workload) if isinstance(workload, str) else Workload.from_json(workload).mod
        return load_program(mod, tgt).mod
    except Exception as e:
        raise SharedWorkloadError(f"shared workload does not load: {_first_line(e)}") from None


def _apply_trace(mod, item: dict):
    from cdmpp.program.inputs import apply_trace

    if "trace" not in item:
        raise ProgramError("workload+trace program lacks ['trace']")
    return apply_trace(mod, item["trace"])


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]


# ---- the worker process --------------------------------------------------------------------------------
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


def _context():
    """The forkserver context, its server preloaded with ``cdmpp.sandbox.zygote`` (TVM imported, warm)."""
    import multiprocessing as mp

    global _CTX
    with _DEFAULT_LOCK:
        if _CTX is None:
            _CTX = mp.get_context("forkserver")
            _CTX.set_forkserver_preload(["cdmpp.sandbox.zygote"])
    return _CTX


_CTX = None
_WARM: dict[str, Any] = {}


def warm_up(kinds: Sequence[str] = ("llvm",)) -> None:
    """Import TVM, build the targets of ``kinds`` (cuda: ~25 s) and run the featurizer once on the shipped
    sample (trusted package data), so every module a job needs is loaded before a worker drops
    privileges (the interpreter's own files may be unreadable to ``nobody``) and a forked worker starts
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
    _, errors, _, _ = featurize_items([sample, json.dumps(wt)], [0, 1], llvm)
    if errors:
        raise RuntimeError(f"sandbox warm-up failed: {errors}")


def _worker_main(job_conn, answer_conn, folder: str, mem_mb: int, item_cpu_s: float, uid: int, gid: int,
                 kinds: list[str]) -> None:
    """Limit this process, drop to ``uid``/``gid`` (when >= 0), then serve jobs until the pipe closes.
    Runs in a process forked from the warm forkserver; no request content has been read before the
    limits are in place."""
    os.chdir(folder)
    for key in list(os.environ):  # secrets of the server (CDMPP_TOKEN) are not the worker's business
        if key not in ("PATH", "LANG", "TVM_NUM_THREADS"):
            del os.environ[key]
    os.environ.update(HOME=folder, TMPDIR=folder, TVM_NUM_THREADS="1")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # stray prints (TVM, hostile code) go nowhere
        os.dup2(null, fd)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    mem = mem_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu_hard = 3600  # a worker's lifetime CPU; it retires well before reaching it
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
    in_fd, out_fd = job_conn.fileno(), answer_conn.fileno()
    parent = os.getppid()
    leaving = threading.Event()

    def leave():  # exit, removing this worker's folder (a parent killed with SIGKILL cannot)
        leaving.set()
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    def exit_with_parent():  # the forkserver exits with the server; a worker must not outlive them
        while os.getppid() == parent:
            time.sleep(0.5)
        leave()

    threading.Thread(target=exit_with_parent, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: leave())  # multiprocessing terminates daemons at its exit

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

    warm_up()  # a no-op when forked from the zygote
    targets = {k: _WARM.get(k) or parse_target(k) for k in kinds}
    if gid >= 0:
        os.setgroups([])
        os.setgid(gid)
    if uid >= 0:
        os.setuid(uid)
    try:  # not dumpable: /proc/self/environ and /proc/self/mem (the server's environment, inherited through
        import ctypes  # the forkserver) become unreadable to this process's own user

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass
    subprocess = sys.modules.get("subprocess")
    if subprocess is not None:  # its fork_exec helper starts processes without an audit event
        subprocess._posixsubprocess = None
    sys.modules.pop("_posixsubprocess", None)
    sys.addaudithook(_audit_hook(os.path.realpath(folder), leaving))
    send({"ready": True, "pid": os.getpid()})
    while True:
        msg = json.loads(read(struct.unpack(">I", read(4))[0]))
        try:
            feats, errors, p, t = featurize_items(msg["items"], msg["indices"], targets[msg["kind"]],
                                                  msg.get("workload"), tvmscript=bool(msg.get("tvmscript")),
                                                  item_limit=item_limit)
        except SharedWorkloadError as e:
            feats, errors, p, t = [], [(i, str(e)) for i in msg["indices"]], 0.0, 0.0
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
        # retire after evaluating TVMScript (its Python may have changed this process for the next caller)
        # or well before the lifetime CPU limit; the parent forks a fresh one from the forkserver
        retiring = any(is_tvmscript(it) for it in msg["items"]) or used() > cpu_hard / 2
        send({"feats": [_encode(f) for f in feats], "errors": errors, "parse_s": p, "feat_s": t, "retiring": retiring})
        if retiring:
            os._exit(0)
