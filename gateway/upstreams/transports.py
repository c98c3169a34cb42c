"""The transports an upstream session runs over, wrapped so the supervisor learns what the SDK hides.

- `watched`: any transport whose read stream sets an event when the peer goes away (the
  SDK keeps a `Client` open after its transport died).
- `http_transport`: streamable HTTP that reports every response's status (and, while tracing is
  on, sends the trace context as a `traceparent` header).

stdio has its own module, `gateway.upstreams.stdio_child`, because it also owns a process group.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT, create_mcp_http_client
from opentelemetry import propagate, trace

from gateway.upstreams.lean_http import LeanTransport

__all__ = ["http_transport", "watched"]


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
async def watched(transport: Any, closed: anyio.Event) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, closed), write_stream


async def _inject_trace_context(request: Any) -> None:
    """The current trace context (the SDK's CLIENT span of this request) as `traceparent`/`tracestate` headers.

    The POST runs in a task the SDK starts in the context of the request's sender, so the span is current here."""
    propagate.inject(request.headers)


@asynccontextmanager
async def http_transport(
    url: str, headers: Mapping[str, str], on_status: Callable[[int], None], auth: httpx2.Auth | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """Streamable HTTP, reporting every response's status (the SDK turns 401 and 500 alike
    into one generic JSON-RPC error, and the status is what tells them apart), and carrying the
    trace context in each request's headers while tracing is on. `auth`: an OAuth server's tokens."""

    async def report(response: Any) -> None:
        on_status(response.status_code)

    async with _upstream_http_client(headers, auth) as http_client:
        http_client.event_hooks["response"].append(report)
        # While tracing is on: `traceparent` in the headers too, for a server traced at its HTTP layer.
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # a provider is installed
            http_client.event_hooks["request"].append(_inject_trace_context)
        async with streamable_http_client(url, http_client=http_client) as streams:
            yield streams


def _upstream_http_client(headers: Mapping[str, str], auth: httpx2.Auth | None) -> httpx2.AsyncClient:
    """PROTOTYPE switch (issue 17): `GATEWAY_UPSTREAMS__HTTP_CLIENT=httpx` for httpx2's own pool
    (httpcore2); anything else, on this branch, the lean transport."""
    if os.environ.get("GATEWAY_UPSTREAMS__HTTP_CLIENT", "lean") == "httpx":
        return create_mcp_http_client(headers=dict(headers), auth=auth)
    return httpx2.AsyncClient(
        headers=dict(headers),
        auth=auth,
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=LeanTransport(),
    )
