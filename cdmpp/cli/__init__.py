"""The ``cdmpp`` command line: ``main`` parses and runs one command. Each sub-module holds the commands of
one area (``predict``, ``devices``, ``measure``, ``evaluation``, ``service``) and only parses their options
and calls the library; every command imports TVM/torch lazily."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys

from cdmpp.cli.devices import add_devices_commands
from cdmpp.cli.evaluation import add_eval_commands
from cdmpp.cli.imports import add_import_commands
from cdmpp.cli.measure import add_measure_commands
from cdmpp.cli.predict import VersionAction, add_predict_commands
from cdmpp.cli.service import add_service_commands


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cdmpp", description="Latency prediction for TVM tensor programs.")
    p.add_argument("--version", action=VersionAction, help="print cdmpp's version and the shipped model's, and exit")
    sub = p.add_subparsers(dest="command", required=True)
    add_predict_commands(sub)
    add_devices_commands(sub)
    bsub = add_measure_commands(sub)
    add_service_commands(sub, bsub)
    add_eval_commands(sub, bsub)
    add_import_commands(sub)
    return p


@contextlib.contextmanager
def stop_signals_interrupt():
    """SIGTERM (``kill``, process managers) stops a command the way Ctrl-C does, so that its cleanup runs:
    by default it ends Python at once, and a stopped collection left its batch of build folders behind.
    While a batch is measured, the Measurer stops at its next build or run instead (``request_stop``).
    Yields the list of signals received: a KeyboardInterrupt raised while TVM calls back into Python
    comes back out of TVM as a RuntimeError."""
    from cdmpp.measure.stop import STOP, request_stop

    received: list[int] = []

    def interrupt(signum, frame):
        received.append(signum)
        if not request_stop():
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        STOP.clear()


def main(argv: list[str] | None = None) -> int:
    """Bad input (unknown device, missing file, malformed program or dataset) ends with one line that
    says what is wrong and exit status 2; a stop signal with status 130; anything else is a bug and keeps
    its traceback."""
    args = build_parser().parse_args(argv)
    with stop_signals_interrupt() as received:
        try:
            return int(args.func(args) or 0)
        except (ValueError, KeyError, FileNotFoundError) as e:
            plain_key = isinstance(e, KeyError) and type(e).__str__ is KeyError.__str__ and e.args  # str() quotes
            msg = e.args[0] if plain_key else str(e)
            print(f"cdmpp {args.command}: {msg}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, RuntimeError) as e:
            if isinstance(e, RuntimeError) and not received:
                raise
            print(f"cdmpp {args.command}: interrupted", file=sys.stderr)
            return 130
