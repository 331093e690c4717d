"""Pausing and stopping a measurement: PAUSE files, stop requests and signals, no folders left behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TERM_SCRIPT = textwrap.dedent("""
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads
    tvm_env.setup(1)
    from cdmpp.cli import stop_signals_interrupt
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.metaschedule import MetaScheduleMeasurer
    cfg = MeasureConfig(repeat=3, min_repeat_ms=1, builders=1, quiet_share=1.0)
    with stop_signals_interrupt(), MetaScheduleMeasurer(tvm_env.make_target("llvm", num_cores=1), cfg) as m:
        print(m.tmp_root, flush=True)
        run_one = m._run_one
        m._run_one = lambda inp: (print("running", flush=True), run_one(inp))[1]
        # unscheduled: the first runs for seconds; a stop during its run ends the batch before the second
        m.measure([workloads.matmul(1024, 1024, 1024), workloads.matmul(16, 16, 16)])
""")


@pytest.mark.slow
def test_sigterm_midway_leaves_no_build_folders():
    """``kill`` in the middle of a batch (as the CLI runs it) still removes what the batch built."""
    proc = subprocess.Popen([sys.executable, "-c", TERM_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, TVM_NUM_THREADS="1"))
    try:
        root = proc.stdout.readline().strip()
        # the run begins (the build written): a signal now lands mid-run, however late a loaded machine reads this
        assert proc.stdout.readline().strip() == "running", proc.stderr.read()
        assert any(files for _, _, files in os.walk(root))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a hung run must not outlive the test
    assert "KeyboardInterrupt" in err and not os.path.exists(root)


@pytest.mark.slow
def test_a_stop_request_ends_measuring_before_the_next_program(measurer):
    """TVM may swallow the KeyboardInterrupt of a stop signal; ``STOP`` still ends the batch."""
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.stop import STOP
    from cdmpp.zoo import workloads

    m = measurer(MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0))
    runs, run_one = [], m._run_one
    m._run_one = lambda inp: (runs.append(inp), STOP.set(), run_one(inp))[2]
    try:
        with pytest.raises(KeyboardInterrupt):
            m.measure([workloads.matmul(16, 16, 16), workloads.matmul(32, 32, 32)])
    finally:
        STOP.clear()
    assert len(runs) == 1 and not os.listdir(m.tmp_root)


@pytest.mark.slow
def test_pause_stops_a_run_phase_midway_and_reruns_it_once_resumed(tmp_path, measurer):
    """PAUSE created while a batch runs stops it before its next program; whatever ran meanwhile may have
    disturbed the programs already run, so the whole run phase is run again once PAUSE is gone."""
    import threading

    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    from cdmpp.measure.measurer import MeasureConfig

    flag = tmp_path / "PAUSE"
    m = measurer(MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, quiet_share=1.0), pause_flag=str(flag))
    runs, run_one, paused_at = [], m._run_one, []

    def run_one_then_pause(inp):
        runs.append(inp.artifact_path)
        out = run_one(inp)
        if len(runs) == 1:  # someone pauses while the first program runs, and resumes 3 s later
            flag.touch()
            paused_at.append(time.time())
            threading.Timer(3.0, flag.unlink).start()
        return out

    m._run_one = run_one_then_pause
    out = m.measure([workloads.matmul(16, 16, 16), workloads.matmul(32, 32, 32)])
    assert [err for _, err, _, _ in out] == [None, None] and all(secs for secs, _, _, _ in out)
    assert len(runs) == 3 and runs[0] == runs[1] != runs[2]  # first program, then the whole phase again
    assert time.time() - paused_at[0] >= 3.0


def test_pause_files_in_the_dataset_folder_or_its_parent(tmp_path):
    from cdmpp.measure.stop import pause_files

    ds = tmp_path / "measurements"
    ds.mkdir()
    (tmp_path / "PAUSED").write_text("")  # not a pause flag
    (ds / "xPAUSE").write_text("")
    assert pause_files(str(ds)) == []
    (tmp_path / "PAUSE.accuracy").write_text("")
    (ds / "PAUSE").write_text("")
    assert pause_files(str(ds)) == [str(ds / "PAUSE"), str(tmp_path / "PAUSE.accuracy")] or \
        sorted(pause_files(str(ds))) == sorted([str(ds / "PAUSE"), str(tmp_path / "PAUSE.accuracy")])
