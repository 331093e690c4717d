"""The command line's own behaviour: stop signals."""

import os
import signal
import time

import pytest


def test_a_stop_signal_ends_a_command_as_interrupted(monkeypatch, capsys):
    """SIGTERM mid-command runs its cleanup and exits 130, also when the interrupt was raised inside a
    TVM callback and came back out of TVM as a RuntimeError; the handlers are restored afterwards."""
    from cdmpp import cli
    from cdmpp.cli import measure

    cleaned, handler = [], signal.getsignal(signal.SIGTERM)

    def noise(args):
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            except KeyboardInterrupt:
                raise RuntimeError("KeyboardInterrupt")  # what TVM's FFI turns it into
        finally:
            cleaned.append(True)

    monkeypatch.setattr(measure, "cmd_noise", noise)
    assert cli.main(["noise", "--device", "d"]) == 130
    assert cleaned == [True] and "cdmpp noise: interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is handler

    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(measure, "cmd_noise", broken)
    with pytest.raises(RuntimeError, match="a bug"):  # without a signal a RuntimeError is a bug
        cli.main(["noise", "--device", "d"])
