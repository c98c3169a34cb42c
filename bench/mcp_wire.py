"""MCP on the wire, by hand: the lean client sessions of `bench/load.py`, over HTTP/1.1 and stdio.

A load generator on 2 cores must not eat the CPU it measures: httpx or the SDK's client use
most of a core by themselves. These are a few lines of asyncio instead:

- `HttpSession`: one MCP session over streamable HTTP on one keep-alive HTTP/1.1 connection
  (`asyncio.open_connection`, TCP_NODELAY): `initialize` and `notifications/initialized`,
  then `tools/call` POSTs with `Mcp-Session-Id`, `MCP-Protocol-Version` and
  `Accept: application/json, text/event-stream`; the answer is read from a JSON body or an
  SSE stream's `data:` events, chunked or with a content length; `DELETE` ends it.
- `StdioConnection`: one MCP session over a child's stdin/stdout, newline-delimited JSON-RPC,
  many requests in flight, answers matched by id; `StdioSession` is one caller on it.

Calls raise `CallError` on an HTTP error status, a JSON-RPC error, an `isError` result or a
broken connection.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from typing import Any

__all__ = [
    "MODERN_VERSION",
    "PROTOCOL_VERSION",
    "CallError",
    "HttpSession",
    "Session",
    "StdioConnection",
    "StdioSession",
]

PROTOCOL_VERSION = "2025-11-25"
"""The handshake-era version offered in `initialize` (each server's answer is used after)."""


class CallError(Exception):
    """A call that failed: an HTTP status, a JSON-RPC error, an error result, a broken connection."""


def _request(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


INITIALIZE = {
    "protocolVersion": PROTOCOL_VERSION,
    "capabilities": {},
    "clientInfo": {"name": "mcp-gateway-bench-load", "version": "1"},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
MODERN_VERSION = "2026-07-28"
MODERN_ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench-load", "version": "1"},
}
"""What a 2026-07-28 request carries in `_meta` in place of a handshake."""


def _check_result(message: dict[str, Any]) -> dict[str, Any]:
    if "error" in message:
        raise CallError(f"JSON-RPC error {message['error']}")
    result = message.get("result")
    if not isinstance(result, dict):
        raise CallError(f"no result in {message!r:.200}")
    if result.get("isError"):
        raise CallError(f"error result {result!r:.200}")
    return result


class HttpSession:
    """One MCP session over streamable HTTP: one keep-alive HTTP/1.1 connection, calls one at a time.

    `modern`: speak 2026-07-28, where there is no handshake and no session: every request
    carries the protocol envelope in `_meta`, and its method and tool name in headers."""

    def __init__(self, url: str, modern: bool = False) -> None:
        rest = url.removeprefix("http://")
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.partition(":")
        self.host, self.port, self.path = host, int(port or 80), "/" + path
        self.hostport = hostport
        self.session_id: str | None = None
        self.version: str | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.next_id = 0
        self.modern = modern

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 24)
            sock = self.writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.reader, self.writer

    def _drop(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def _exchange(
        self, method: str, body: bytes | None, want_id: int | None, extra: tuple[str, ...] = ()
    ) -> tuple[int, dict[str, str], dict[str, Any] | None]:
        """Send one request, read its whole response; return status, headers, the JSON-RPC answer."""
        reader, writer = await self._connect()
        head = [
            f"{method} {self.path} HTTP/1.1",
            f"Host: {self.hostport}",
            "Accept: application/json, text/event-stream",
            *extra,
        ]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        else:
            head.append("Content-Length: 0")
        if self.session_id:
            head.append(f"Mcp-Session-Id: {self.session_id}")
        if self.version:
            head.append(f"MCP-Protocol-Version: {self.version}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
        try:
            status_line, headers = await self._read_head(reader)
            status = int(status_line.split()[1])
            payload = await self._read_body(reader, headers)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError) as exc:
            self._drop()
            raise CallError(f"connection: {exc!r:.200}") from exc
        except asyncio.CancelledError:  # a call timed out mid-response: the connection is out of step
            self._drop()
            raise
        if headers.get("connection", "").lower() == "close":
            self._drop()
        if status >= 300:
            raise CallError(f"HTTP {status}: {payload[:200]!r}")
        if want_id is None or not payload:
            return status, headers, None
        return status, headers, _answer(payload, headers.get("content-type", ""), want_id)

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]]:
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return lines[0], headers

    @staticmethod
    async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # no trailers from these servers
                    return b"".join(parts)
                parts.append((await reader.readexactly(size + 2))[:-2])
        length = int(headers.get("content-length", "0"))
        return await reader.readexactly(length) if length else b""

    async def open(self) -> None:
        if self.modern:
            self.version = MODERN_VERSION
            await self._connect()
            return
        self.next_id += 1
        body = json.dumps(_request(self.next_id, "initialize", INITIALIZE)).encode()
        _, headers, answer = await self._exchange("POST", body, self.next_id)
        self.session_id = headers.get("mcp-session-id")
        self.version = str(_check_result(answer or {}).get("protocolVersion", PROTOCOL_VERSION))
        await self._exchange("POST", json.dumps(INITIALIZED).encode(), None)

    async def call(self, tool: str, arguments: dict[str, Any]) -> None:
        self.next_id += 1
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        extra: tuple[str, ...] = ()
        if self.modern:
            params["_meta"] = MODERN_ENVELOPE
            extra = ("Mcp-Method: tools/call", f"Mcp-Name: {tool}")
        body = json.dumps(_request(self.next_id, "tools/call", params)).encode()
        _, _, answer = await self._exchange("POST", body, self.next_id, extra)
        _check_result(answer or {})

    async def close(self) -> None:
        """End the MCP session (DELETE), then the connection."""
        try:
            if self.session_id:
                await asyncio.wait_for(self._exchange("DELETE", None, None), 5)
        except (CallError, OSError, TimeoutError):
            pass
        self._drop()


def _answer(payload: bytes, content_type: str, want_id: int) -> dict[str, Any]:
    """The JSON-RPC message answering `want_id`, from a JSON body or an SSE stream's `data:` events."""
    if content_type.startswith("application/json"):
        message = json.loads(payload)
        if isinstance(message, dict):
            return message
        raise CallError(f"unexpected JSON body {payload[:200]!r}")
    for event in payload.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
        if data:
            message = json.loads(data)
            if isinstance(message, dict) and message.get("id") == want_id:
                return message
    raise CallError(f"no answer to request {want_id} in {payload[:200]!r}")


class StdioConnection:
    """One MCP session over a child's stdin/stdout: many requests in flight, answers matched by id."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.closed = False
        self.reader_task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while line := await self.stdout.readline():
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue  # not JSON-RPC: a server's stray print
                id_ = message.get("id") if isinstance(message, dict) else None
                waiter = self.pending.pop(id_, None) if isinstance(id_, int) else None
                if waiter is not None and not waiter.done():
                    waiter.set_result(message)
        finally:
            self.closed = True
            for waiter in self.pending.values():
                if not waiter.done():
                    waiter.set_exception(CallError("the process closed its stdout"))
            self.pending.clear()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self.closed:
            raise CallError("the process closed its stdout")
        id_ = next(self.ids)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[id_] = waiter
        self.stdin.write(json.dumps(_request(id_, method, params)).encode() + b"\n")
        try:
            return _check_result(await waiter)
        finally:
            self.pending.pop(id_, None)  # answered, or timed out: a late answer is dropped

    async def open(self) -> None:
        await self.request("initialize", INITIALIZE)
        self.stdin.write(json.dumps(INITIALIZED).encode() + b"\n")

    async def call(self, tool: str, arguments: dict[str, Any]) -> None:
        await self.request("tools/call", {"name": tool, "arguments": arguments})


class StdioSession:
    """A "session" over stdio: one caller with one request at a time on the shared connection."""

    def __init__(self, connection: StdioConnection) -> None:
        self.connection = connection

    async def open(self) -> None:
        pass

    async def call(self, tool: str, arguments: dict[str, Any]) -> None:
        await self.connection.call(tool, arguments)

    async def close(self) -> None:
        pass


Session = HttpSession | StdioSession
