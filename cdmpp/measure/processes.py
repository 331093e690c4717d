"""Process handling of the fast measurer (``cdmpp.measure.fast``), apart from what it times: starting
worker processes (spawned, pinned to cores, dying with their parent), a request with a hard timeout to a
long-lived process that is killed and restarted when it hangs or crashes, a build pool that is replaced
when a job hangs or kills its worker, stopping and continuing a pool's processes and their children
(SIGSTOP/SIGCONT), waits that a stop signal ends, and which cores the runner and the builders get.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import signal
import time
from typing import Callable

from cdmpp.errors import error_message

STARTUP_S = 120.0  # a new runner process imports TVM


def die_with_parent() -> None:
    """A worker of a collector that was SIGKILLed would otherwise wait forever (Linux: PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def pin(cores: list[int] | None) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError:
            pass


class Runner:
    """The parent's handle on a long-lived process serving requests (``main(conn, *args)``, a function of
    an installed module: it is spawned): one request at a time, a hard timeout, restart on a crash or a
    timeout (the request in flight is answered with the error, the next one runs). ``main`` first sends
    ``("ready", None)``, then answers each request with ``("ok", value)`` or ``("error", message)``;
    ``None`` asks it to exit. ``restart_after_error``: the process exits after an error (a GPU context a
    failed kernel left unusable), so it is started afresh."""

    def __init__(self, main: Callable, args: tuple, timeout_s: float, restart_after_error: bool = False):
        self.main, self.args, self.timeout_s, self.restart_after_error = main, args, timeout_s, restart_after_error
        self.proc = self.conn = None
        self.ready = False

    def start(self) -> None:
        """Start the process (it imports TVM meanwhile); ``run`` waits until it is ready."""
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=self.main, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def _start(self) -> None:
        if self.proc is None or not self.proc.is_alive():
            self.start()
        if self.ready:
            return
        if not self.conn.poll(STARTUP_S) or self.conn.recv()[0] != "ready":  # TVM's import, not a run
            self.close(kill=True)
            raise RuntimeError(f"the runner process did not start within {STARTUP_S} s")
        self.ready = True

    def request(self, msg) -> tuple[object | None, str | None]:
        """``(value, None)``, or ``(None, why)`` when it failed, timed out or the process died."""
        if self.proc is None or not self.proc.is_alive() or not self.ready:
            self._start()
        self.conn.send(msg)
        if not self.conn.poll(self.timeout_s):
            self.close(kill=True)
            return None, f"Timeout: runner killed after {self.timeout_s:g} s"
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            code = self.proc.exitcode if self.proc else None
            self.close(kill=True)
            return None, f"runner process died (exit code {code})"
        if kind != "ok" and self.restart_after_error:  # it exits after such an error: start afresh
            self.close(kill=True)
        return (value, None) if kind == "ok" else (None, "run: " + value)

    def close(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        try:
            if kill:
                self.proc.kill()
            else:
                self.conn.send(None)
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        except (OSError, ValueError):
            pass
        self.proc = self.conn = None
        self.ready = False


class Builders:
    """A pool of spawned processes that run ``job(**kwargs)`` (a function of an installed module), each
    process started by ``initializer(*initargs)``; a crashed or hung pool is replaced."""

    def __init__(self, workers: int, job: Callable, initializer: Callable, initargs: tuple = ()):
        self.workers, self.job, self.initializer, self.initargs = workers, job, initializer, initargs
        self.pool = None

    def submit(self, **kwargs) -> cf.Future:
        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                               initializer=self.initializer, initargs=self.initargs)
        return self.pool.submit(self.job, **kwargs)

    def result(self, fut: cf.Future) -> tuple[object | None, str | None]:
        """The job's ``(value, None)``, or ``(None, why)``. The caller has waited the job's budget: a job not
        done by now has hung, and the pool is replaced."""
        if not fut.done():
            self.close(kill=True)
            return None, "build: timed out"
        try:
            return fut.result(), None
        except cf.process.BrokenProcessPool:
            self.close(kill=True)
            return None, "build: worker process crashed"
        except Exception as e:
            return None, "build: " + error_message(e, lines=3, limit=600)

    def close(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        if kill:
            for p in list((getattr(self.pool, "_processes", None) or {}).values()):
                try:
                    p.kill()
                except OSError:
                    pass
        self.pool.shutdown(wait=not kill, cancel_futures=True)
        self.pool = None


def send_signal(pid: int, sig) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Processes below ``pid`` (Linux /proc), parents before children."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(0), []):
            out.append(c)
            todo.append(c)
    return out


def hold(pool) -> list[int]:
    """Stop (SIGSTOP) the processes of ``pool`` (a ``ProcessPoolExecutor`` or None) and their children
    (a linker one may be running); returns their pids, for ``release``."""
    held = []
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        if send_signal(p.pid, signal.SIGSTOP):  # first the worker, so that it starts no new child
            held.append(p.pid)
            for child in descendants(p.pid):
                if send_signal(child, signal.SIGSTOP):
                    held.append(child)
    return held


def release(pids: list[int]) -> None:
    """Continue (SIGCONT) what ``hold`` stopped."""
    for pid in pids:
        send_signal(pid, signal.SIGCONT)


def wait_stoppable(futures, timeout: float | None = None) -> bool:
    """Wait for all ``futures`` in one-second slices, so a stop signal never waits on a long build (it
    raises KeyboardInterrupt); False if ``timeout`` seconds passed first."""
    from cdmpp.measure.stop import STOP

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
        if not cf.wait(futures, timeout=left).not_done:
            return True
        if STOP.is_set():
            raise KeyboardInterrupt
        if deadline is not None and time.monotonic() >= deadline:
            return False


def next_ready(queue, budget: float):
    """Remove and return the first ``(job, future, pool)`` of ``queue`` whose build is done, waiting until
    one is; the head, done or not, once ``budget`` seconds pass. Taking builds as they finish, not in the
    order submitted, a task slow to sample or build holds up only its own worker, not all those behind it."""
    from cdmpp.measure.stop import STOP

    deadline = time.monotonic() + budget
    while True:
        for i, item in enumerate(queue):
            if item[1].done():
                del queue[i]
                return item
        if STOP.is_set():
            raise KeyboardInterrupt
        left = deadline - time.monotonic()
        if left <= 0:
            return queue.popleft()
        cf.wait([f for _, f, _ in queue], timeout=min(1.0, left), return_when=cf.FIRST_COMPLETED)


def default_overlap(threads: int, device_type: str = "cpu") -> bool:
    """Overlap unless told otherwise: 1-thread CPU programs on a machine with more cores (on this 2-core
    VM it kept the labels as good as without it, datasets/README.md "The fast measurer"), and GPU programs
    (the host's other cores build while the GPU runs; without overlap only ``--builders`` workers build)."""
    spare = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1
    return spare and (device_type != "cpu" or threads == 1)


def cores_for(threads: int, overlap: bool) -> tuple[list[int] | None, list[int] | None]:
    """(runner cores, builder cores): with overlap the runner gets the first ``threads`` cores alone."""
    if not overlap or not hasattr(os, "sched_getaffinity"):
        return None, None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= threads:
        raise ValueError(f"--overlap needs more than {threads} core(s); this process may use {len(cores)}")
    return cores[:threads], cores[threads:]
