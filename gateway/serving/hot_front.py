"""The hot front: a request the lean path will likely serve, past the HTTP app's layers in one step.

Every request to the HTTP app meets, outermost first: uvicorn's proxy headers, the drain
(`gateway.serving.drain`), the guard (`gateway.security.http_guard`: Host/Origin, loopback only,
authentication, rate limit, then the body size), the console's lookup, the `?mode=` check, the
trace context and then `gateway.serving.lean_path`. For a hot request on an open session most
of those layers have nothing to do but cost a call a few ASGI hops and header parses each.
`HotFront.takes` picks, from the parsed head alone (`gateway.serving.http_protocol` asks it),
the requests for which each of those layers provably passes the request on untouched or runs
a check that `HotFront` runs itself, the same code:

- a POST to the endpoint path exactly, with no query string (the `?mode=` check and the console
  have nothing to do), naming a session the lean path knows;
- a `Content-Length` within `security.limits.max_request_bytes` (the body size check passes;
  a chunked body or an `Expect` goes the ASGI way);
- no `X-Forwarded-For`/`-Proto` (uvicorn's proxy headers would change the scope) and no
  `traceparent` (the trace context would attach);
- the drain not refusing yet.

For those `HotFront` counts the request in flight for the drain, runs the guard's own `screen`
(Host/Origin, loopback only, authentication, rate limit: refused with the guard's own answer),
then the lean path as the guard would (`SecurityMiddleware.run`). Whatever the lean path does
not serve itself (a notification, a batch, bad JSON) goes to the SDK's app from there, as behind
the whole stack.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.security.http_guard import SecurityMiddleware
from gateway.serving.drain import Drain

__all__ = ["HotFront"]

logger = logging.getLogger(__name__)

_ASGI_ONLY = frozenset({b"x-forwarded-for", b"x-forwarded-proto", b"traceparent", b"transfer-encoding", b"expect"})
"""Headers that some layer the front skips acts on: such a request goes the whole ASGI way."""


class HotFront:
    """Picks the requests it may serve past the outer ASGI layers, and serves them (module docstring)."""

    def __init__(self, *, drain: Drain, security: SecurityMiddleware, lean: Any, path: str, max_body: int) -> None:
        self.drain = drain
        self.security = security
        self.lean: ASGIApp = lean
        self.sessions: dict[str, Any] = lean.sessions
        self.path = path
        self.max_body = max_body
        self.taken = 0
        """Requests this front served (read by the tests)."""

    def takes(self, scope: Scope) -> bool:
        """Whether this parsed head is one the front serves (the module's list)."""
        if scope["method"] != "POST" or scope["path"] != self.path or scope["query_string"] or self.drain.refusing:
            return False
        session: bytes | None = None
        length: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"mcp-session-id":
                session = value
            elif name == b"content-length":
                length = value
            elif name in _ASGI_ONLY:
                return False
        if session is None or length is None or not length.isdigit() or int(length) > self.max_body:
            return False
        return session.decode("latin-1") in self.sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drain.refusing:  # began refusing between the head and now
            await self.drain.refuse(send)
            return
        self.taken += 1
        logger.debug("hot front: %s", scope["path"])  # the tests read it
        await self.drain.counted(scope, receive, send, self._screened)

    async def _screened(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = await self.security.screen(scope)
        if refused is not None:
            await refused.send(send)
            return
        await self.security.run(scope, receive, send, self.lean)
