"""The transports an upstream session runs over, wrapped so the supervisor learns what the SDK hides.

- `watched`: any transport whose read stream sets an event when the peer goes away (the
  SDK keeps a `Client` open after its transport died).
- `http_transport`: streamable HTTP that reports every response's status (and, while tracing is
  on, sends the trace context as a `traceparent` header), each request leaving in one send
  (`corked`).

stdio has its own module, `gateway.upstreams.stdio_child`, because it also owns a process group.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from opentelemetry import propagate, trace

__all__ = ["CorkedBackend", "CorkedStream", "corked", "http_transport", "watched"]


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


class CorkedStream(AsyncNetworkStream):
    """A connection that holds what is written until the next read, then sends it in one go.

    httpcore writes a request's head and its body separately: two sends, and on loopback each
    send runs the peer's receive path and wakes it, which profiled at a quarter of the gateway's
    CPU per proxied call. An HTTP/1.1 client reads only once its request is written, so nothing
    waits on the held bytes."""

    def __init__(self, inner: AsyncNetworkStream) -> None:
        self._inner = inner
        self._held: list[bytes] = []
        self._timeout: float | None = None

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._held.append(buffer)
            self._timeout = timeout

    async def flush(self) -> None:
        """Send what is held (a write error surfaces here, as httpcore's `WriteError`)."""
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            await self._inner.write(data, self._timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self.flush()
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held.clear()
        await self._inner.aclose()

    async def start_tls(self, *args: Any, **kwargs: Any) -> AsyncNetworkStream:
        await self.flush()
        return CorkedStream(await self._inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class CorkedBackend(AsyncNetworkBackend):
    """httpcore's network backend, its connections `CorkedStream`s."""

    def __init__(self, inner: AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return CorkedStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> AsyncNetworkStream:
        return CorkedStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def corked(client: httpx2.AsyncClient) -> bool:
    """Make the direct connections of `client` `CorkedStream`s; True if done. httpx offers no
    public way to give its default transport a network backend, so this sets the pool's; a
    client whose transport is laid out otherwise is left as it is (and False says so)."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(pool, httpcore2.AsyncConnectionPool) or not isinstance(backend, AsyncNetworkBackend):
        return False
    if not isinstance(backend, CorkedBackend):
        pool._network_backend = CorkedBackend(backend)
    return True


@asynccontextmanager
async def http_transport(
    url: str, headers: Mapping[str, str], on_status: Callable[[int], None], auth: httpx2.Auth | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """Streamable HTTP, reporting every response's status (the SDK turns 401 and 500 alike
    into one generic JSON-RPC error, and the status is what tells them apart), and carrying the
    trace context in each request's headers while tracing is on. `auth`: an OAuth server's tokens."""

    async def report(response: Any) -> None:
        on_status(response.status_code)

    async with create_mcp_http_client(headers=dict(headers), auth=auth) as http_client:
        http_client.event_hooks["response"].append(report)
        # While tracing is on: `traceparent` in the headers too, for a server traced at its HTTP layer.
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # a provider is installed
            http_client.event_hooks["request"].append(_inject_trace_context)
        async with streamable_http_client(url, http_client=http_client) as streams:
            yield streams
