"""One MCP client session per upstream server, owned by a supervisor task.

Every server, internal or external, is reached the same way: an SDK `Client` over a
transport (in memory for plugin servers, stdio, streamable HTTP or SSE for external
ones). The supervisor task connects, fetches the server's full listing, keeps it fresh
when the server says its lists changed, and notices when the connection dies. Nothing
that happens inside one upstream escapes its task: a failure becomes `state="failed"`
with a reason, and the other servers never notice.

Beside it: `gateway.upstreams.requests` (what a request goes through: the cap, the timeout, the
translation of failures), `gateway.upstreams.spec` (what an upstream is), `gateway.upstreams.errors` (how its
failures are told), `gateway.upstreams.listing` (what it is asked for), `gateway.upstreams.health`
(one probe), `gateway.upstreams.on_demand` (start at the first call, stop when idle),
`gateway.upstreams.subscriptions` (resource subscriptions), `gateway.upstreams.stderr` (a stdio
server's stderr).
"""

from __future__ import annotations

import logging
import math
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TextIO

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.catalog import ServerListing
from gateway.upstreams.errors import (
    describe,
    failure_reason,
    status_of,
    unavailable_error,
    unavailable_message,
)
from gateway.upstreams.health import probe
from gateway.upstreams.in_flight import InFlight
from gateway.upstreams.lean_calls import LeanCalls, bind, lean_channel
from gateway.upstreams.listing import Unsupported, fetch_listing
from gateway.upstreams.message_bounds import DEFAULT_MAX_MESSAGE_BYTES
from gateway.upstreams.oauth.binding import (
    GrantAuth,
    login_reason,
    token_endpoint_reason,
)
from gateway.upstreams.on_demand import OnDemand
from gateway.upstreams.requests import RequestSide
from gateway.upstreams.server_requests import relay_callbacks
from gateway.upstreams.spec import CONNECTED_STATES, LISTED_STATES, ServerState, UpstreamSpec
from gateway.upstreams.stderr import StderrLog
from gateway.upstreams.stdio_child import stdio_child
from gateway.upstreams.subscriptions import Subscriptions, cancel_when
from gateway.upstreams.transports import HttpClientKind, http_transport, watched
from gateway.version import gateway_version

__all__ = [
    "CONNECTED_STATES",
    "LISTED_STATES",
    "ServerState",
    "Upstream",
    "UpstreamEvents",
    "UpstreamSpec",
    "cancel_when",
    "restart_delay",
    "unavailable_error",
    "unavailable_message",
]

logger = logging.getLogger(__name__)

RESTART_BACKOFF_BASE = 1.0
"""Seconds before the first reconnection attempt; doubled after each failure."""
RESTART_BACKOFF_MAX = 60.0
"""The longest wait between reconnection attempts."""

HEALTH_TIMEOUT = 10.0
"""Seconds a health-check ping may take (at most the server's call timeout)."""
HEALTH_MISSES = 3
"""Missed pings in a row after which the connection is dropped and re-made."""


class UpstreamEvents(Protocol):
    """What an upstream reports to its owner (the registry)."""

    async def listing_changed(self, upstream: Upstream) -> None: ...

    async def state_changed(self, upstream: Upstream) -> None: ...

    async def resource_updated(self, upstream: Upstream, uri: str) -> None: ...

    async def log_message(self, upstream: Upstream, params: types.LoggingMessageNotificationParams) -> None: ...

    async def relay_request(
        self, upstream: Upstream, request: types.InputRequest
    ) -> types.InputResponse | types.ErrorData: ...


class Upstream(RequestSide):
    """A supervised connection to one server. Start `run()` in a task group."""

    def __init__(
        self,
        spec: UpstreamSpec,
        events: UpstreamEvents,
        *,
        startup_timeout: float = 30.0,
        call_timeout: float = 60.0,
        relay_requests: bool = True,
        max_concurrent_calls: int = 32,
        health_interval: float = 30.0,
        listing_dir: Path | None = None,
        http_client: HttpClientKind = "lean",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        lean_calls: bool = True,
    ) -> None:
        self.spec = spec
        self.lean_calls = lean_calls  # `tools/call` on the gateway's own path (`gateway.upstreams.lean_calls`)
        self._lean: LeanCalls | None = None
        self.max_message_bytes = max_message_bytes
        """Bytes of one message read from the server (`gateway.upstreams.message_bounds`)."""
        self.http_client: HttpClientKind = http_client
        """The HTTP layer for a streamable-HTTP server (`gateway.upstreams.transports`)."""
        self.relay_requests = relay_requests
        """Whether to offer sampling, elicitation and roots upstream (only when a client can answer)."""
        self.events = events
        self.startup_timeout = startup_timeout
        self.call_timeout = spec.timeout if spec.timeout is not None else call_timeout
        self.health_interval = spec.health_interval if spec.health_interval is not None else health_interval
        self.limiter = anyio.CapacityLimiter(spec.max_concurrent_calls or max_concurrent_calls)
        """Caps requests in flight to this server; the rest queue here, not in the server."""
        self.pid: int | None = None
        """The stdio child's pid (also its process group id) while it runs."""
        self.unauthorized = False
        """Whether the last connection attempt was refused for the gateway's credentials."""
        self._state_event = anyio.Event()
        self.on_demand = OnDemand(spec, listing_dir)
        """Start at the first call and stop when idle, for a server with `start: on_demand`."""
        self.http_status: int | None = None
        """The status of the last HTTP response from a streamable-HTTP server."""
        self.state: ServerState = "starting" if spec.enabled else "disabled"
        self.reason: str | None = None if spec.enabled else "disabled in the configuration"
        self.state_since = datetime.now(UTC)
        self.connect_ms: float | None = None
        self.listing = ServerListing(spec.id, spec.prefix)
        self.protocol_version: str | None = None
        self.server_info: types.Implementation | None = None
        self.instructions: str | None = None
        self._client: Client | None = None
        self._stop = anyio.Event()
        self._stop_reason = "the gateway stopped"
        self._closed = anyio.Event()
        self._refresh = anyio.Event()
        self.subscriptions = Subscriptions(self)
        self._ready = anyio.Event()
        self._transport_error: str | None = None
        self.retry_at: datetime | None = None
        """When the next reconnection attempt is due, while the server is failed."""
        self.stderr = StderrLog(spec.id)
        """The current (or last) connection attempt's stderr, of a stdio server."""
        self.unsupported = Unsupported(spec.id)
        """The optional methods this server turned out not to support."""
        self.sessions = 0
        """How many sessions have completed their handshake: a new number is a fresh connection."""
        self._auth: GrantAuth | None = None
        """The OAuth auth of the current connection attempt (`auth: oauth` servers)."""
        self.client_extensions: list[ClientExtension] = []
        """SDK client extensions every session to this server gets (the registry's task status binding)."""
        self.requests = InFlight()
        """The requests in flight: a removed or changed server drains them, then cancels the rest."""

    @property
    def stderr_tail(self) -> list[str]:
        """The last lines the stdio server wrote to stderr in its current or last attempt."""
        return self.stderr.tail

    # ---- lifecycle ------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """Whether the first connection attempt has succeeded or failed."""
        return self._ready.is_set()

    async def wait_settled(self) -> None:
        """Wait until the first connection attempt has succeeded or failed."""
        await self._ready.wait()

    def stop(self, because: str = "the gateway stopped") -> None:
        """Ask `run()` to end; `because` is the reason of the final `stopped` state (the first one given)."""
        if not self._stop.is_set():
            self._stop_reason = because
        self._stop.set()

    async def run(self) -> None:
        """Connect and serve; reconnect with backoff whenever the connection fails. Never raises."""
        if not self.spec.enabled:
            self._ready.set()
            return
        if self.spec.failure is not None:
            await self._set_state("failed", self.spec.failure)
            self._ready.set()
            return
        cached = self.on_demand.cached_listing()
        if cached is not None:
            self.listing = cached
            await self._set_state("idle", "starts on its first call")
            await self.events.listing_changed(self)
            self._ready.set()
            await self._wait_wanted()
        failures = 0
        while not self._stop.is_set():
            connected_since = anyio.current_time()
            try:
                await self._serve()
            except Exception as exc:  # noqa: BLE001 - boundary: one upstream's failure must not reach the others
                logger.debug("server %r failed", self.id, exc_info=True)
                login = login_reason(self._auth, exc)
                if login is not None:
                    self.unauthorized = True
                    await self._set_state("needs_login", login)
                else:
                    await self._set_state("failed", token_endpoint_reason(self._auth) or self._reason(exc))
            finally:
                self._client, self.pid, self.subscriptions.listening = None, None, False
                self._ready.set()
            if self._stop.is_set():
                break
            if self.state == "needs_login" and self.spec.oauth is not None:
                # Not retried in a loop: the server waits for a grant to be stored (a login, a link, a replica).
                await self.spec.oauth.wait_for_grant(self.spec.oauth_account, self._stop)
                failures = 0
                self._new_attempt()
                if not self._stop.is_set():
                    await self._set_state("starting", "an OAuth grant was stored; connecting")
                continue
            if self.on_demand.went_idle:
                self.on_demand.went_idle, failures = False, 0
                timeout = f"{self.spec.idle_timeout:g}"
                await self._set_state("idle", f"stopped after {timeout} s without calls; starts on its next call")
                await self._wait_wanted()
                self._new_attempt()
                continue
            # A connection that lived a while starts the backoff over.
            failures = 1 if anyio.current_time() - connected_since > RESTART_BACKOFF_MAX else failures + 1
            delay = restart_delay(failures)
            self.retry_at = datetime.now(UTC) + timedelta(seconds=delay)
            with anyio.move_on_after(delay):
                await self._stop.wait()
            self.retry_at = None
            self._new_attempt()
            if not self._stop.is_set():
                await self._set_state("starting", f"reconnecting (attempt {failures + 1}) after: {self.reason}")
        if self.state in ("starting", *LISTED_STATES):
            await self._set_state("stopped", self._stop_reason)

    async def _wait_wanted(self) -> None:
        """Wait (idle) until a call wants this on-demand server, or the gateway stops."""
        await self.on_demand.wait_wanted(self._stop)
        if not self._stop.is_set():
            await self._set_state("starting", "started by a call")

    def _new_attempt(self) -> None:
        """Forget what the previous connection left behind."""
        self._closed = anyio.Event()
        self._transport_error = None
        self.http_status = None

    def _reason(self, exc: BaseException) -> str:
        """One line saying why the connection failed (`errors.failure_reason`); notes a refusal of credentials."""
        status = self.http_status if self.http_status in (401, 403) else status_of(exc)
        self.unauthorized = status in (401, 403)
        command = getattr(self.spec.target, "command", "") if self.spec.transport == "stdio" else ""
        return failure_reason(
            exc,
            http_status=self.http_status,
            refused_status=status if self.unauthorized else None,
            transport_error=self._transport_error,
            last_stderr_line=self.stderr.last_line,
            command=command,
        )

    async def _serve(self) -> None:
        started = time.perf_counter()
        connected = False
        errlog: TextIO | None = None
        if self.spec.transport == "stdio":
            self.stderr = StderrLog(self.id, self.redact, self.spec.stderr_level)
            errlog = self.stderr.pipe()
        oauth, self._auth = self.spec.oauth, None
        if oauth is not None:
            self._auth = await oauth.open_auth(self.spec.oauth_account, lambda: self._closed.set())
        try:
            # One scope for the session's whole life: its deadline bounds connecting, then is
            # lifted. (A scope around just the connect would exit before the session's own
            # task groups, which anyio forbids.)
            with anyio.CancelScope(deadline=anyio.current_time() + self.startup_timeout) as scope:
                connected = await self._serve_client(self._make_client(errlog), scope, started)
        finally:
            if errlog is not None:
                errlog.close()
                with anyio.CancelScope(shield=True):  # its last words explain the failure
                    await self.stderr.drained()
        if not connected:
            raise TimeoutError(f"did not finish connecting within {self.startup_timeout:g} s")
        if self._closed.is_set() and not self._stop.is_set():
            raise ConnectionError("the server closed the connection")

    async def _serve_client(self, session: Client, scope: anyio.CancelScope, started: float) -> bool:
        """Connect, list, then serve until stopped or closed. Returns whether it connected."""
        async with session as client:
            self._client = client
            bind(client, self._lean)
            try:
                return await self._serve_connected(client, scope, started)
            finally:
                # Before the client closes (a stdio child's exit can take a while): a request from now on is
                # refused as `upstream_unavailable` and retried, never sent to a client being closed.
                self._client = None
                bind(client, None)

    async def _serve_connected(self, client: Client, scope: anyio.CancelScope, started: float) -> bool:
        """Serve one connected client until stopped or closed (`_serve_client`)."""
        self.protocol_version = client.protocol_version
        self.server_info = client.server_info
        self.instructions = client.instructions
        self.listing = await self._fetch_listing(client)
        self.on_demand.save_listing(self.listing)
        self.on_demand.touch()
        scope.deadline = math.inf
        self.sessions += 1
        self.connect_ms = (time.perf_counter() - started) * 1000
        await self._set_state("ready", None)
        # Announce the listing before marking the attempt settled, so that a request
        # waiting for start-up sees this server's items.
        await self.events.listing_changed(self)
        self._ready.set()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._refresh_worker, client)
            if self.health_interval > 0:
                tg.start_soon(self._health_worker, client)
            if self.protocol_version in MODERN_PROTOCOL_VERSIONS:
                self.subscriptions.listening = True
                tg.start_soon(self.subscriptions.listen, client)
            with anyio.CancelScope() as watch:
                tg.start_soon(cancel_when, self._stop, watch)
                tg.start_soon(cancel_when, self._closed, watch)
                if self.on_demand.enabled:
                    tg.start_soon(self.on_demand.idle_worker, watch)
                await anyio.sleep_forever()
            tg.cancel_scope.cancel()
        return True

    def _make_client(self, errlog: TextIO | None) -> Client:
        spec = self.spec
        target: Any
        self._lean = lean = lean_channel(spec, self._on_log) if self.lean_calls else None
        if spec.transport == "memory":
            target = spec.target
        elif spec.transport == "stdio":
            assert isinstance(spec.target, StdioServerParameters)
            child = stdio_child(spec.target, errlog or sys.stderr, self._on_spawn, self.max_message_bytes, lean)
            target = watched(child, self._closed)
        else:
            assert isinstance(spec.target, str)
            http = http_transport(
                spec.target,
                spec.headers,
                self._on_http_status,
                auth=self._auth,
                client=self.http_client,
                server=spec.id,
                sse=spec.transport == "sse",
                max_message_bytes=self.max_message_bytes,
                lean=lean,
            )
            target = watched(http, self._closed)
        relay = relay_callbacks(partial(self.events.relay_request, self)) if self.relay_requests else {}
        return Client(
            target,
            mode=spec.protocol,
            logging_callback=self._on_log,
            **relay,
            message_handler=self._on_message,
            client_info=types.Implementation(name="mcp-gateway", version=gateway_version()),
            read_timeout_seconds=None,
            extensions=list(self.client_extensions) or None,
        )

    def _on_spawn(self, pid: int) -> None:
        self.pid = pid

    def _on_http_status(self, status: int) -> None:
        self.http_status = status

    async def _set_state(self, state: ServerState, reason: str | None) -> None:
        reason = self.redact(reason) if reason else reason
        if state == self.state and reason == self.reason:
            return
        self.state, self.reason, self.state_since = state, reason, datetime.now(UTC)
        self._state_event.set()
        self._state_event = anyio.Event()
        await self.events.state_changed(self)

    @property
    def server_capabilities(self) -> types.ServerCapabilities | None:
        """What the server declared on the current connection (None while not connected)."""
        return self._client.server_capabilities if self._client is not None else None

    def eta(self) -> float:
        """Seconds until this server may be connected again: 0 if it is or is connecting (or its dead
        session is being closed: `_client` already withdrawn, the state not yet changed), inf if never."""
        if self.connected or self.state in ("starting", "idle"):
            return 0.0
        if self.state in CONNECTED_STATES and not self._stop.is_set():
            return 0.0
        if self.retry_at is not None and not self._stop.is_set():
            return max(0.0, (self.retry_at - datetime.now(UTC)).total_seconds())
        return math.inf

    # ---- listing --------------------------------------------------------------

    async def _fetch_listing(self, client: Client) -> ServerListing:
        return await fetch_listing(client, self.spec.prefix, self.unsupported, self.spec.tool_filter)

    def refresh(self) -> None:
        """Re-list the server soon (bursts of requests coalesce into one listing)."""
        self._refresh.set()

    async def _refresh_worker(self, client: Client) -> None:
        """Re-list after list_changed notifications, coalescing bursts into one fetch."""
        while True:
            await self._refresh.wait()
            self._refresh = anyio.Event()
            try:
                listing = await self._fetch_listing(client)
            except (MCPError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                logger.warning("server %r: refreshing the listing failed: %s", self.id, describe(exc))
                continue
            if listing != self.listing:
                self.listing = listing
                self.on_demand.save_listing(listing)
                await self.events.listing_changed(self)

    async def _health_worker(self, client: Client) -> None:
        """Probe every `health_interval` s (`gateway.upstreams.health`): a missed answer makes the
        server `degraded`, three in a row close the connection so the supervisor reconnects. Probes
        bypass the call cap."""
        misses = 0
        while True:
            await anyio.sleep(self.health_interval)
            outcome = await probe(client, min(self.call_timeout, HEALTH_TIMEOUT), self.unsupported)
            if outcome == "errored":
                misses = 0  # it answered, if only to say it has no ping
                continue
            if outcome == "answered":
                if misses:
                    misses = 0
                    await self._set_state("ready", None)
                continue
            misses += 1
            if misses >= HEALTH_MISSES:
                logger.warning("server %r missed %d health checks in a row; reconnecting", self.id, misses)
                self._closed.set()
                return
            await self._set_state("degraded", f"missed {misses} health check(s) of {HEALTH_MISSES}")

    # ---- notifications (the server-to-client requests: `server_requests.relay_callbacks`) ----

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            if self._transport_error is None:
                logger.warning("server %r sent something that is not MCP: %s", self.id, describe(message))
            self._transport_error = describe(message)
            return
        notification = message
        if isinstance(
            notification,
            types.ToolListChangedNotification
            | types.PromptListChangedNotification
            | types.ResourceListChangedNotification,
        ):
            self._refresh.set()
        elif isinstance(notification, types.ResourceUpdatedNotification):
            await self.events.resource_updated(self, notification.params.uri)

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        await self.events.log_message(self, params)

    async def disabled_by(self, reason: str) -> None:
        """Mark a stopped upstream `disabled` with `reason` (an operator's action, not the config's)."""
        await self._set_state("disabled", reason)


def restart_delay(failures: int) -> float:
    """Exponential backoff with jitter: about 1, 2, 4 ... seconds, at most a minute."""
    base = min(RESTART_BACKOFF_MAX, RESTART_BACKOFF_BASE * 2 ** (failures - 1))
    return float(base * random.uniform(0.5, 1.0))
