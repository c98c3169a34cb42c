"""Connection hygiene for the HTTP server: no client holds connections it does not use.

uvicorn closes a keep-alive connection idle between requests (`timeout_keep_alive`), but
nothing closes one that never finishes sending a request's headers: 300 silent or half-sent
connections were all held (also with authentication on, since a key is read from the headers).
`guarded_protocol` wraps uvicorn's HTTP protocol class:

- a connection that waits for a request's headers (its first, or the next one after a
  response) for more than `header_timeout` seconds is answered 408 and closed;
- one address holds at most `max_per_client` connections at once: beyond it a new connection
  is answered 503 and closed before anything is read (authentication comes later, with the
  headers, so the address is what a connection can be counted by).

A request whose headers arrived is the application's business from then on (its body is
bounded by the body size limit, its run by the call's timeouts).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from typing import Any, cast

__all__ = ["guarded_protocol"]

logger = logging.getLogger(__name__)

WARN_EVERY = 60.0
"""Seconds between two log lines about refused or timed-out connections."""


def _response(status: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close"
    return head.encode() + b"\r\n\r\n" + body


def guarded_protocol(base: type[asyncio.Protocol], header_timeout: float, max_per_client: int) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol class `base` (h11 or httptools: both set `cycle` once a
    request's headers are in) with the header timeout and the per-address connection cap."""
    open_by_address: Counter[str] = Counter()
    last_warning = [-WARN_EVERY]

    def warn(message: str, *args: object) -> None:
        now = time.monotonic()
        if now - last_warning[0] >= WARN_EVERY:
            last_warning[0] = now
            logger.warning(message, *args)

    class GuardedProtocol(base):  # type: ignore[valid-type, misc]
        _address = ""
        _counted = False
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = transport.get_extra_info("peername")
            self._address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if open_by_address[self._address] >= max_per_client:
                warn("http: refused a connection from %s: it holds %d already", self._address, max_per_client)
                message = f"This address holds {max_per_client} connections already (http.max_connections_per_client)."
                writer = cast(asyncio.Transport, transport)  # uvloop's is one, without subclassing it
                writer.write(_response("503 Service Unavailable", message))
                writer.close()
                return
            open_by_address[self._address] += 1
            self._counted = True
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if not self._counted:
                return  # refused, closing: uvicorn never saw it
            super().data_received(data)
            if self._waiting_for_headers():
                if self._header_timer is None:
                    self._arm()
            elif self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            if not self._counted:
                return  # refused at once: uvicorn never saw it
            self._counted = False
            open_by_address[self._address] -= 1
            if open_by_address[self._address] <= 0:
                del open_by_address[self._address]
            super().connection_lost(exc)

        def _waiting_for_headers(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or bool(getattr(cycle, "response_complete", False))

        def _arm(self) -> None:
            self._header_timer = asyncio.get_running_loop().call_later(header_timeout, self._headers_late)

        def _headers_late(self) -> None:
            self._header_timer = None
            transport = getattr(self, "transport", None)
            if not self._waiting_for_headers() or transport is None or transport.is_closing():
                return
            warn("http: closed a connection from %s that sent no request within %g s", self._address, header_timeout)
            message = f"No request within {header_timeout:g} s (http.header_timeout)."
            transport.write(_response("408 Request Timeout", message))
            transport.close()

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{base.__name__}"
    return GuardedProtocol
