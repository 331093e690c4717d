"""A script that predicts through the sandbox never hangs: without an ``if __name__ == "__main__":`` guard
it works (the workers start from a fresh interpreter, not by re-running it) or says what to do; a pool
whose workers cannot start raises instead of waiting for ever."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from cdmpp.defaults import MODEL
from cdmpp.model.kinds import is_checkpoint

SCRIPT = textwrap.dedent("""
    from pathlib import Path
    import cdmpp
    from cdmpp import Predictor
    text = (Path(cdmpp.__file__).parent / "samples" / "conv2d.tvmscript").read_text()
    p = Predictor.load()
    print("seconds", p.predict([text], "amd-epyc-znver4-2t/llvm-avx512")[0].seconds)
""")  # no __main__ guard, on purpose


def test_a_sandbox_started_while_multiprocessing_bootstraps_says_to_add_the_guard(monkeypatch):
    from multiprocessing import process

    from cdmpp.sandbox.pool import Sandbox

    monkeypatch.setattr(process.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match='if __name__ == "__main__":'):
        Sandbox(1)


def test_a_pool_whose_workers_cannot_start_raises_instead_of_waiting(monkeypatch):
    from cdmpp.sandbox import pool

    def broken(self):
        raise OSError("cannot start a worker here")

    monkeypatch.setattr(pool.Sandbox, "_spawn", broken)
    sb = pool.Sandbox(1)
    try:
        with pytest.raises(RuntimeError, match="sandbox workers do not start: cannot start a worker here"):
            sb.run(["T.prim_func"], [0], "llvm", tvmscript=True)
    finally:
        sb.close()


@pytest.mark.slow
@pytest.mark.skipif(not is_checkpoint(MODEL), reason="no shipped model")
def test_a_script_without_the_main_guard_predicts_or_says_why(tmp_path):
    script = tmp_path / "predict_it.py"
    script.write_text(SCRIPT)
    # the timeout is a hang detector only (the script hung 18 minutes), not a speed check
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    if r.returncode == 0:
        assert float(r.stdout.split()[-1]) > 0
    else:
        assert '__name__ == "__main__"' in r.stderr, r.stderr[-3000:]
