"""The request side of an `Upstream` (`gateway.upstreams.upstream`): one request sent within the
server's cap and time, its failures translated into gateway errors.

A mixin, so that the supervisor (connect, list, watch, reconnect) and what a request goes through
(the call cap, the timeout, the on-demand start, the drain's cancel scope, the translation of
`MCPError`, a closed connection or an ended OAuth grant) are read apart; `Upstream` holds the state
both use.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.upstreams.errors import describe, translate_error, unavailable_error
from gateway.upstreams.listing import method_not_found, unsupported_answer
from gateway.upstreams.oauth.binding import login_refusal, token_endpoint_error
from gateway.upstreams.spec import CONNECTED_STATES

if TYPE_CHECKING:
    from gateway.upstreams.in_flight import InFlight
    from gateway.upstreams.listing import Unsupported
    from gateway.upstreams.oauth.binding import GrantAuth
    from gateway.upstreams.on_demand import OnDemand
    from gateway.upstreams.spec import ServerState, UpstreamSpec

__all__ = ["RequestSide"]


class RequestSide:
    """Requests to one server (`Upstream.request`), over the client its supervisor keeps connected."""

    spec: UpstreamSpec
    state: ServerState
    reason: str | None
    retry_at: datetime | None
    unauthorized: bool
    call_timeout: float
    startup_timeout: float
    limiter: anyio.CapacityLimiter
    http_status: int | None
    on_demand: OnDemand
    requests: InFlight
    unsupported: Unsupported
    _client: Client | None
    _closed: anyio.Event
    _auth: GrantAuth | None
    _state_event: anyio.Event

    @property
    def id(self) -> str:
        return self.spec.id

    def redact(self, text: str) -> str:
        return self.spec.redact(text)

    @property
    def connected(self) -> bool:
        return self._client is not None and self.state in CONNECTED_STATES

    async def wait_ready(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the server to be connected (returns early if it is)."""
        with anyio.move_on_after(timeout):
            while not self.connected:
                await self._state_event.wait()

    def timeout_for(self, tool: str) -> float:
        """The tool's own timeout (first matching glob in `tool_timeouts`), else the server's."""
        for pattern, seconds in self.spec.tool_timeouts.items():
            if fnmatch.fnmatchcase(tool, pattern):
                return seconds
        return self.call_timeout

    def idempotent(self, tool: types.Tool, original: str) -> bool:
        """Whether a call may run twice: annotated read-only or idempotent, or its name (`original`,
        the server's own) matches a `retry_tools` glob."""
        hints = tool.annotations
        if hints is not None and (hints.read_only_hint or hints.idempotent_hint):
            return True
        return any(fnmatch.fnmatchcase(original, pattern) for pattern in self.spec.retry_tools)

    def _connected_client(self) -> Client:
        if self._client is None or self.state not in CONNECTED_STATES:
            raise unavailable_error(self)
        return self._client

    async def request(
        self, operation: str, send: Callable[[Client], Awaitable[Any]], *, timeout: float | None = None
    ) -> Any:
        """Run one request on this server, translating transport failures into gateway errors.

        `timeout` defaults to the server's; pass `math.inf` when the caller bounds the time
        itself. Errors the server sent itself (`MCPError`) are re-raised unchanged so that
        protocol errors stay JSON-RPC errors downstream. A gateway error says whether the
        request may have reached the server (`sent`), which decides whether it may be retried.
        """
        limit = self.call_timeout if timeout is None else timeout
        self.on_demand.begin()  # an on-demand server does not go idle under a waiting request
        scope = self.requests.begin()
        try:
            with scope:
                if self.state == "idle":
                    self.on_demand.want()
                    await self.wait_ready(self.startup_timeout)
                return await self._send(operation, send, limit)
        finally:
            self.requests.end(scope)
            self.on_demand.end()
        because = self.requests.cancelled_because
        raise UpstreamUnavailable(
            f"Server {self.id!r} stopped while {operation} ran ({because}); the request was cancelled.",
            server=self.id,
            sent=True,
        )

    async def _send(self, operation: str, send: Callable[[Client], Awaitable[Any]], limit: float) -> Any:
        async with self.limiter:
            client = self._connected_client()
            try:
                if math.isinf(limit):  # the caller bounds the time
                    return await send(client)
                with anyio.fail_after(limit):
                    return await send(client)
            except TimeoutError:
                raise UpstreamTimeout(
                    f"Server {self.id!r} did not answer {operation} within {limit:g} s; "
                    "the request was cancelled. Try again, or with simpler arguments.",
                    server=self.id,
                    sent=True,
                ) from None
            except MCPError as exc:
                self._check_login(operation)
                answer = unsupported_answer(operation)
                if answer is not None and method_not_found(exc):
                    self.unsupported.note(operation)
                    return answer()
                error, gone = translate_error(self.id, self.spec.transport, self.http_status, operation, exc)
                if gone:
                    self._closed.set()
                raise error from None
            except RuntimeError:
                if client is self._client and _is_open(client):
                    raise  # the SDK's own complaint about this request (a result not matching its schema…)
                # The supervisor closed this client (a crash, a restart, a stop) before the request went out.
                raise UpstreamUnavailable(
                    f"Server {self.id!r} was restarting when {operation} was sent; the request did not reach it.",
                    server=self.id,
                    sent=False,
                ) from None
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                self._check_login(operation)
                self._closed.set()
                raise UpstreamUnavailable(
                    f"Server {self.id!r} could not be reached for {operation}: {self.redact(describe(exc))}.",
                    server=self.id,
                    sent=not isinstance(exc, ConnectionRefusedError),
                ) from None

    def _check_login(self, operation: str) -> None:
        """When the request failed because the OAuth grant ended: close (the supervisor then waits in
        `needs_login` for a new grant) and say so."""
        refusal = login_refusal(self.id, self._auth, operation)
        if refusal is not None:
            self._closed.set()
            raise refusal
        down = token_endpoint_error(self.id, self._auth, operation)
        if down is not None:
            # The SDK's transport dies of a failed refresh; the lean path's does not, so close either
            # way: the connection is re-made, its attempts naming the token endpoint until it answers.
            self._closed.set()
            raise down


def _is_open(client: Client) -> bool:
    """Whether the SDK client is still inside its context (its `session` raises once it has closed)."""
    try:
        client.session  # noqa: B018 - the property is the check
    except RuntimeError:
        return False
    return True
