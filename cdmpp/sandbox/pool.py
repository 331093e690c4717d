"""Untrusted programs are parsed and featurized here: in worker processes, never in the caller's.

Why: program text is code (TVMScript is parsed by evaluating Python) and TVM's JSON loader can crash or
spin on malformed input (serve/README.md, "Threat model"). Workers (``cdmpp.sandbox.worker``) are forked
from a zygote, a fresh interpreter with an allow-listed environment that imported and warmed up TVM once
(``cdmpp.sandbox.zygote``; a replacement is ready in well under a second), and limit and confine themselves
before they read any input. The parent (``Sandbox``) trusts nothing a worker says about itself: it
validates every answer (types, shapes, finite numbers), retires a worker after any job with TVMScript,
kills a worker still busy at the request deadline and replaces dead workers in the background; what passes
between them is ``cdmpp.sandbox.wire``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from cdmpp.program.inputs import TARGET_KINDS, ProgramError
from cdmpp.sandbox.wire import BUILDING, MAX_MESSAGE, Cancelled, decode_features, is_tvmscript, nonfinite

log = logging.getLogger("cdmpp.sandbox")


OUT_OF_CPU = "ran out of its CPU-time limit"  # how a worker ended that SIGXCPU killed (``_Worker.kill``)


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
        """Read what is there; the first message once complete. EOFError when the worker died."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            raise EOFError
        self.buf += chunk
        return self.take()

    def take(self) -> dict | None:
        """The next complete message already read (a worker may send two in one write), else None."""
        if len(self.buf) >= 4:
            n = struct.unpack(">I", self.buf[:4])[0]
            if n > MAX_MESSAGE:
                raise EOFError
            if len(self.buf) >= 4 + n:
                msg = json.loads(bytes(self.buf[4:4 + n]))
                del self.buf[:4 + n]
                if not isinstance(msg, dict):
                    raise ValueError("an answer that is not a JSON object")
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
        self.proc.forget()
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name
            return {"SIGXCPU": OUT_OF_CPU, "SIGKILL": "was killed",
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
        _refuse_while_bootstrapping()
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
        self.confinement: dict = {}  # what the workers said at start: Landlock ABI (None: missing) and detail
        remove_stale_folders()
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
            self._note_confinement(msg)
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

    def _note_confinement(self, msg: dict) -> None:
        """Log the OS layers a worker reports (once per change): what it said, never trusted for more."""
        seen = {"landlock": msg.get("landlock"), "detail": str(msg.get("confinement", ""))[:300],
                "seccomp": bool(msg.get("seccomp")), "seccomp_detail": str(msg.get("seccomp_detail", ""))[:300]}
        if seen != self.confinement:
            self.confinement = seen
            if seen["landlock"] and seen["seccomp"]:
                log.info("sandbox workers confined: %s", self.confined())
            else:
                log.warning("sandbox workers confined by %s only (landlock: %s; seccomp: %s)", self.confined(),
                            seen["detail"], seen["seccomp_detail"])

    def _spawn(self) -> _Worker:
        """Fork a worker from the zygote, which imported and warmed up TVM once, so a replacement is ready
        in well under a second instead of the ~5 s of a fresh interpreter."""
        folder = tempfile.mkdtemp(prefix=f"cdmpp-sandbox-{os.getpid()}-")
        uid = gid = -1
        if os.geteuid() == 0:  # the worker drops to this user itself, once its imports are done (the
            import pwd  # interpreter may live where that user cannot read, e.g. under /root)

            pw = pwd.getpwnam(self.user)
            uid, gid = pw.pw_uid, pw.pw_gid
            os.chown(folder, uid, gid)
        os.chmod(folder, 0o700)
        job_r, job_w = os.pipe()
        ans_r, ans_w = os.pipe()
        try:
            proc = _zygote(self.kinds, self.startup_timeout_s).spawn(
                {"folder": folder, "mem_mb": self.mem_mb, "item_cpu_s": self.item_cpu_s, "uid": uid, "gid": gid,
                 "kinds": list(self.kinds)}, [job_r, ans_w], self.startup_timeout_s)
        except BaseException:
            for fd in (job_w, ans_r):
                os.close(fd)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            os.close(job_r)
            os.close(ans_w)
        w = _Worker(proc, os.fdopen(job_w, "wb", buffering=0), os.fdopen(ans_r, "rb", buffering=0), folder)
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
                if len(self.start_errors) >= 3 * self.procs and not self._starting and not self._live:
                    raise RuntimeError(f"sandbox workers do not start: {self.start_errors[-1]}") from None
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
            deadline: float | None = None, cancel: threading.Event | None = None, _retried: bool = False,
            build: dict | None = None):
        """Parse and featurize ``items`` (wire forms; ``indices`` name them in errors) for target ``kind``; with
        ``build`` (a CPU target dict) also build each for it, its instruction counts in its features.

        Returns ``(features, [(index, reason)], parse seconds, feature seconds)``. A worker that dies on a
        chunk of several items is replaced and the items retried one by one, so the culprit is named. A chunk
        whose worker runs out of CPU time after saying it was building (a program whose build runs past the limit; not
        a crash, nor a parse: a TVMScript parse bomb) is first asked again without ``build``, so its programs are
        answered unbuilt (flagged ``assembly_not_built``) rather than failed, and no slow build runs twice. A worker
        that lies about building costs at most that one unbuilt retry.
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
        unbuilt: list[tuple[list, list]] = []  # chunks to ask again without the build

        def lost(its, ixs, how: str, was_building: bool) -> None:  # the worker of a chunk died on it
            # out of CPU time while building: asked again unbuilt; a crash, or a parse that ran out, is not the build's
            # doing (asked again, it would cost a second worker each time)
            if build is not None and how == OUT_OF_CPU and was_building:
                unbuilt.append((its, ixs))
            else:
                self._blame(its, ixs, how, errors, retry, _retried)

        parse_s = feat_s = 0.0
        busy: dict[int, tuple[_Worker, list, list]] = {}
        building: set[int] = set()  # busy workers that said they were building
        try:
            while pending or busy:
                while pending:  # wait for a worker only when nothing of this request is in flight
                    w = self._acquire(deadline, cancel) if not busy else self._idle_worker()
                    if w is None:
                        break
                    its, ixs = pending.pop(0)
                    try:
                        w.send({"items": its, "indices": ixs, "kind": kind, "workload": workload,
                                "tvmscript": tvmscript, "build": build})
                        busy[w.fd] = (w, its, ixs)
                    except (OSError, ValueError):  # gone before it had the chunk: not the build's doing
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
                        while msg == BUILDING:
                            building.add(fd)
                            msg = w.take()
                    except (EOFError, OSError, ValueError, RecursionError):
                        del busy[fd]
                        lost(its, ixs, self._retire(w), fd in building)
                        building.discard(fd)
                        continue
                    if msg is None:
                        continue
                    del busy[fd]
                    building.discard(fd)
                    ran_code = tvmscript and any(is_tvmscript(it) for it in its)
                    try:
                        fs, errs = _validate(msg, ixs)
                        p_s, f_s = float(msg.get("parse_s", 0.0)), float(msg.get("feat_s", 0.0))
                    except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as e:  # subverted or broken
                        self._blame(its, ixs, f"answered nonsense ({str(e)[:200]}); {self._retire(w)}", errors,
                                    retry, True)
                        continue
                    feats_by_index.update(zip(ixs, fs) if not errs else [])
                    errors += errs
                    parse_s += p_s
                    feat_s += f_s
                    # the parent decides: a worker that evaluated TVMScript may have rewritten itself
                    if ran_code or msg.get("retiring"):
                        self._retire(w, planned=True)
                    else:
                        self._idle.put(w)
        finally:
            for w, _, _ in busy.values():  # still working at the deadline: kill, replace
                self._retire(w)
        for its, ixs in unbuilt:
            f, e, p, t = self.run(its, ixs, kind, workload, tvmscript, deadline, cancel, _retried, None)
            feats_by_index.update(zip(ixs, f) if not e else [])
            errors += e
            parse_s, feat_s = parse_s + p, feat_s + t
        for item, i in retry:
            f, e, p, t = self.run([item], [i], kind, workload, tvmscript, deadline, cancel, True, build)
            feats_by_index.update(zip([i], f) if not e else [])
            errors += e
            parse_s, feat_s = parse_s + p, feat_s + t
        if errors:
            return [], sorted(errors), parse_s, feat_s
        return [feats_by_index[i] for i in indices], [], parse_s, feat_s

    def confined(self) -> str:
        """Which confinement layers the workers run under, in words (for health checks and logs)."""
        c = self.confinement
        if not c:
            return "unknown (no worker started yet)"
        layers = [f"landlock ABI {c['landlock']}"] if c["landlock"] else []
        layers += ["seccomp"] if c["seccomp"] else []
        layers += ["rlimits"] + (["unprivileged user"] if os.geteuid() == 0 else []) + ["audit hook"]
        return ", ".join(layers)

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


def _refuse_while_bootstrapping() -> None:
    """A process that multiprocessing is still bootstrapping re-runs the parent's script (spawn,
    forkserver): a script without an ``if __name__ == "__main__":`` guard that predicts would start workers
    from every worker, and wait on them for ever. Say so instead (multiprocessing's own check)."""
    from multiprocessing import process

    if getattr(process.current_process(), "_inheriting", False):
        raise RuntimeError('cdmpp predicts through sandbox worker processes, and this process is a worker that '
                           'is re-running your script: put the code that predicts under '
                           '`if __name__ == "__main__":` (see "Safe importing of main module" in the '
                           'multiprocessing documentation)')


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


def _validate(msg: dict, ixs: list[int]) -> tuple[list, list[tuple[int, str]]]:
    """A worker's answer checked as untrusted input: ``(features, [(index, reason)])``. Raises ValueError
    (or KeyError / TypeError) for an answer of the wrong shape; non-finite features are the item's error."""
    if not isinstance(msg.get("feats"), list) or not isinstance(msg.get("errors"), list):
        raise ValueError("no feats / errors lists")
    errs = []
    for e in msg["errors"]:
        i, r = e
        if not isinstance(i, int) or i not in ixs or not isinstance(r, str):
            raise ValueError("an error for an item it was not sent")
        errs.append((i, r[:500]))
    if errs:
        return [], errs
    if len(msg["feats"]) != len(ixs):
        raise ValueError("wrong number of results")
    fs = [decode_features(f) for f in msg["feats"]]
    bad = [(i, why) for i, f in zip(ixs, fs) if (why := nonfinite(f))]
    return ([], bad) if bad else (fs, [])


class _Proc:
    """A worker process as the zygote reports it: ``pid``, ``exitcode`` (None while it runs), ``kill``,
    ``join`` (the zygote, its parent, reaps it and says how it ended)."""

    def __init__(self, zygote: "_Zygote", pid: int):
        self.zygote, self.pid, self._rc = zygote, pid, None

    @property
    def exitcode(self) -> int | None:
        if self._rc is None:
            self._rc = self.zygote.exits.get(self.pid)
        return self._rc

    def kill(self) -> None:
        self.zygote.kill(self.pid)

    def join(self, timeout: float = 30.0) -> None:
        with self.zygote.cond:
            self.zygote.cond.wait_for(lambda: self.pid in self.zygote.exits, timeout)

    def forget(self) -> None:
        """Drop the zygote's record of this exit (kept here), so the table does not grow with every worker."""
        if self.exitcode is not None:
            with self.zygote.cond:
                self.zygote.exits.pop(self.pid, None)


# what the zygote's environment may hold: nothing of the server's (tokens), only what Python and TVM need
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV")


class _Zygote:
    """The parent's side of ``cdmpp.sandbox.zygote``: started with an allow-listed environment and no
    descriptor but its socket; a reader thread collects spawn replies and exit statuses."""

    def __init__(self, kinds: tuple[str, ...], timeout: float):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.exists(p))  # the parent's imports
        env["TVM_NUM_THREADS"] = "1"
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "cdmpp.sandbox.zygote", str(child.fileno()),
                                          ",".join(kinds)], pass_fds=[child.fileno()], env=env, cwd="/",
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            child.close()
        self.sock = parent
        self.exits: dict[int, int] = {}
        self.cond = threading.Condition()
        self.replies: queue.Queue = queue.Queue()
        self.dead = False
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True, name="cdmpp-zygote").start()
        try:
            msg = self.replies.get(timeout=timeout)
        except queue.Empty:
            msg = {"error": f"sandbox zygote not ready in {timeout:g} s"}
        if not msg.get("ready"):
            self.close()
            raise RuntimeError(msg.get("error") or f"sandbox zygote said {msg!r}")
        self.pid = int(msg["pid"])

    def _read(self) -> None:
        pids: set[int] = set()
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            if "exit" in msg:
                pids.discard(int(msg["exit"]))
                with self.cond:
                    self.exits[int(msg["exit"])] = int(msg["rc"])
                    self.cond.notify_all()
            else:
                if "pid" in msg and not msg.get("ready"):
                    pid = int(msg["pid"])
                    pids.add(pid)
                    with self.cond:  # a reused pid: an earlier worker's exit is not this one's
                        self.exits.pop(pid, None)
                self.replies.put(msg)
        # the zygote died (its workers exit when they see it gone): say so to every waiter
        with self.cond:
            self.dead = True
            for pid in pids - set(self.exits):
                self.exits[pid] = -signal.SIGKILL
            self.cond.notify_all()
        self.replies.put({"error": "sandbox zygote exited"})

    def spawn(self, spec: dict, fds: list[int], timeout: float) -> _Proc:
        with self._send_lock:  # one request at a time, so replies come in order
            if self.dead:
                raise RuntimeError("sandbox zygote exited")
            socket.send_fds(self.sock, [json.dumps({"spawn": spec}).encode()], fds)
            try:
                msg = self.replies.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError("sandbox zygote did not answer") from None
        if "pid" not in msg:
            raise RuntimeError(msg.get("error") or f"sandbox zygote said {msg!r}")
        return _Proc(self, int(msg["pid"]))

    def kill(self, pid: int) -> None:
        try:
            with self._send_lock:
                self.sock.send(json.dumps({"kill": pid}).encode())
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()  # the zygote sees EOF, kills its workers and exits
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_ZYGOTES: dict[tuple[str, ...], _Zygote] = {}
_ZYGOTE_LOCK = threading.Lock()


def _zygote(kinds: tuple[str, ...], timeout: float) -> _Zygote:
    """A zygote of this process warmed up for every kind of ``kinds`` (a worker would otherwise build a
    missing target itself: cuda takes ~25 s), started on first use, again if it died."""
    with _ZYGOTE_LOCK:
        for have, z in list(_ZYGOTES.items()):
            if z.dead:
                del _ZYGOTES[have]
            elif set(kinds) <= set(have):
                return z
        z = _ZYGOTES[tuple(kinds)] = _Zygote(kinds, timeout)
        return z
