"""Admission and fairness: work runs in lanes, bounded thread pools that refuse at once what they could
not start before the request's deadline (a 503 with Retry-After), instead of queueing it to a 504.

Why lanes: with one pool of ``CDMPP_THREADS`` threads, two requests of 1,024 new programs held both
threads for their whole run, so a one-program cached request waited 16.5 s in the pool's queue (issue
53). The app answers requests whose predictions are all cached, and requests of at most ``SMALL``
programs, in the small lane; bigger ones run in the large lane, in chunks of ``SMALL`` programs, so a
small request's sandbox job waits for at most one chunk, not for a whole large request.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from cdmpp.sandbox.wire import Cancelled

SMALL = 64  # programs: a request of at most this many runs in the small lane; large ones run in chunks of it


class Saturated(Exception):
    """The lane cannot start the job before its deadline; ``retry_after`` seconds is a fair guess."""

    def __init__(self, lane: str, wait_s: float):
        self.lane, self.wait_s = lane, wait_s
        self.retry_after = max(1, math.ceil(wait_s))
        super().__init__(f"the server is saturated: {lane} requests would wait ~{wait_s:.0f} s to start")


class Lane:
    """``threads`` workers; each job is weighed by its programs, and the lane keeps a running mean of the
    seconds one program takes, so it can estimate when a new job would start."""

    def __init__(self, name: str, threads: int, per_program_s: float = 0.0):
        self.name, self.threads = name, max(1, threads)
        self.executor = ThreadPoolExecutor(self.threads, thread_name_prefix=f"cdmpp-{name}")
        self.per_program_s = per_program_s  # running mean, updated as jobs finish
        self._jobs: dict[int, list] = {}  # id -> [programs, started (monotonic) or None]
        self._lock = threading.Lock()
        self.refused = 0

    def wait_estimate(self) -> float:
        """Seconds until a job submitted now would start: 0 while a thread is free, else the work ahead of
        it (what is left of the running jobs and all of the queued ones) spread over the threads."""
        now = time.monotonic()
        with self._lock:
            jobs = list(self._jobs.values())
        if len(jobs) < self.threads:
            return 0.0
        left = sum(max(0.0, n * self.per_program_s - (now - t0 if t0 is not None else 0.0)) for n, t0 in jobs)
        return left / self.threads

    def queued(self) -> int:
        with self._lock:
            return sum(t0 is None for _, t0 in self._jobs.values())

    def running(self) -> int:
        with self._lock:
            return sum(t0 is not None for _, t0 in self._jobs.values())

    def saturated(self, timeout_s: float) -> bool:
        return self.wait_estimate() > timeout_s

    async def run(self, programs: int, deadline: float, cancel: threading.Event, fn, *args):
        """``fn(*args)`` on a thread of this lane; ``Saturated`` at once when it would not start before
        ``deadline`` (monotonic); ``Cancelled`` when ``cancel`` is set before it starts."""
        wait = self.wait_estimate()
        if wait > deadline - time.monotonic():
            self.refused += 1
            raise Saturated(self.name, wait)
        job = [max(1, programs), None]
        with self._lock:
            self._jobs[id(job)] = job

        def work():
            if cancel.is_set() or time.monotonic() > deadline:  # its request gave up while it queued
                raise Cancelled("request timed out before it started")
            job[1] = t0 = time.monotonic()
            try:
                return fn(*args)
            finally:
                spent = (time.monotonic() - t0) / job[0]
                self.per_program_s = spent if self.per_program_s == 0 else 0.8 * self.per_program_s + 0.2 * spent
                self._forget(job)  # here, not when the request gives up: the thread is busy until now

        fut = asyncio.get_running_loop().run_in_executor(self.executor, work)
        fut.add_done_callback(lambda _: job[1] is None and self._forget(job))  # cancelled before it started
        return await fut

    def _forget(self, job: list) -> None:
        with self._lock:
            self._jobs.pop(id(job), None)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
