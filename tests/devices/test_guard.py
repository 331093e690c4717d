"""``CpuGuard``: other processes' CPU time, and the wait for a quiet machine."""

import os
import subprocess
import sys
import threading
import time

import pytest


def _quiet_guard(max_share: float):
    """A ``CpuGuard`` and the share others use now; skips the test when the machine is too busy to tell."""
    from cdmpp.devices.guard import CpuGuard

    guard = CpuGuard()
    mark = guard.start()
    time.sleep(1.0)
    quiet = guard.others_share(mark)
    if quiet > max_share:
        pytest.skip(f"other processes already use {quiet:.0%} of the CPU: the guard cannot be checked now")
    return guard, quiet


@pytest.mark.slow
def test_cpu_guard_sees_other_processes():
    guard, quiet = _quiet_guard(0.3)
    # a busy loop outside this process tree (its shell parent exits, so init adopts it)
    subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time; t=time.time()\nwhile time.time()-t<3: pass' &"], check=True)
    time.sleep(0.3)
    mark = guard.start()
    time.sleep(1.5)
    busy = guard.others_share(mark)
    assert busy > quiet + 0.2, (quiet, busy)
    # our own work is not counted: the CPU time this process spins goes to its tree, which the guard subtracts
    # (not a comparison of two windows' shares, which the other processes of a loaded machine move)
    tree, cpu = guard._tree(), time.process_time()
    while time.process_time() - cpu < 0.5:
        pass
    assert guard._tree() - tree >= 0.4 * os.sysconf("SC_CLK_TCK")
    time.sleep(2.0)  # let the outside loop end before the next test looks for a quiet machine


def test_cpu_guard_counts_exited_children_as_ours():
    """A child that ran and exited (a killed runner worker) is part of this tree, not another process."""
    guard, quiet = _quiet_guard(0.1)
    mark = guard.start()
    subprocess.run([sys.executable, "-c", "import time; t=time.time()\nwhile time.time()-t<1.5: pass"], check=True)
    assert guard.others_share(mark) < quiet + 0.15


def test_a_stop_signal_is_honoured_while_waiting_for_a_quiet_machine(monkeypatch):
    from cdmpp.devices.guard import CpuGuard

    guard = CpuGuard()
    if not guard.enabled:
        pytest.skip("no /proc")
    monkeypatch.setattr(CpuGuard, "others_share", lambda self, mark: 1.0)  # never quiet
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    t = time.time()
    with pytest.raises(KeyboardInterrupt):
        guard.wait_quiet(0.05, 600, stop=stop)
    assert time.time() - t < 5
