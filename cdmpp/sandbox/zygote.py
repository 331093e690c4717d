"""The sandbox's zygote: a fresh interpreter that imports and warms up TVM once, then forks sandbox workers
on request (``cdmpp.sandbox.pool``), so a replacement is ready in well under a second.

Why not multiprocessing's forkserver: it starts with the server's environment (tokens), gives every child
the write end of the resource tracker's pipe (a worker could make the server unlink any file it names when
it stops), and listens on a named socket that a worker of the same user could ask for a process without
its limits. This one is exec'd by the parent with an allow-listed environment before any request, holds
nothing but its socket (a private socketpair, SOCK_SEQPACKET), and its children keep nothing but their
two pipes.

Messages, one JSON object per datagram: parent → ``{"spawn": {worker_main keyword arguments}}`` with the
worker's two pipe ends as SCM_RIGHTS, or ``{"kill": pid}``; zygote → ``{"ready": true, "pid"}`` (or
``{"error"}``) once warm, ``{"pid"}`` per spawn, ``{"exit": pid, "rc"}`` when a worker ended (``rc`` as
``Popen.returncode``: ``-signal`` when killed).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys


def _send(sock: socket.socket, msg: dict) -> None:
    sock.send(json.dumps(msg).encode())


def main(fd: int, kinds: list[str]) -> None:
    sock = socket.socket(fileno=fd)
    from cdmpp.sandbox import worker

    try:
        worker.warm_up(kinds)
    except Exception as e:  # noqa: BLE001 - the parent reports it
        _send(sock, {"error": f"sandbox warm-up failed: {type(e).__name__}: {e}"})
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, str] = {}  # pid -> the worker's folder
    _send(sock, {"ready": True, "pid": os.getpid()})
    try:
        while True:
            ready, _, _ = select.select([sock, wake_r], [], [])
            if wake_r in ready:
                os.read(wake_r, 4096)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                children.pop(pid, None)
                _send(sock, {"exit": pid, "rc": os.waitstatus_to_exitcode(status)})
            if sock not in ready:
                continue
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
            if not data:
                break  # the parent is gone
            msg = json.loads(data)
            if "kill" in msg:
                if msg["kill"] in children:  # only our own, not yet reaped: its pid cannot be reused
                    os.kill(msg["kill"], signal.SIGKILL)
                continue
            pid = os.fork()
            if pid == 0:
                code = 70
                try:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    worker.worker_main(fds[0], fds[1], **msg["spawn"])
                    code = 0
                finally:
                    os._exit(code)
            children[pid] = msg["spawn"]["folder"]
            for f in fds:
                os.close(f)
            _send(sock, {"pid": pid})
    finally:  # the server is gone: its workers go too, and their folders (a confined worker cannot remove its own)
        import shutil

        for pid, folder in children.items():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    # with torch kept out a worker starts in half the time and half the memory (2.6 s and 204 MB instead of
    # 5.3 s and 401 MB, warm-up included), and less code is mapped into a process that reads hostile input
    from cdmpp.program.tvm_env import keep_torch_out

    keep_torch_out()
    main(int(sys.argv[1]), [k for k in sys.argv[2].split(",") if k])
