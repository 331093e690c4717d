"""Admission and fairness: work runs in lanes, bounded thread pools that refuse at once what they could
not start, or not finish once started, before the request's deadline (a 503 with Retry-After), instead
of queueing it to a 504.

Why lanes: with one pool of ``CDMPP_THREADS`` threads, two requests of 1,024 new programs held both
threads for their whole run, so a one-program cached request waited 16.5 s in the pool's queue (issue
53). The app answers requests whose predictions are all cached at once, requests of at most ``SMALL``
new programs in the small lane, bigger ones in the large lane, in chunks of ``SMALL`` programs, so a
small request's sandbox job waits for at most one chunk, not for a whole large request. Jobs are weighed
by their new programs, so the pace learnt on mostly cached requests holds for new ones and back.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from cdmpp.sandbox.wire import Cancelled

SMALL = 64  # new programs: a request of at most this many runs in the small lane; large ones in chunks of it
JOB_UNITS = 8  # a job's own work (hashing its items, the model), in new programs: a mostly cached job of 64
# programs took about as long as 8 new ones (32 clients, bench serve's mixed phase)


class Saturated(Exception):
    """The lane cannot do the job before its deadline; ``retry_after`` seconds is a fair guess."""

    def __init__(self, lane: str, wait_s: float):
        self.lane, self.wait_s = lane, wait_s
        self.retry_after = max(1, math.ceil(wait_s))
        super().__init__(f"the server is saturated: {lane} work would end in ~{wait_s:.0f} s")


class Lane:
    """``threads`` workers. A job is weighed in units (programs); the lane keeps a running mean of the
    seconds a unit takes (``pace``), learnt from each finished job and from the progress a running job
    reports, so it can tell when a new job would start and end."""

    def __init__(self, name: str, threads: int, pace: float):
        self.name, self.threads = name, max(1, threads)
        self.executor = ThreadPoolExecutor(self.threads, thread_name_prefix=f"cdmpp-{name}")
        self.pace = pace  # seconds per unit: a prior until the first job reports
        self._jobs: dict[int, list] = {}  # id -> [units, started (monotonic) or None, units done]
        self._lock = threading.Lock()
        self.refused = 0

    def _learn(self, seconds_per_unit: float) -> None:
        self.pace = 0.7 * self.pace + 0.3 * seconds_per_unit

    def wait_estimate(self) -> float:
        """Seconds until a job submitted now would start: 0 while a thread is free, else the work ahead of
        it (what is left of the running jobs and all of the queued ones) spread over the threads."""
        with self._lock:
            jobs = [(n, done) for n, _, done in self._jobs.values()]
        if len(jobs) < self.threads:
            return 0.0
        return sum(max(0, n - done) for n, done in jobs) * self.pace / self.threads

    def queued(self) -> int:
        with self._lock:
            return sum(t0 is None for _, t0, _ in self._jobs.values())

    def running(self) -> int:
        with self._lock:
            return sum(t0 is not None for _, t0, _ in self._jobs.values())

    def saturated(self, timeout_s: float) -> bool:
        """A job of one unit submitted now would not start within ``timeout_s``."""
        return self.wait_estimate() + self.pace > timeout_s

    async def run(self, units: int, deadline: float, cancel: threading.Event, fn, *args, report: bool = False,
                  learn: bool = True):
        """``fn(*args)`` on a thread of this lane (``fn(*args, progress)`` with ``report``: it calls
        ``progress(k)`` after each ``k`` units done). ``Saturated`` at once when it would have to wait
        for a thread and would then not end before ``deadline`` (monotonic); a job that can start at once
        always runs (so the lane keeps learning its pace). ``Cancelled`` when ``cancel`` is set before it
        starts. ``learn=False``: a job unlike the others (``/v1/network``) does not teach the pace."""
        units = max(1, units)
        wait = self.wait_estimate()
        need = wait + units * self.pace
        if wait > 0 and need > deadline - time.monotonic():
            self.refused += 1
            raise Saturated(self.name, need)
        job = [units, None, 0]
        with self._lock:
            self._jobs[id(job)] = job

        def work():
            if cancel.is_set() or time.monotonic() > deadline:  # its request gave up while it queued
                raise Cancelled("request timed out before it started")
            if self.running() and units * self.pace > deadline - time.monotonic():  # the pace learnt while it
                self.refused += 1  # queued says it would end in a 504: say so now, and leave the time to others
                raise Saturated(self.name, units * self.pace)
            job[1] = t0 = last = time.monotonic()

            def progress(k: int) -> None:
                nonlocal last
                now = time.monotonic()
                if k > 0:
                    self._learn((now - last) / k)
                    job[2] += k
                last = now

            try:
                return fn(*args, progress) if report else fn(*args)
            finally:
                if learn and not job[2] and not cancel.is_set():  # nothing reported: learn from the whole job
                    self._learn((time.monotonic() - t0) / units)
                self._forget(job)  # here, not when the request gives up: the thread is busy until now

        fut = asyncio.get_running_loop().run_in_executor(self.executor, work)
        fut.add_done_callback(lambda _: job[1] is None and self._forget(job))  # cancelled before it started
        return await fut

    def _forget(self, job: list) -> None:
        with self._lock:
            self._jobs.pop(id(job), None)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
