"""The service's ASGI middleware: a body-size limit applied before anything parses a body, and request
metrics recorded for every response."""

from __future__ import annotations

import time

from cdmpp.service.body import error_response
from cdmpp.service.metrics import Metrics
from cdmpp.service.schemas import ErrorBody


class BodyLimit:
    """413 for a body over ``max_bytes``, judged on Content-Length and on the bytes actually received,
    before anything parses it. An over-long body is drained (up to 4x the limit) before answering, so the
    client, still uploading, reads the 413 instead of a reset connection."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._drain(receive, 4 * self.max_bytes)
            return await self._reject(scope, send)
        body, more = bytearray(), True
        while more:
            msg = await receive()
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

    @staticmethod
    async def _drain(receive, budget: int) -> None:
        seen, more = 0, True
        while more and seen <= budget:
            msg = await receive()
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
