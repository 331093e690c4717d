"""Pausing and stopping a measurement: ``PAUSE`` files, the stop signal, and the temporary folders a
stopped measurer leaves behind.

Create the file ``PAUSE`` in the dataset folder to pause (delete it to go on): builds in flight finish,
no further program runs, and a run phase it interrupted is run again in full once resumed. To stop,
send SIGTERM or press Ctrl-C (``cdmpp.cli``): the run ends after the program in flight, keeps every
finished batch and removes what it built; ``collect`` or ``remeasure`` run again resumes it."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import threading
import time


def pause_files(dataset_dir: str) -> list[str]:
    """Files named ``PAUSE`` or ``PAUSE.<anything>`` in the dataset folder or its parent
    (``datasets/PAUSE.accuracy`` pauses a collection into ``datasets/measurements``): whoever trains or
    tests creates one of their own and removes it after, without touching anyone else's."""
    out = []
    for d in {os.path.abspath(dataset_dir), os.path.dirname(os.path.abspath(dataset_dir))}:
        try:
            out += [os.path.join(d, n) for n in os.listdir(d) if n == "PAUSE" or n.startswith("PAUSE.")]
        except OSError:
            pass
    return sorted(out)


ROOT_PREFIX = "cdmpp-measure-"  # + pid: the Measurer's temporary folder


STOP = threading.Event()  # a stop signal came (``request_stop``): Measurers stop before their next build or run


_measuring = threading.Event()  # a Measurer is inside ``measure``


def request_stop() -> bool:
    """For a signal handler. True if a Measurer is measuring: it stops before its next build or run, and
    the handler should raise nothing (a KeyboardInterrupt raised inside TVM's callbacks was swallowed by
    TVM, or left a lock of its worker pool held). False: the handler should raise KeyboardInterrupt."""
    STOP.set()
    return _measuring.is_set()


@contextlib.contextmanager
def stop_at(deadline: float | None):
    """A budget (``--budget-minutes``): at ``deadline`` (``time.monotonic()``) the measurers stop as on a stop
    signal (``STOP``), wherever they are: waiting for a quiet machine, for a build or between runs. Yields an
    Event that is set once the deadline fired: the caller turns the KeyboardInterrupt that follows into
    "stopped by budget". STOP is cleared again on the way out."""
    fired = threading.Event()
    timer = None
    if deadline is not None:
        def fire():
            fired.set()
            STOP.set()

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), fire)
        timer.daemon = True
        timer.start()
    try:
        yield fired
    finally:
        if timer is not None:
            timer.cancel()
        if fired.is_set():
            STOP.clear()


def _remove_stale_roots() -> None:
    """Temporary folders of Measurers whose process is gone (killed with SIGKILL, or the machine rebooted
    with /tmp kept): each holds at most the one batch that was being built and run."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), ROOT_PREFIX + "*-*")):
        pid = os.path.basename(path)[len(ROOT_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: another user's process, alive
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
