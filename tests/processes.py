"""Processes as /proc sees them (Linux): what a server left behind, and a free port to start one on."""

import os
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``."""
    kids: dict[int, list[int]] = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def still_running(pids, within: float = 30.0) -> list[int]:
    """Those of ``pids`` still running after up to ``within`` seconds: a killed process lingers until the kernel
    has torn it down, which takes a moment on a loaded machine."""
    import time

    end = time.monotonic() + within
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < end:
        time.sleep(0.1)
    return alive


def app_server(predictor, **settings):
    """The service app around ``predictor`` with ``settings``, served in a background thread."""
    from cdmpp.service.app import Settings, create_app
    from cdmpp.service.background import BackgroundServer

    return BackgroundServer(create_app(Settings(**settings), predictor))
