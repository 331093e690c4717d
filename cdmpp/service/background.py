"""A real uvicorn server in a background thread (tests, notebooks): ``with BackgroundServer(app) as url: ...``.

Binds the socket itself (port 0 = an ephemeral port) so the URL is known before the first request.
Start-up waits for the featurizer workers to import TVM, which on a busy 2-core machine can take over a
minute: the start-up deadline is generous, since a server whose thread dies is reported at once anyway.
"""

from __future__ import annotations

import socket
import threading
import time


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 600.0):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._timeout = startup_timeout_s

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("server failed to start (see its log)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start in {self._timeout} s")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
