"""Which code made a thing: the checkout's commit, stored with a trained checkpoint and an evaluation report."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The short commit of the checkout cdmpp runs from; None outside a git checkout (an installed wheel)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
