"""Untrusted programs are parsed and featurized here: in worker processes, never in the caller's.

Why: program text is code (TVMScript is parsed by evaluating Python) and TVM's JSON loader can crash or
spin on malformed input (serve/README.md, "Threat model"). Workers (``cdmpp.sandbox.worker``) are forked
from a forkserver that imported and warmed up TVM once (``cdmpp.sandbox.zygote``; a replacement is ready in
well under a second) and limit themselves before they read any input. The parent (``Sandbox``) kills a
worker still busy at the request deadline and replaces dead workers in the background; what passes
between them is ``cdmpp.sandbox.wire``.
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import signal
import struct
import tempfile
import threading
import time
from typing import Any

from cdmpp.program.inputs import TARGET_KINDS, ProgramError
from cdmpp.sandbox.wire import MAX_MESSAGE, Cancelled, decode_features
from cdmpp.sandbox.worker import worker_main


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
            import pwd  # interpreter may live where that user cannot read, e.g. under /root)

            pw = pwd.getpwnam(self.user)
            uid, gid = pw.pw_uid, pw.pw_gid
            os.chown(folder, uid, gid)
        os.chmod(folder, 0o700)
        ctx = _context()
        job_r, job_w = ctx.Pipe(duplex=False)
        ans_r, ans_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=worker_main, daemon=True, name="cdmpp-sandbox",
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
                        fs = [decode_features(f) for f in msg["feats"]]
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


