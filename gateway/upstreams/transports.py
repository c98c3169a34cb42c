"""The transports an upstream session runs over, wrapped so the supervisor learns what the SDK hides.

- `watched`: any transport whose read stream sets an event when the peer goes away (the
  SDK keeps a `Client` open after its transport died).
- `http_transport`: streamable HTTP that reports every response's status (and, while tracing is
  on, sends the trace context as a `traceparent` header), over the lean HTTP/1.1 transport
  (`gateway.upstreams.lean_http`) unless the settings or a proxy say httpx2's own.
  The legacy HTTP+SSE transport (`transport: sse`) goes over the same client, with the same reports.
  An SSE answer its reader closes once it has what it wanted (the SDK's client and the lean calls
  through httpx2 close it after the answer's event: with OAuth, after a redirect) is finished in
  the background rather than dropped (`_FinishedLater`), so that its connection is kept.

stdio has its own module, `gateway.upstreams.stdio_child`, because it also owns a process group.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import httpx2
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT, create_mcp_http_client
from opentelemetry import propagate, trace

from gateway.upstreams.lean_http import Body, LeanTransport
from gateway.upstreams.lean_post import DirectPost, HttpLean, merged_reads
from gateway.upstreams.lean_wire import LeanCalls
from gateway.upstreams.message_bounds import DEFAULT_MAX_MESSAGE_BYTES, bound_responses

__all__ = ["HttpClientKind", "http_transport", "proxy_for", "upstream_http_client", "watched"]

logger = logging.getLogger(__name__)

HttpClientKind = Literal["lean", "httpx"]
"""`GATEWAY_UPSTREAMS__HTTP_CLIENT`: the gateway's lean transport, or httpx2's (httpcore2)."""


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


class _FinishedLater(httpx2.AsyncByteStream):
    """An SSE answer's body that, closed by its reader between two chunks, is finished in the
    background (`Body.finish_later`: the stream's end normally arrives in a later packet) rather
    than dropped with its connection. Closed in the middle of a read (cancelled, failed), the
    connection's state is unknown: dropped, as before."""

    def __init__(self, body: Body) -> None:
        self._body = body
        self._between = True
        """No read of the body is under way or failed half-way: it stands at a chunk's end."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self._between = False
            chunk = await self._body.next_chunk()
            self._between = True  # not reached when the read raised (or was cancelled)
            if chunk is None:
                return
            yield chunk

    async def aclose(self) -> None:
        if self._between:
            self._body.finish_later()  # ended already: a no-op
        await self._body.aclose()  # finishing: a no-op; else the connection is dropped


class _KeepingTransport(LeanTransport):
    """The lean transport, its SSE answers' bodies finished rather than dropped (`_FinishedLater`)."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        stream = response.stream
        sse = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        if sse and isinstance(stream, Body):
            response.stream = _FinishedLater(stream)
        return response


@asynccontextmanager
async def watched(transport: Any, closed: anyio.Event) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, closed), write_stream


async def _inject_trace_context(request: Any) -> None:
    """The current trace context (the SDK's CLIENT span of this request) as `traceparent`/`tracestate` headers.

    The POST runs in a task the SDK starts in the context of the request's sender, so the span is current here."""
    propagate.inject(request.headers)


def _reporting(http_client: httpx2.AsyncClient, on_status: Callable[[int], None]) -> httpx2.AsyncClient:
    """`http_client`, reporting every response's status to `on_status` (the SDK turns 401 and 500 alike
    into one generic JSON-RPC error, and the status is what tells them apart) and, while tracing is on,
    carrying the trace context in each request's headers (for a server traced at its HTTP layer)."""

    async def report(response: Any) -> None:
        on_status(response.status_code)

    http_client.event_hooks["response"].append(report)
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # a provider is installed
        http_client.event_hooks["request"].append(_inject_trace_context)
    return http_client


@asynccontextmanager
async def http_transport(
    url: str,
    headers: Mapping[str, str],
    on_status: Callable[[int], None],
    auth: httpx2.Auth | None = None,
    client: HttpClientKind = "lean",
    server: str = "",
    sse: bool = False,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    lean: LeanCalls | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Streamable HTTP, or with `sse` the legacy HTTP+SSE transport (a GET event stream, messages
    POSTed to the endpoint it names), over `upstream_http_client`, reporting statuses (`_reporting`).
    `auth`: an OAuth server's tokens; `client`, `server`: see `upstream_http_client`. A message
    over `max_message_bytes` is dropped unread (`gateway.upstreams.message_bounds`); the legacy
    SSE transport also keeps the SDK's own 1 MiB limit on one event. `lean`: streamable HTTP's
    lean calls (`gateway.upstreams.lean_calls`) go through the same client and hand what is not
    theirs to the SDK's read stream."""
    if sse:

        def factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            http_client = upstream_http_client(url, headers or {}, auth, client, server, timeout)
            return _reporting(bound_responses(http_client, max_message_bytes, server), on_status)

        async with sse_client(url, headers=dict(headers), auth=auth, httpx_client_factory=factory) as streams:
            yield streams
        return
    http_client = bound_responses(upstream_http_client(url, headers, auth, client, server), max_message_bytes, server)
    async with _reporting(http_client, on_status):
        async with streamable_http_client(url, http_client=http_client, max_sse_event_size=None) as streams:
            if not isinstance(lean, HttpLean):
                yield streams
                return
            direct = None
            transport = getattr(http_client, "_transport", None)
            if auth is None and isinstance(transport, LeanTransport):
                # Nothing but the hooks above sits on this client: its POSTs may skip it (`lean_post`).
                timeout = http_client.timeout
                direct = DirectPost(transport, url, http_client.headers, timeout, on_status, max_message_bytes, server)
            lean.attach(http_client, direct)
            async with merged_reads(streams[0], lean) as read:
                yield read, streams[1]


def upstream_http_client(
    url: str,
    headers: Mapping[str, str],
    auth: httpx2.Auth | None,
    kind: HttpClientKind,
    server: str,
    timeout: httpx2.Timeout | None = None,
) -> httpx2.AsyncClient:
    """The httpx2 client for one HTTP server, with `timeout` (default: the SDK's for streamable
    HTTP): over the lean transport, unless `kind` is `httpx` or a proxy from the environment applies
    to `url` (the lean transport speaks to origins directly; httpx2 honours `HTTPS_PROXY`,
    `NO_PROXY`...)."""
    timeout = timeout or httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    if kind == "lean":
        proxy = proxy_for(url, urllib.request.getproxies())
        if proxy is None:
            return httpx2.AsyncClient(
                headers=dict(headers),
                auth=auth,
                timeout=timeout,
                transport=_KeepingTransport(),
            )
        where = httpx2.URL(proxy if "://" in proxy else f"http://{proxy}")  # no credentials in the log
        logger.info(
            "server %r is reached through the proxy at %s:%s (from the environment), over httpx2's own transport",
            server,
            where.host,
            where.port or "",
        )
    return create_mcp_http_client(headers=dict(headers), auth=auth, timeout=timeout)


def proxy_for(url: str, proxies: Mapping[str, str]) -> str | None:
    """The proxy that `proxies` (as `urllib.request.getproxies()` reads them from the
    environment: `http`, `https`, `all`, `no`) sets for `url`, or None when none applies."""
    parsed = httpx2.URL(url)
    proxy = proxies.get(parsed.scheme) or proxies.get("all")
    if not proxy:
        return None
    host = f"{parsed.host}:{parsed.port}" if parsed.port else parsed.host
    # `NO_PROXY` read the way urllib reads it (undocumented, so not in typeshed).
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if "no" in proxies and bypass(host, dict(proxies)):
        return None
    return proxy
