"""How an upstream's failures are told: one-line reasons, and gateway errors a model can act on."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Protocol

import mcp_types as types
from mcp.shared.exceptions import MCPError

from gateway.errors import ResultTooLarge, UpstreamTimeout, UpstreamUnauthorized, UpstreamUnavailable
from gateway.upstreams.message_bounds import SETTING, too_large_in

__all__ = [
    "DownServer",
    "describe",
    "failure_reason",
    "server_answered",
    "status_of",
    "translate_error",
    "unavailable_error",
    "unavailable_message",
]


def failure_reason(
    exc: BaseException,
    *,
    http_status: int | None,
    refused_status: int | None,
    transport_error: str | None,
    last_stderr_line: str | None,
    command: str = "",
) -> str:
    """One line saying why a connection failed, with what the server itself said.

    `refused_status`: the 401/403 with which the server refused the gateway's credentials, if it
    did; `command`: a stdio server's command, which a missing file may be explained by."""
    reason = describe(exc)
    leaf = _leaf(exc)
    if isinstance(leaf, FileNotFoundError) and leaf.filename is None and command:
        reason += f": {command!r}"  # uvloop's spawn does not name the file asyncio's names
    if refused_status is not None:
        reason = f"the server refused the gateway's credentials (HTTP {refused_status}); {reason}"
    elif http_status is not None and http_status >= 400:
        reason = f"the server answered HTTP {http_status}; {reason}"
    if transport_error:
        reason += f"; the server sent something that is not MCP: {transport_error}"
    if last_stderr_line and not server_answered(exc):  # a server's own error needs no stderr to explain it
        reason += f"; its last stderr line: {last_stderr_line}"
    if isinstance(leaf, FileNotFoundError) and " " in command:
        reason += " (the command contains spaces: put its arguments in `args`)"
    return reason


class DownServer(Protocol):
    """What the error for an unavailable server reads of it (an `Upstream` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def retry_at(self) -> datetime | None: ...

    @property
    def unauthorized(self) -> bool: ...


def translate_error(
    server: str, transport: str, http_status: int | None, operation: str, exc: MCPError
) -> tuple[Exception, bool]:
    """A gateway error for what the transport (not the server) reported, else `exc` itself; and
    whether the connection is gone (then the supervisor reconnects)."""
    dropped = too_large_in(exc)
    if dropped is not None:
        size, exact, limit = dropped
        said = f"{size:,}" if exact else f"more than {size:,}"
        message = (
            f"Server {server!r} answered {operation} with {said} bytes, over the gateway's limit of {limit:,} "
            f"bytes for one message (setting {SETTING}), so the answer was dropped unread. "
            "Ask for less at a time (a narrower query, a smaller page)."
        )
        return ResultTooLarge(message, server=server, sent=True, details={"bytes": size, "limit": limit}), False
    if exc.code == types.CONNECTION_CLOSED:
        message = f"Server {server!r} closed its connection during {operation}; the gateway reconnects."
        return UpstreamUnavailable(message, server=server, sent=True), True
    if exc.code == types.REQUEST_TIMEOUT:
        message = f"Server {server!r} did not answer {operation} in time."
        return UpstreamTimeout(message, server=server, sent=True), False
    if transport != "http":
        return exc, False
    if exc.code == types.INVALID_REQUEST and exc.error.message == "Session terminated":
        # The server forgot our session (it restarted): reconnect; the request never ran.
        message = f"Server {server!r} ended the gateway's session; the gateway reconnects."
        return UpstreamUnavailable(message, server=server), True
    if exc.code == types.INTERNAL_ERROR and exc.error.message == "Server returned an error response":
        if http_status in (401, 403):
            message = (
                f"Server {server!r} refused the gateway's credentials (HTTP {http_status}) for {operation}. "
                "An operator has to fix its credentials in the gateway's configuration."
            )
            return UpstreamUnauthorized(message, server=server, details={"http_status": http_status}), False
        message = f"Server {server!r} failed {operation} with HTTP {http_status or 'error'}; try again later."
        details = {"http_status": http_status} if http_status else None
        return UpstreamUnavailable(message, server=server, sent=True, details=details), False
    return exc, False


def unavailable_error(upstream: DownServer) -> UpstreamUnavailable | UpstreamUnauthorized:
    """The error for a call to a server that is not connected: unauthorized, or just unavailable."""
    if upstream.state == "needs_login":
        return UpstreamUnauthorized(
            f"Server {upstream.id!r} is waiting for an OAuth login: {upstream.reason}.",
            server=upstream.id,
            details={"needs_login": True},
        )
    if upstream.unauthorized:
        return UpstreamUnauthorized(
            f"Server {upstream.id!r} refused the gateway's credentials ({upstream.reason}). "
            "An operator has to fix its credentials in the gateway's configuration.",
            server=upstream.id,
        )
    return UpstreamUnavailable(unavailable_message(upstream), server=upstream.id)


def unavailable_message(upstream: DownServer) -> str:
    """A sentence for a model: which server is down, why, and when it will be retried."""
    reason = f": {upstream.reason}" if upstream.reason else ""
    text = f"Server {upstream.id!r} is not available ({upstream.state}{reason})."
    if upstream.retry_at is not None:
        seconds = math.ceil((upstream.retry_at - datetime.now(UTC)).total_seconds())
        if seconds > 0:
            text += f" The gateway reconnects in {seconds} s; try again after that."
        else:
            text += " The gateway is reconnecting now; try again in a few seconds."
    elif upstream.state == "starting":
        text += " It is still connecting; try again in a few seconds."
    return text


def status_of(exc: BaseException) -> int | None:
    """The HTTP status inside an exception (group), if an HTTP response caused it."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def server_answered(exc: BaseException) -> bool:
    """Whether the failure is an error the server sent itself (not a dead or silent transport)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return isinstance(exc, MCPError) and exc.code not in (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT)


def _leaf(exc: BaseException) -> BaseException:
    """The first leaf of exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    """A one-line reason, unwrapping exception groups to their first leaf."""
    exc = _leaf(exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
