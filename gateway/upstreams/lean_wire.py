"""The connection side of the lean upstream path (`gateway.upstreams.lean_calls`): a lean
request's id space and how one goes over a stdio child.

`LeanCalls` is what a connection offers: ids of its own (`gw-1`, `gw-2`...: strings, the SDK's
are integers), `exchange` (send one JSON-RPC request, give back its result dict or raise the
server's error as `MCPError`) and the log lines sent during a call, relayed in order. `StdioLean`
is the stdio child's: the gateway owns the child's stdout reader (`gateway.upstreams.stdio_child`),
which hands it the lines that answer (or report progress on) a lean request, every other line
going to the SDK; requests are written through the same pipe, one write per line. Streamable
HTTP's is `gateway.upstreams.lean_post.HttpLean`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
import orjson
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.upstreams.lean_results import OutputChecks

__all__ = ["ID_PREFIX", "LeanCalls", "OnLog", "StdioLean", "closed_error", "outcome", "report"]

ID_PREFIX = "gw-"
_MARK = b'"gw-'
"""Every line that concerns a lean request has its id (or progress token) in it."""
_LOG_MARK = b'"notifications/message"'

OnLog = Callable[[types.LoggingMessageNotificationParams], Awaitable[None]]


def closed_error() -> MCPError:
    return MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")


class LeanCalls:
    """The lean requests of one connection: ids, and what each transport does with a request."""

    def __init__(self, on_log: OnLog | None = None) -> None:
        self._ids = itertools.count(1)
        self.broken = False
        """Set when the connection failed under a lean call: the supervisor is re-making it."""
        self.on_log = on_log
        """The client's logging callback: a log line sent during a call is relayed before its answer."""
        self.outputs = OutputChecks()
        """The tools' output schemas of this connection, compiled (`lean_results`)."""

    async def log(self, message: Any) -> bool:
        """Relay a `notifications/message` in order (the SDK would in a task of its own, after the
        answer had gone on); False leaves anything else, or a malformed one, to the SDK."""
        params = message.get("params") if isinstance(message, dict) else None
        if self.on_log is None or message.get("method") != "notifications/message" or not isinstance(params, dict):
            return False
        try:
            validated = types.LoggingMessageNotificationParams.model_validate(params, by_name=False)
        except ValidationError:
            return False
        await self.on_log(validated)
        return True

    def next_id(self) -> str:
        return f"{ID_PREFIX}{next(self._ids)}"

    async def exchange(self, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any) -> Any:
        """Send `message` and return its result (a dict); the server's error as `MCPError`."""
        raise NotImplementedError


class StdioLean(LeanCalls):
    """Lean requests over a stdio child: written to its stdin, answered through `take` by its stdout reader."""

    def __init__(self, on_log: OnLog | None = None) -> None:
        super().__init__(on_log)
        self._write: Callable[[bytes], Awaitable[None]] | None = None
        self._pending: dict[str, _Waiting] = {}
        self._ended = False

    def attach(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """The child's stdin writer (`stdio_child`), shared with the SDK's writes."""
        self._write = write

    async def offer(self, line: bytes | dict[str, Any]) -> bool:
        """Whether `line` answers a lean request, reports its progress or is a log line sent while
        lean requests wait; it is delivered if so, else it is the SDK's. Called by the stdout
        reader, in order, for every message."""
        if not self._pending:
            return False
        if isinstance(line, bytes) and _LOG_MARK in line:
            try:
                return await self.log(orjson.loads(line))
            except orjson.JSONDecodeError:
                return False
        return self.take(line)

    def take_now(self, line: bytes | dict[str, Any] | None) -> bool:
        """`offer` without its log lines (whose relay waits for the client): called in the stdout
        reader's read callback, an answer reaches its caller with no task in between."""
        if not self._pending or line is None or (isinstance(line, bytes) and _LOG_MARK in line):
            return False
        return self.take(line)

    def take(self, line: bytes | dict[str, Any]) -> bool:
        """`offer` for an answer or a progress report."""
        if isinstance(line, bytes):
            if _MARK not in line:
                return False
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                return False
        else:
            message = line
        if not isinstance(message, dict):
            return False
        request_id = message.get("id")
        if "method" not in message:
            target = self._pending.get(request_id) if isinstance(request_id, str) else None
            if target is None:
                return False
            target.put(message)
            return True
        params = message.get("params")
        if message.get("method") != "notifications/progress" or not isinstance(params, dict):
            return False
        token = params.get("progressToken")
        target = self._pending.get(token) if isinstance(token, str) else None
        if target is None:
            return False
        target.put(params)
        return True

    def end(self) -> None:
        """The child's stdout ended: every request waiting for an answer gets `Connection closed`."""
        self._ended = True
        for target in list(self._pending.values()):
            target.close()

    async def exchange(self, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any) -> Any:
        if self._ended or self._write is None:
            raise closed_error()
        waiting = self._pending[request_id] = _Waiting()
        try:
            try:
                await self._write(orjson.dumps(message) + b"\n")
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise closed_error() from None
            while True:
                answer = await waiting.get()
                if "progressToken" in answer:
                    await report(progress, answer)
                    continue
                return outcome(answer)
        finally:
            del self._pending[request_id]


class _Waiting:
    """One lean request's answer and progress reports, in the order the stdout reader saw them: a
    queue woken by a future (an anyio memory stream pair a request cost more than the rest of its wait)."""

    __slots__ = ("_items", "_wake", "_ended")

    def __init__(self) -> None:
        self._items: deque[dict[str, Any]] = deque()
        self._wake: asyncio.Future[None] | None = None
        self._ended = False

    def _wake_up(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def put(self, item: dict[str, Any]) -> None:
        self._items.append(item)
        self._wake_up()

    def close(self) -> None:
        self._ended = True
        self._wake_up()

    async def get(self) -> dict[str, Any]:
        """The next item; `Connection closed` once the reader ended with nothing left."""
        while not self._items:
            if self._ended:
                raise closed_error()
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None
        return self._items.popleft()


def outcome(answer: dict[str, Any]) -> Any:
    """The result of a JSON-RPC response, or its error raised."""
    if "error" in answer and "result" not in answer:
        try:
            error = types.ErrorData.model_validate(answer["error"])
        except ValidationError as exc:
            raise MCPError(types.PARSE_ERROR, f"a malformed error response: {exc}") from None
        raise MCPError.from_error_data(error)
    result = answer.get("result")
    if not isinstance(result, dict):
        raise MCPError(types.PARSE_ERROR, "a response whose result is not an object")
    return result


async def report(progress: Any, params: dict[str, Any]) -> None:
    value, total, message = params.get("progress"), params.get("total"), params.get("message")
    if progress is None or not isinstance(value, int | float) or isinstance(value, bool):
        return
    with anyio.CancelScope(shield=True):
        await progress(
            float(value),
            float(total) if isinstance(total, int | float) else None,
            message if isinstance(message, str) else None,
        )
