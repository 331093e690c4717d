"""The service's ASGI middleware: the browser guard (Host, Origin, Content-Type), a body-size limit and
read deadline applied before anything parses a body, and request metrics recorded for every response."""

from __future__ import annotations

import asyncio
import ipaddress
import time

from cdmpp.service.body import error_response
from cdmpp.service.metrics import Metrics
from cdmpp.service.schemas import ErrorBody


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
PROBES = ("/healthz", "/readyz")  # what a load balancer asks: no Host or Origin check (no secrets, no work)


def _split_host(value: str) -> tuple[str, int | None]:
    """``name[:port]`` or ``[v6]:port`` → (lower-case name, port or None); ("", None) when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name, port = value, ""
    if port and not port.isdigit():
        return "", None
    return name.rstrip("."), int(port) if port else None


def _same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


class BrowserGuard:
    """A web page must not drive the server (DESIGN.md §7, "a browser is an attacker"):

    - ``Host`` must name this server: a loopback name or the address the request reached, at the port it
      reached, or a name the operator allows (``allowed_hosts``: ``name`` at any port, ``name:port``, or
      ``*`` for any); otherwise 421. This stops DNS rebinding, where the attacker's name points at us.
    - A request with an ``Origin`` header (browsers send it on cross-site requests and on every POST) is
      refused (403) unless the operator allows that origin (``allowed_origins``, or ``*``).
    - A body must be ``application/json`` (415 otherwise): a page can send text/plain or form bodies
      without a CORS preflight, but not JSON.

    ``/healthz`` and ``/readyz`` are exempt, so load balancers may probe by IP or any name; they reveal
    no secret and start no work.
    """

    def __init__(self, app, allowed_hosts=(), allowed_origins=()):
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.hosts = {_split_host(h) for h in allowed_hosts if h != "*"}
        self.any_origin = "*" in allowed_origins
        self.origins = {o.strip().rstrip("/").lower() for o in allowed_origins if o != "*"}

    def host_ok(self, scope, host: str | None) -> bool:
        if host is None or self.any_host:  # no Host: not a browser (HTTP/1.0 tools); browsers always send it
            return True
        name, port = _split_host(host)
        if not name:
            return False
        if (name, None) in self.hosts or (name, port) in self.hosts:
            return True
        server = scope.get("server") or (None, None)
        if port is None:
            port = 443 if scope.get("scheme") == "https" else 80
        if port != server[1]:
            return False
        return name in LOOPBACK_NAMES or (server[0] is not None and _same_address(name, server[0]))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in PROBES:
            return await self.app(scope, receive, send)
        headers = {}
        for k, v in scope["headers"]:
            if k in (b"host", b"origin", b"content-type"):
                if k in headers:  # two Hosts or two Origins: which one would a proxy have checked?
                    return await _refuse(scope, send, 400, f"{k.decode()} header given twice")
                headers[k] = v.decode("latin-1")
        if not self.host_ok(scope, headers.get(b"host")):
            return await _refuse(scope, send, 421, "Host header names another server: this one answers to its "
                                                    "own address and localhost, or names allowed with "
                                                    "--allowed-host (CDMPP_ALLOWED_HOSTS)")
        origin = headers.get(b"origin")
        if origin is not None and not self.any_origin and origin.strip().rstrip("/").lower() not in self.origins:
            return await _refuse(scope, send, 403, "requests from web pages (an Origin header) are refused unless "
                                                    "the origin is allowed with --allow-origin (CDMPP_ALLOW_ORIGINS)")
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            media = headers.get(b"content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return await _refuse(scope, send, 415, "the body must be JSON, sent with Content-Type: "
                                                        "application/json")
        return await self.app(scope, receive, send)


async def _refuse(scope, send, status: int, detail: str) -> None:
    await error_response(status, ErrorBody(detail=detail), {"Connection": "close"})(scope, None, send)


class BodyLimit:
    """413 for a body over ``max_bytes``, judged on Content-Length and on the bytes actually received,
    before anything parses it. An over-long body is drained (up to 4x the limit) before answering, so the
    client, still uploading, reads the 413 instead of a reset connection. The whole body must arrive
    within ``timeout_s`` (408 otherwise): a Content-Length larger than what is sent, or a client sending a
    byte now and then, must not hold a connection and its buffer for ever."""

    def __init__(self, app, max_bytes: int, timeout_s: float = 30.0):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._drain(receive, 4 * self.max_bytes)
            return await self._reject(scope, send)
        body, more = bytearray(), True
        deadline = time.monotonic() + self.timeout_s
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return await _refuse(scope, send, 408, f"the body did not arrive within {self.timeout_s:g} s "
                                                        "(CDMPP_BODY_TIMEOUT_S): is Content-Length right?")
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > self.max_bytes:
                if more:
                    await self._drain(receive, 4 * self.max_bytes)
                return await self._reject(scope, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive, budget: int) -> None:
        seen, more, deadline = 0, True, time.monotonic() + self.timeout_s
        while more and seen <= budget:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return
            if msg["type"] == "http.disconnect":
                return
            seen += len(msg.get("body", b""))
            more = msg.get("more_body", False)

    async def _reject(self, scope, send) -> None:
        body = ErrorBody(detail=f"request body over the {self.max_bytes}-byte limit (CDMPP_MAX_BODY_BYTES); "
                                "send fewer programs per request", limit=self.max_bytes)
        await error_response(413, body, {"Connection": "close"})(scope, None, send)


class RecordMetrics:
    """Counts every response (including the 413s of ``BodyLimit``) by endpoint and status, with its latency.
    A client that went away before any answer counts as 499 (nginx's "client closed request"), not 500."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status, gone = time.perf_counter(), [None], [False]

        async def receive_wrapper():
            msg = await receive()
            if msg["type"] == "http.disconnect":
                gone[0] = True
            return msg

        async def send_wrapper(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            code = status[0] if status[0] is not None else (499 if gone[0] else 500)
            self.metrics.observe(scope["path"], code, time.perf_counter() - t0)
