"""One MCP client session per upstream server, owned by a supervisor task.

Every server, internal or external, is reached the same way: an SDK `Client` over a
transport (in memory for plugin servers, stdio, streamable HTTP or SSE for external
ones). The supervisor task connects, fetches the server's full listing, keeps it fresh
when the server says its lists changed, and notices when the connection dies. Nothing
that happens inside one upstream escapes its task: a failure becomes `state="failed"`
with a reason, and the other servers never notice.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.server import MCPServer, Server
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.catalog import ServerListing
from gateway.errors import UpstreamTimeout, UpstreamUnavailable

__all__ = ["ServerState", "Upstream", "UpstreamEvents", "UpstreamSpec"]

logger = logging.getLogger(__name__)

ServerState = Literal["starting", "ready", "failed", "disabled", "stopped"]
Transport = Literal["memory", "stdio", "http", "sse"]

_MAX_PAGES = 1000
"""Upstream pagination cap: a server whose cursor never ends cannot hang a listing."""


@dataclass(frozen=True)
class UpstreamSpec:
    """Everything needed to connect to one server, whatever its origin."""

    id: str
    prefix: str
    transport: Transport
    target: MCPServer | Server[Any] | StdioServerParameters | str
    name: str = ""
    description: str = ""
    capabilities: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float | None = None
    enabled: bool = True
    origin: str = "config"
    """`config` for YAML servers, `plugin:<name>` for internal ones."""
    tool_filter: Callable[[str], bool] | None = None

    @property
    def display_name(self) -> str:
        return self.name or self.id


class UpstreamEvents(Protocol):
    """What an upstream reports to its owner (the registry)."""

    async def listing_changed(self, upstream: Upstream) -> None: ...

    async def state_changed(self, upstream: Upstream) -> None: ...

    async def resource_updated(self, upstream: Upstream, uri: str) -> None: ...

    async def log_message(self, upstream: Upstream, params: types.LoggingMessageNotificationParams) -> None: ...

    async def relay_request(
        self, upstream: Upstream, request: types.InputRequest
    ) -> types.InputResponse | types.ErrorData: ...


class _WatchedReadStream:
    """A read stream that sets `closed` when the peer's stream ends.

    The SDK keeps a `Client` open after its transport died (pending requests fail, new
    ones too); this lets the supervisor notice at once and mark the server failed.
    """

    def __init__(self, inner: Any, closed: anyio.Event) -> None:
        self._inner = inner
        self._closed = closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> _WatchedReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> Any:
        self._closed.set()
        return await self._inner.__aexit__(*exc)

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except StopAsyncIteration:
            self._closed.set()
            raise

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._closed.set()
            raise

    async def aclose(self) -> None:
        self._closed.set()
        await self._inner.aclose()


@asynccontextmanager
async def _watched(transport: Any, closed: anyio.Event) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, closed), write_stream


@asynccontextmanager
async def _http_transport(url: str, headers: Mapping[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    async with create_mcp_http_client(headers=dict(headers)) as http_client:
        async with streamable_http_client(url, http_client=http_client) as streams:
            yield streams


class Upstream:
    """A supervised connection to one server. Start `run()` in a task group."""

    def __init__(
        self,
        spec: UpstreamSpec,
        events: UpstreamEvents,
        *,
        startup_timeout: float = 30.0,
        call_timeout: float = 60.0,
    ) -> None:
        self.spec = spec
        self.events = events
        self.startup_timeout = startup_timeout
        self.call_timeout = spec.timeout if spec.timeout is not None else call_timeout
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
        self._closed = anyio.Event()
        self._refresh = anyio.Event()
        self._subscriptions: set[str] = set()
        self._resubscribe = anyio.Event()
        self._ready = anyio.Event()

    @property
    def id(self) -> str:
        return self.spec.id

    # ---- lifecycle ------------------------------------------------------------

    async def wait_settled(self) -> None:
        """Wait until the first connection attempt has succeeded or failed."""
        await self._ready.wait()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Connect, serve until stopped or until the connection dies. Never raises."""
        if not self.spec.enabled:
            self._ready.set()
            return
        try:
            await self._serve()
        except Exception as exc:  # boundary: one upstream's failure must not reach the others
            logger.warning("server %r failed: %s", self.id, _describe(exc), exc_info=logger.isEnabledFor(10))
            await self._set_state("failed", _describe(exc))
        finally:
            self._client = None
            self._ready.set()
            if self.state in ("starting", "ready"):
                await self._set_state("stopped", "the gateway stopped")

    async def _serve(self) -> None:
        started = time.perf_counter()
        connected = False
        # One scope for the session's whole life: its deadline bounds connecting, then is
        # lifted. (A scope around just the connect would exit before the session's own
        # task groups, which anyio forbids.)
        with anyio.CancelScope(deadline=anyio.current_time() + self.startup_timeout) as scope:
            async with self._make_client() as client:
                self._client = client
                self.protocol_version = client.protocol_version
                self.server_info = client.server_info
                self.instructions = client.instructions
                self.listing = await self._fetch_listing(client)
                scope.deadline = math.inf
                connected = True
                self.connect_ms = (time.perf_counter() - started) * 1000
                await self._set_state("ready", None)
                self._ready.set()
                await self.events.listing_changed(self)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._refresh_worker, client)
                    if self.protocol_version in MODERN_PROTOCOL_VERSIONS:
                        tg.start_soon(self._listen_worker, client)
                    with anyio.CancelScope() as watch:
                        tg.start_soon(_cancel_when, self._stop, watch)
                        tg.start_soon(_cancel_when, self._closed, watch)
                        await anyio.sleep_forever()
                    tg.cancel_scope.cancel()
        if not connected:
            raise TimeoutError(f"did not finish connecting within {self.startup_timeout:g} s")
        if self._closed.is_set() and not self._stop.is_set():
            raise ConnectionError("the server closed the connection")

    def _make_client(self) -> Client:
        spec = self.spec
        target: Any
        if spec.transport == "memory":
            target = spec.target
        elif spec.transport == "stdio":
            assert isinstance(spec.target, StdioServerParameters)
            from mcp.client.stdio import stdio_client

            target = _watched(stdio_client(spec.target, errlog=sys.stderr), self._closed)
        elif spec.transport == "http":
            assert isinstance(spec.target, str)
            target = _watched(_http_transport(spec.target, spec.headers), self._closed)
        else:
            assert isinstance(spec.target, str)
            target = _watched(sse_client(spec.target, headers=dict(spec.headers)), self._closed)
        return Client(
            target,
            sampling_callback=self._on_sampling,
            elicitation_callback=self._on_elicitation,
            list_roots_callback=self._on_list_roots,
            logging_callback=self._on_log,
            message_handler=self._on_message,
            client_info=types.Implementation(name="mcp-gateway", version=_version()),
            read_timeout_seconds=None,
        )

    async def _set_state(self, state: ServerState, reason: str | None) -> None:
        if state == self.state and reason == self.reason:
            return
        self.state, self.reason, self.state_since = state, reason, datetime.now(UTC)
        await self.events.state_changed(self)

    # ---- listing --------------------------------------------------------------

    async def _fetch_listing(self, client: Client) -> ServerListing:
        caps = client.server_capabilities
        tools: list[types.Tool] = []
        prompts: list[types.Prompt] = []
        resources: list[types.Resource] = []
        templates: list[types.ResourceTemplate] = []
        if caps.tools is not None:
            tools = await _all_pages(client.list_tools, lambda r: r.tools)
            if self.spec.tool_filter is not None:
                tools = [t for t in tools if self.spec.tool_filter(t.name)]
        if caps.prompts is not None:
            prompts = await _all_pages(client.list_prompts, lambda r: r.prompts)
        if caps.resources is not None:
            resources = await _all_pages(client.list_resources, lambda r: r.resources)
            templates = await _all_pages(client.list_resource_templates, lambda r: r.resource_templates)
        return ServerListing(self.id, self.spec.prefix, tools, prompts, resources, templates)

    async def _refresh_worker(self, client: Client) -> None:
        """Re-list after list_changed notifications, coalescing bursts into one fetch."""
        while True:
            await self._refresh.wait()
            self._refresh = anyio.Event()
            try:
                listing = await self._fetch_listing(client)
            except (MCPError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                logger.warning("server %r: refreshing the listing failed: %s", self.id, _describe(exc))
                continue
            if listing != self.listing:
                self.listing = listing
                await self.events.listing_changed(self)

    async def _listen_worker(self, client: Client) -> None:
        """Hold a `subscriptions/listen` stream open (2026-07-28 servers send changes only there)."""
        caps = client.server_capabilities
        while True:
            self._resubscribe = anyio.Event()
            try:
                async with client.listen(
                    tools_list_changed=bool(caps.tools and caps.tools.list_changed),
                    prompts_list_changed=bool(caps.prompts and caps.prompts.list_changed),
                    resources_list_changed=bool(caps.resources and caps.resources.list_changed),
                    resource_subscriptions=sorted(self._subscriptions),
                ) as subscription:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_cancel_when, self._resubscribe, tg.cancel_scope)
                        async for _event in subscription:
                            pass  # events also reach `_on_message`, which handles them
                        tg.cancel_scope.cancel()
            except (ListenNotSupportedError, MCPError) as exc:
                logger.debug("server %r does not serve subscriptions/listen: %s", self.id, exc)
                return
            except SubscriptionLost:
                logger.info("server %r dropped its subscription stream; re-listening", self.id)
                self._refresh.set()
                await anyio.sleep(1)

    # ---- notifications and server-to-client requests --------------------------

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            logger.debug("server %r: transport error: %s", self.id, message)
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

    async def _on_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        response = await self.events.relay_request(self, types.CreateMessageRequest(params=params))
        assert isinstance(response, types.CreateMessageResult | types.ErrorData)
        return response

    async def _on_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        response = await self.events.relay_request(self, types.ElicitRequest(params=params))
        assert isinstance(response, types.ElicitResult | types.ErrorData)
        return response

    async def _on_list_roots(self, context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        response = await self.events.relay_request(self, types.ListRootsRequest())
        assert isinstance(response, types.ListRootsResult | types.ErrorData)
        return response

    # ---- requests -------------------------------------------------------------

    def _connected_client(self) -> Client:
        if self._client is None or self.state != "ready":
            reason = f": {self.reason}" if self.reason else ""
            raise UpstreamUnavailable(f"Server {self.id!r} is not available ({self.state}{reason}).", server=self.id)
        return self._client

    async def request(self, operation: str, send: Callable[[Client], Awaitable[Any]]) -> Any:
        """Run one request on this server, translating transport failures into gateway errors.

        Errors the server sent itself (`MCPError`) are re-raised unchanged so that protocol
        errors stay JSON-RPC errors downstream.
        """
        client = self._connected_client()
        try:
            with anyio.fail_after(self.call_timeout):
                return await send(client)
        except TimeoutError:
            raise UpstreamTimeout(
                f"Server {self.id!r} did not answer {operation} within {self.call_timeout:g} s; "
                "the request was cancelled. Try again, or with simpler arguments.",
                server=self.id,
            ) from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._closed.set()
                raise UpstreamUnavailable(
                    f"Server {self.id!r} closed its connection during {operation}.", server=self.id
                ) from None
            if exc.code == types.REQUEST_TIMEOUT:
                raise UpstreamTimeout(
                    f"Server {self.id!r} did not answer {operation} in time.", server=self.id
                ) from None
            raise
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._closed.set()
            raise UpstreamUnavailable(
                f"Server {self.id!r} could not be reached for {operation}: {_describe(exc)}.", server=self.id
            ) from None

    async def subscribe(self, uri: str) -> None:
        """Subscribe to updates of one resource, on whichever protocol era the server speaks."""
        if uri in self._subscriptions:
            return
        self._subscriptions.add(uri)
        if self.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self._resubscribe.set()
        else:
            await self.request("resources/subscribe", lambda c: c.session.subscribe_resource(uri))

    async def unsubscribe(self, uri: str) -> None:
        if uri not in self._subscriptions:
            return
        self._subscriptions.discard(uri)
        if self.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self._resubscribe.set()
        else:
            await self.request("resources/unsubscribe", lambda c: c.session.unsubscribe_resource(uri))


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _all_pages(fetch: Callable[..., Awaitable[Any]], items: Callable[[Any], list[Any]]) -> list[Any]:
    collected: list[Any] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await fetch(cursor=cursor, cache_mode="refresh")
        collected.extend(items(page))
        cursor = page.next_cursor
        if not cursor:
            break
    return collected


def _describe(exc: BaseException) -> str:
    """A one-line reason, unwrapping exception groups to their first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp-gateway")
    except PackageNotFoundError:
        return "0"
