"""Graceful drain: on SIGTERM readiness goes false first, new requests are refused, the requests
in flight finish (within `GATEWAY_HTTP__DRAIN_SECONDS`), then the gateway stops.

`Drain` is the outermost ASGI layer of the HTTP app. It counts the requests in flight, all but
GETs: a GET is a page, a probe or a stream of notifications (the handshake-era session's SSE
stream, the console's live tail), none of which a client loses by a retry, while a POST carries a
tool call. `Drain.drain` runs the stop:

1. `/readyz` answers 503 `{"ready": false, "draining": true}` (the load balancer stops sending);
   for `GATEWAY_HTTP__DRAIN_NOTICE_SECONDS` new requests are still served;
2. the listening socket is closed (a new connection is refused, which a proxy retries on another
   replica), and a new request on a kept-alive connection gets 503 with `Connection: close` and
   `Retry-After: 1`, before anything acts on it (safe to resend: nginx's `proxy_next_upstream
   http_503 non_idempotent`); `/healthz` still answers (the process is alive);
3. the requests in flight finish, for at most `GATEWAY_HTTP__DRAIN_SECONDS`; what still runs then
   is cancelled as uvicorn shuts down.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["DRAINING_MESSAGE", "Drain"]

logger = logging.getLogger(__name__)

DRAINING_MESSAGE = "This gateway replica is shutting down and takes no new requests: send the request again."
_ALWAYS = "/healthz"
_READY = "/readyz"


class Drain:
    """Counts the requests in flight; once draining, says so on `/readyz`, then refuses new requests."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.in_flight = 0
        """Requests in flight other than GETs."""
        self.draining = False
        """Readiness is false (from SIGTERM on)."""
        self.refusing = False
        """New requests are refused (after the notice)."""
        self._idle: anyio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self.draining and path == _READY:
            await _answer(send, 503, {"ready": False, "draining": True})
            return
        if self.refusing and path != _ALWAYS:
            await self.refuse(send)
            return
        if scope["method"] == "GET":
            await self.app(scope, receive, send)
            return
        await self.counted(scope, receive, send, self.app)

    async def refuse(self, send: Send) -> None:
        """503 to a new request once refusing (safe to resend elsewhere)."""
        headers = [(b"connection", b"close"), (b"retry-after", b"1")]
        await _answer(send, 503, {"error": "draining", "message": DRAINING_MESSAGE}, headers)

    async def counted(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """`app` on a request the drain waits for (in flight until it returns)."""
        self.in_flight += 1
        try:
            await app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()

    async def drain(self, *, notice: float, timeout: float, stop_listening: Callable[[], None]) -> int:
        """Run the drain (the module's steps 1 to 3); returns how many requests were still in flight
        when `timeout` ran out (0: every one finished)."""
        self.draining = True
        logger.info("draining: /readyz says 503; new requests are refused in %.3g s", notice)
        if notice > 0:
            await anyio.sleep(notice)
        self.refusing = True
        stop_listening()
        if self.in_flight:
            logger.info("draining: waiting up to %.3g s for %d request(s) in flight", timeout, self.in_flight)
        with anyio.move_on_after(timeout):
            while self.in_flight > 0:
                self._idle = anyio.Event()
                await self._idle.wait()
        if self.in_flight:
            left = self.in_flight
            logger.warning("drain time (%.3g s) over: %d request(s) still in flight are cancelled", timeout, left)
        return self.in_flight


async def _answer(
    send: Send, status: int, body: dict[str, object], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = json.dumps(body).encode()
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start + (headers or [])})
    await send({"type": "http.response.body", "body": payload})
