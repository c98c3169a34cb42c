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
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

__all__ = ["READ_SIZE", "stdio_streams"]

READ_SIZE = 1 << 16
"""Bytes read from stdin at a time; a longer message arrives in several reads."""


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[Any, Any]]:
    """(read, write) streams of JSON-RPC messages over this process's stdin and stdout."""
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
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump_in, wire_in, read_writer)
            tg.start_soon(_pump_out, wire_out, write_reader, read_writer)
            try:
                yield read_stream, write_stream
            finally:
                tg.cancel_scope.cancel()
    finally:
        for stream in (read_stream, write_stream, read_writer, write_reader):
            await stream.aclose()
        _restore(1, wire_out)
        _restore(0, wire_in)


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


async def _pump_in(wire: int, messages: Any) -> None:
    """Read lines until end of file, each one a message (or, unparseable, the error)."""
    pending: list[bytes] = []
    async with messages:
        while True:
            await anyio.wait_readable(wire)
            try:
                chunk = os.read(wire, READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not chunk:
                return
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                pending.append(chunk[start:end])
                line = b"".join(pending).decode("utf-8", errors="replace")
                pending.clear()
                start = end + 1
                if line.strip():
                    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                        await messages.send(_parse(line))
            if start < len(chunk):
                pending.append(chunk[start:])


def _parse(line: str) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # the server loop answers it as a parse error
        return exc


async def _pump_out(wire: int, messages: Any, reads: Any) -> None:
    """Write each message as one line; a client that closed its end ends the session's reads too."""
    async with messages:
        async for message in messages:
            data = memoryview((message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode())
            try:
                while data:
                    try:
                        data = data[os.write(wire, data) :]
                    except BlockingIOError:
                        await anyio.wait_writable(wire)
            except OSError:  # EPIPE: nobody reads any more
                await reads.aclose()
                return
