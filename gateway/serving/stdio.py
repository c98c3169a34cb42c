"""The downstream stdio transport, read and written by the event loop.

The SDK's `stdio_server` reads stdin and writes stdout through anyio's worker threads, so
every message a client sends and every answer it gets crosses a thread and back. Here
the pipes are non-blocking and watched by the event loop, as the upstream side
(`gateway.upstreams.stdio_child`) already does.

Like the SDK's transport, it takes fd 0 and fd 1 for itself while serving: fd 0 then
reads the null device and fd 1 writes to stderr, so a plugin's stray `print()` or a
child that inherits them never corrupts the wire; both are restored on exit. A stdin or
stdout the event loop cannot watch (a regular file, a terminal) is served by the SDK's
transport instead.

Every line for stdout goes through one `Outbox`, the lines of one turn of the event loop written
together to the pipe while the pipe takes them (a backlog flushed when it becomes writable), so the
SDK's messages and the lean path's answers (`gateway.serving.stdio_lean`) leave in the order they
were written: a call's progress before its answer. A line read from stdin is offered to the lean path first; what it
does not take is parsed for the SDK's session as before.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from types import TracebackType
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from gateway.upstreams.pipe_lines import READ_SIZE, read_lines

__all__ = ["READ_SIZE", "LineTaker", "Outbox", "stdio_streams"]

BACKLOG_LIMIT = 1 << 18
"""Bytes a writer may leave unwritten (the client reads slowly) before its next send waits."""
LAST_FLUSH_SECONDS = 2.0
"""At the end of the session: how long what is still unwritten may take to leave."""


class LineTaker(Protocol):
    """The lean path as the transport sees it (`gateway.serving.stdio_lean.StdioLean`)."""

    def bind(self, outbox: Outbox) -> None:
        """The session's stdout: where its answers go, and the write stream the SDK's session is given."""

    def take(self, line: bytes) -> bool:
        """Serve this line from stdin (True), or leave it to the SDK's session (False)."""


@asynccontextmanager
async def stdio_streams(lean: LineTaker | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """(read, write) streams of JSON-RPC messages over this process's stdin and stdout;
    `lean` is offered each line first (not with the SDK's transport)."""
    if not (_pollable(0) and _pollable(1)):
        async with stdio_server() as streams:
            yield streams
        return
    wire_in = _claim(0, os.open(os.devnull, os.O_RDONLY))
    try:
        wire_out = _claim(1, os.dup(2))
    except OSError:
        _restore(0, wire_in)
        raise
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbox = Outbox(wire_out, on_broken=read_writer.close)  # EPIPE: nobody reads, the session's reads end too
    if lean is not None:
        lean.bind(outbox)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump_in, wire_in, read_writer, lean)
            tg.start_soon(outbox.flush)
            try:
                yield read_stream, outbox
            finally:
                with anyio.move_on_after(LAST_FLUSH_SECONDS, shield=True):
                    await outbox.flushed()
                tg.cancel_scope.cancel()
    finally:
        for stream in (read_stream, read_writer, outbox):
            await stream.aclose()
        _restore(1, wire_out)
        _restore(0, wire_in)


class Outbox:
    """stdout, one message a line: the SDK session's write stream (`send`) and the lean path's
    (`write`). The lines written during one turn of the event loop leave together, in one write
    to the pipe at the end of the turn (50 calls answered in a turn: one system call, not 50); what
    the pipe does not take joins the backlog that `flush` writes as the pipe drains, and a send waits
    while the backlog is over `BACKLOG_LIMIT` (a client that stops reading holds its server up, as a
    pipe would)."""

    def __init__(self, wire: int, *, on_broken: Callable[[], None]) -> None:
        self._wire = wire
        self._on_broken = on_broken
        self._backlog = bytearray()
        self._scheduled = False
        """A write of the backlog is due at the end of this turn of the loop (`_write_now`)."""
        self._draining = False
        """`flush` owns the backlog: the pipe was full, and it writes as the pipe drains."""
        self._pending = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._empty = asyncio.Event()
        self._empty.set()
        self.closed = False
        self.broken = False

    def write(self, data: bytes) -> None:
        """Queue one line (ending in a newline) after everything written before it."""
        if self.broken:
            raise anyio.BrokenResourceError
        self._backlog += data
        self._empty.clear()
        if len(self._backlog) > BACKLOG_LIMIT:
            self._room.clear()
        if not self._scheduled and not self._draining:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._write_now)

    def _write_now(self) -> None:
        """The turn's lines, in one write; the rest, if the pipe is full, to `flush`."""
        self._scheduled = False
        if self._draining or self.broken or not self._backlog or not self._write_some():
            return
        if self._backlog:
            self._draining = True
            self._pending.set()
        else:
            self._empty.set()

    async def room(self) -> None:
        """Wait while the backlog is over its limit."""
        if not self._room.is_set():
            await self._room.wait()

    async def flushed(self) -> None:
        """Wait until everything written has reached the pipe (or the pipe broke)."""
        await self._empty.wait()

    async def flush(self) -> None:
        """Write the backlog as the pipe takes it, once the pipe was full (a task for the session's lifetime)."""
        while True:
            await self._pending.wait()
            self._pending.clear()
            try:
                while self._backlog:
                    await anyio.wait_writable(self._wire)
                    if not self._write_some():
                        return
            finally:
                self._draining = False
            self._empty.set()

    def _write_some(self) -> bool:
        """Write what the pipe takes of the backlog now; False when the pipe broke."""
        try:
            written = os.write(self._wire, self._backlog)
        except BlockingIOError:
            return True
        except OSError:
            self._break()
            return False
        del self._backlog[:written]
        if len(self._backlog) <= BACKLOG_LIMIT:
            self._room.set()
        return True

    def _break(self) -> None:
        self.broken = True
        self._backlog.clear()
        for event in (self._room, self._empty):
            event.set()
        self._on_broken()

    # The SDK's `WriteStream[SessionMessage]`.

    async def send(self, message: SessionMessage, /) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        self.write((message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode())
        await self.room()

    async def aclose(self) -> None:
        self.closed = True

    async def __aenter__(self) -> Outbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _pollable(fd: int) -> bool:
    """A pipe or a socket: what epoll can watch and non-blocking mode does not share with a shell.
    (On Windows the event loop cannot watch a pipe: the SDK's transport serves.)"""
    if sys.platform == "win32":
        return False
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _claim(fd: int, diversion: int) -> int:
    """Move the wire behind `fd` to a private, non-blocking descriptor, and point `fd` at `diversion`."""
    import fcntl  # POSIX only, as `_pollable` has checked

    try:
        wire = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
        os.dup2(diversion, fd)
    finally:
        os.close(diversion)
    os.set_blocking(wire, False)
    return wire


def _restore(fd: int, wire: int) -> None:
    with suppress(OSError):
        os.set_blocking(wire, True)
        os.dup2(wire, fd)
    with suppress(OSError):
        os.close(wire)


async def _pump_in(wire: int, messages: Any, lean: LineTaker | None) -> None:
    """Read lines until end of file, each one a message (or, unparseable, the error) for the
    SDK's session unless the lean path takes it: in the read callback (`read_lines`), without
    waking a task, as long as no line for the SDK's session waits before it."""

    def fast(line: bytes) -> bool:
        return not line.strip() or (lean is not None and lean.take(line))

    async def slow(line: bytes) -> None:
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await messages.send(_parse(line.decode("utf-8", errors="replace")))

    async with messages:
        await read_lines(wire, _Lines().split, fast, slow)


class _Lines:
    """Splits stdin's chunks into lines, keeping a partial one for the next chunk."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []

    def split(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        pending, start = self.pending, 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if pending:
                pending.append(chunk[start:end])
                lines.append(b"".join(pending))
                pending.clear()
            else:
                lines.append(chunk[start:end])
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
        return lines


def _parse(line: str) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # the server loop answers it as a parse error
        return exc
