"""``CpuGuard``: measure (or probe this machine) only while other processes leave the CPU alone.

Other processes are the main source of noise on a small machine: a 2-thread kernel whose second
thread is descheduled waits a whole time slice at its barrier (a 10 µs kernel measured 100x slower
while another process was busy). So every run phase is guarded: the guard waits until the CPU time
used by processes outside the collector stays under ``quiet_share`` for a second, the batch is
measured, and re-measured (up to ``max_tries``) if others used more than ``quiet_share`` meanwhile.
Records keep the share of CPU that others used during their run (``others_cpu``)."""

from __future__ import annotations

import os
import platform
import threading
import time


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class CpuGuard:
    """CPU time used by processes outside this process tree, from /proc (Linux); inert elsewhere."""

    def __init__(self):
        self.enabled = os.path.exists("/proc/stat")
        self.ncpu = os.cpu_count() or 1

    @staticmethod
    def _busy_total() -> float:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4]  # all but idle and iowait

    @staticmethod
    def _tree() -> float:
        """CPU time of this process and all its descendants, including descendants that already exited
        (cutime + cstime): a runner worker killed after a timeout must not count as another process."""
        me = os.getpid()
        parent, times = {}, {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(fields[1])
            times[int(d)] = sum(float(x) for x in fields[11:15])
        total, ours = 0.0, {me}
        changed = True
        while changed:
            changed = False
            for pid, pp in parent.items():
                if pp in ours and pid not in ours:
                    ours.add(pid)
                    changed = True
        for pid in ours:
            total += times.get(pid, 0.0)
        return total

    def start(self):
        return (time.monotonic(), self._busy_total(), self._tree()) if self.enabled else None

    def others_share(self, mark) -> float:
        """Share of all cores' time used by other processes since ``mark``."""
        if not mark:
            return 0.0
        t0, busy0, ours0 = mark
        dt = time.monotonic() - t0
        ticks = os.sysconf("SC_CLK_TCK") * dt * self.ncpu
        other = (self._busy_total() - busy0) - (self._tree() - ours0)
        return max(0.0, other / ticks) if ticks > 0 else 0.0

    def wait_quiet(self, share: float, max_wait_s: float, on_wait=None, stop: threading.Event | None = None) -> float:
        """Block until others use < ``share`` of the CPU over one second (at most ``max_wait_s``, then go
        on: the run is marked disturbed if others stay busy); returns seconds waited. ``stop`` set:
        KeyboardInterrupt, so a stop signal is honoured while waiting."""
        if not self.enabled or share >= 1.0:  # others can never use more than all of it: nothing to wait for
            return 0.0
        t0 = time.monotonic()
        while time.monotonic() - t0 < max_wait_s:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            mark = self.start()
            time.sleep(1.0)
            if self.others_share(mark) < share:
                break
            if on_wait:
                on_wait(time.monotonic() - t0)
        return time.monotonic() - t0
