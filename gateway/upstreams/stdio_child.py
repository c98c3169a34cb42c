"""The stdio transport to a child MCP server, which always takes the child's whole process group down.

The SDK's `stdio_client` starts the child in its own session but kills the group only
when the child itself outlives the grace period. When the child dies first (crashed,
SIGKILLed, or an `npx`/`uvx` wrapper that exits), its own children stay behind, and a
gateway that restarts such a server every few minutes piles up orphans. Here the group
is signalled on every exit path: SIGTERM, a grace period, then SIGKILL to whatever is left.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.abc
import mcp_types as types
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from gateway.upstreams.lean_wire import LeanCalls, StdioLean
from gateway.upstreams.message_bounds import DEFAULT_MAX_MESSAGE_BYTES, SETTING, LineBuffer
from gateway.upstreams.pipe_lines import read_lines

__all__ = ["GRACE_SECONDS", "kill_process_group", "stdio_child"]

logger = logging.getLogger(__name__)

GRACE_SECONDS = 2.0
"""How long a child gets to exit after stdin closes, and its group after SIGTERM."""
_POLL = 0.02
EXIT_POLL_SECONDS = 0.1
"""How often a running child's exit status is checked."""
WRITE_BUFFER = 256 * 1024
"""Bytes queued for a child's stdin past which a write waits for it to read (then through the lock)."""


@asynccontextmanager
async def stdio_child(
    params: StdioServerParameters,
    errlog: TextIO,
    on_spawn: Callable[[int], None] | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    lean: LeanCalls | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn `params` in a new process group and yield (read, write) streams of JSON-RPC messages.

    A line on stdout over `max_message_bytes` is not kept: `gateway.upstreams.message_bounds`.
    `lean`: the lean calls on this child (`gateway.upstreams.lean_calls`) take their answers out
    of stdout before the SDK reads it, and write their requests through the same pipe."""
    lean = lean if isinstance(lean, StdioLean) else None
    # Shielded: a cancel (the registry closing while it restarts a server) landing inside the spawn
    # would lose the process handle after the child exists, leaving a child that nothing stops.
    # Once spawned, a pending cancel is delivered inside the `try` below, whose `finally` stops it.
    # stdout is a pipe of our own, read by an event-loop callback (`pipe_lines`) rather than the
    # subprocess transport's `StreamReader`: a lean answer reaches its caller without a task between.
    stdout, child_stdout = os.pipe()
    try:
        with anyio.CancelScope(shield=True):
            process = await anyio.open_process(
                [params.command, *params.args],
                env=get_default_environment() | (params.env or {}),
                stdout=child_stdout,
                stderr=errlog,
                cwd=params.cwd,
                start_new_session=True,
            )
    except BaseException:
        os.close(stdout)
        raise
    finally:
        os.close(child_stdout)
    os.set_blocking(stdout, False)
    if on_spawn is not None:
        on_spawn(process.pid)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writing = anyio.Lock()
    stdin = getattr(process.stdin, "_stream", None)
    """The asyncio `StreamWriter` under anyio's wrapper, when it is one (`write`)."""

    async def write(data: bytes) -> None:
        """One whole message to stdin: the SDK's and the lean calls' writes never interleave. On
        asyncio's writer, a message goes in one synchronous `write` (whole, in order), and only a
        full pipe is waited for; anyio's `send` costs a lock, a drain and a checkpoint each time."""
        assert process.stdin is not None
        if not isinstance(stdin, asyncio.StreamWriter) or writing.locked():
            async with writing:
                await process.stdin.send(data)
            return
        if stdin.is_closing():
            raise anyio.BrokenResourceError
        try:
            stdin.write(data)
        except (ConnectionResetError, BrokenPipeError, RuntimeError) as exc:
            raise anyio.BrokenResourceError from exc
        if stdin.transport.get_write_buffer_size() > WRITE_BUFFER:
            async with writing:  # later writes queue behind this one until the child reads
                await process.stdin.send(b"")

    def end_lean() -> None:
        if lean is not None:
            lean.end()

    if lean is not None:
        lean.attach(write)

    async def pump_stdout() -> None:
        lines = LineBuffer(max_message_bytes, f"the stdio server {params.command!r}")

        def fast(line: bytes | dict[str, Any] | None) -> bool:
            return lean is not None and lean.take_now(line)

        async def slow(line: bytes | dict[str, Any] | None) -> None:
            if lean is not None and line is not None and await lean.offer(line):
                return
            if isinstance(line, dict):  # a message over the limit, dropped
                await read_writer.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(line)))
            elif line is None:
                await read_writer.send(ValueError(f"dropped a message over {SETTING} from stdout"))
            elif line.strip():
                await read_writer.send(_parse(line.decode(params.encoding, errors="replace")))

        async with read_writer:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await read_lines(stdout, lines.feed, fast, slow)
        end_lean()

    async def pump_stdin() -> None:
        assert process.stdin is not None
        async with write_reader:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for message in write_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await write(text.encode(params.encoding))
        # The child stopped reading (or we stopped writing): end the session's reads too.
        await read_writer.aclose()

    async def watch_exit() -> None:
        # A grandchild that inherited stdout keeps the pipe open after the child died, so
        # end of file alone would never tell: poll the exit status (wait() also waits for EOF).
        while process.returncode is None:
            await anyio.sleep(EXIT_POLL_SECONDS)
        end_lean()
        await read_writer.aclose()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump_stdout)
            tg.start_soon(pump_stdin)
            tg.start_soon(watch_exit)
            try:
                yield read_stream, write_stream
            finally:
                tg.cancel_scope.cancel()
    finally:
        end_lean()
        with anyio.CancelScope(shield=True):
            await _stop(process)
            os.close(stdout)
            for stream in (read_stream, write_stream, read_writer, write_reader):
                await stream.aclose()


def _parse(line: str) -> SessionMessage | Exception:
    """One stdout line as a message, or the parse error as a value (the session reports it)."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError:
        shown = line if len(line) <= 80 else line[:77] + "..."
        return ValueError(f"a line on stdout that is not a JSON-RPC message: {shown!r}")


async def _stop(process: anyio.abc.Process) -> None:
    """Close stdin, give the child a grace period, then clear its whole process group."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(GRACE_SECONDS):
        while process.returncode is None:
            await anyio.sleep(_POLL)
    await kill_process_group(process.pid, lambda: process.returncode)
    # The subprocess transport otherwise lingers (and warns at GC) while a pipe end is open.
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()


async def kill_process_group(pgid: int, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM every process in group `pgid`, wait for them, SIGKILL the rest.

    `reap` is called while waiting so that a zombie leader (ours to reap) does not keep
    the group alive for the whole grace period.
    """
    if not _signal_group(pgid, signal.SIGTERM):
        return
    with anyio.move_on_after(GRACE_SECONDS):
        while _group_alive(pgid):
            reap()
            await anyio.sleep(_POLL)
        return
    logger.warning("process group %d ignored SIGTERM for %g s; killing it", pgid, GRACE_SECONDS)
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Whether anything was left to signal."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.warning("no permission to signal process group %d", pgid)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is left in the group.

    On Linux /proc tells zombies apart: an orphan whose new parent does not reap it
    (PID 1 in some containers) would otherwise look alive for the whole grace period.
    """
    proc = Path("/proc")
    if proc.is_dir():
        return any(_live_member(stat, pgid) for stat in proc.glob("[0-9]*/stat"))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # one we may not signal: not proof that it is gone
    return True


def _live_member(stat: Path, pgid: int) -> bool:
    try:
        # `pid (comm) state ppid pgrp ...`; comm may contain spaces or parentheses.
        fields = stat.read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z"
