"""Feedback on a tool result: `submit_feedback(token, rating?, score?, comment?)` and `POST /feedback`.

The token is the execution id the result carried in `_meta["mcp-gateway/feedback_token"]`.
A client may rate a result milliseconds after getting it, before the writer flushed
it: a token not found yet makes the writer flush, and the lookup is made again. Behind a load
balancer the call may have been made by another replica: the replicas are asked to flush
(`Records.ask_peers_to_flush`) and the lookup is repeated until the call's replica has written it
(within `PEER_WAIT` seconds past its flush interval, which it writes at the latest anyway).
Feedback itself is written through, not buffered: the caller learns whether it was
kept. A caller can rate only executions of tools it may see (`gateway.security.scopes`); any
other token is as unknown as a made-up one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
import mcp_types as types
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import ExecutionError, InvalidArguments, error_result
from gateway.records.model import FEEDBACK_TOKEN_META_KEY, ExecutionRef, FeedbackRow
from gateway.records.store import AlreadyRated, StoreUnavailable
from gateway.security.http_guard import principal_in
from gateway.security.scopes import tool_visible

if TYPE_CHECKING:
    from gateway.records.service import Records

__all__ = [
    "FEEDBACK_TOOL",
    "MAX_COMMENT_CHARS",
    "FeedbackError",
    "FeedbackInput",
    "feedback_endpoint",
    "feedback_from",
    "feedback_tool_result",
    "parse_feedback",
    "submit_feedback",
]

MAX_COMMENT_CHARS = 2000
PEER_WAIT = 2.0
"""Seconds, beyond `records.flush_interval`, that feedback waits for another replica to write its call."""
PEER_POLL = 0.05
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_FIELDS = ("token", "rating", "score", "comment")

FEEDBACK_TOOL = types.Tool(
    name="submit_feedback",
    description=(
        "Rate the result of a tool call, so the gateway learns which tools work. Pass the result's "
        f'_meta["{FEEDBACK_TOKEN_META_KEY}"] as `token`, with rating "up" or "down" and/or a score from 1 '
        "(useless) to 5 (exactly right), and an optional comment. Each result can be rated once."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "token": {"type": "string", "description": "The result's feedback token."},
            "rating": {"type": "string", "enum": ["up", "down"], "description": "Thumbs up or down."},
            "score": {"type": "integer", "minimum": 1, "maximum": 5, "description": "1 (useless) to 5 (right)."},
            "comment": {"type": "string", "maxLength": MAX_COMMENT_CHARS, "description": "What was good or wrong."},
        },
        "required": ["token"],
    },
    annotations=types.ToolAnnotations(read_only_hint=False, idempotent_hint=False, open_world_hint=False),
)


class FeedbackError(Exception):
    """Feedback that was not recorded; `status` is the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class FeedbackInput:
    token: str
    rating: Literal["up", "down"] | None
    score: int | None
    comment: str | None


def parse_feedback(arguments: Mapping[str, Any] | None) -> FeedbackInput:
    """Check the fields; a bad one is named in the error."""
    arguments = arguments or {}
    unknown = sorted(set(arguments) - set(_FIELDS))
    if unknown:
        raise FeedbackError(f"Unknown field(s): {', '.join(unknown)}; feedback takes {', '.join(_FIELDS)}.")
    token = arguments.get("token")
    if not isinstance(token, str) or not _TOKEN.match(token):
        raise FeedbackError(
            f'`token` must be a result\'s _meta["{FEEDBACK_TOKEN_META_KEY}"]: 32 hexadecimal digits; got {token!r:.60}.'
        )
    rating = arguments.get("rating")
    if rating is not None and rating not in ("up", "down"):
        raise FeedbackError(f'`rating` must be "up" or "down"; got {rating!r:.40}.')
    score = arguments.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int) or not 1 <= score <= 5):
        raise FeedbackError(f"`score` must be an integer from 1 to 5; got {score!r:.40}.")
    if rating is None and score is None:
        raise FeedbackError('Feedback needs `rating` ("up" or "down") or `score` (1 to 5), or both.')
    comment = arguments.get("comment")
    if comment is not None and not isinstance(comment, str):
        raise FeedbackError(f"`comment` must be a string; got {type(comment).__name__}.")
    if comment is not None and len(comment) > MAX_COMMENT_CHARS:
        raise FeedbackError(f"`comment` is {len(comment)} characters; the limit is {MAX_COMMENT_CHARS}.")
    return FeedbackInput(token, cast(Literal["up", "down"] | None, rating), score, comment or None)


async def submit_feedback(
    records: Records, feedback: FeedbackInput, *, may_see: Callable[[ExecutionRef], bool], client_id: str | None
) -> ExecutionRef:
    """Record feedback on an execution the caller may see; raises `FeedbackError` saying why not."""
    store = records.store
    try:
        found = await anyio.to_thread.run_sync(store.execution, feedback.token)
        if found is None and records.writer.pending:
            await records.flush()
            found = await anyio.to_thread.run_sync(store.execution, feedback.token)
        if found is None and records.ask_peers_to_flush is not None:
            found = await _from_peers(records, feedback.token)
        if found is None or not may_see(found):
            raise FeedbackError(
                f"Unknown feedback token {feedback.token!r}: it is not the token of a recorded result "
                f"(results older than {records.settings.retention_days:g} days are deleted).",
                404,
            )
        row = FeedbackRow(
            feedback.token, found.id, time.time(), feedback.rating, feedback.score, feedback.comment, client_id
        )
        await anyio.to_thread.run_sync(store.add_feedback, row)
    except AlreadyRated:
        raise FeedbackError(
            f"This result was already rated (token {feedback.token!r}); each is rated once.", 409
        ) from None
    except StoreUnavailable as error:
        raise FeedbackError(f"Feedback could not be saved now ({error}); try again later.", 503) from None
    return found


async def feedback_from(records: Records | None, arguments: Mapping[str, Any] | None, request: Any) -> ExecutionRef:
    """Feedback from the caller of `request` (its principal decides what it may rate); raises `FeedbackError`."""
    if records is None:
        raise FeedbackError("This gateway keeps no records (GATEWAY_RECORDS__ENABLED=false).", 404)
    principal = principal_in(request)
    return await submit_feedback(
        records,
        parse_feedback(arguments),
        may_see=lambda execution: tool_visible(principal, execution.server, execution.tool),
        client_id=principal.name if principal is not None else None,
    )


async def feedback_tool_result(
    records: Records | None, arguments: Mapping[str, Any] | None, request: Any
) -> types.CallToolResult:
    """The `submit_feedback` tool: a short confirmation, or an error result saying what was wrong."""
    try:
        execution = await feedback_from(records, arguments, request)
    except FeedbackError as exc:
        error = InvalidArguments(exc.message) if exc.status < 500 else ExecutionError(exc.message)
        return error_result(error)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"Feedback recorded for {execution.tool}. Thank you.")],
        structured_content={"recorded": True, "tool": execution.tool},
    )


async def feedback_endpoint(records: Records | None, request: Request) -> Response:
    """`POST /feedback {"token": ..., "rating": "up"|"down", "score": 1-5, "comment": ...}`."""
    try:
        body = await request.json()
    except ValueError:
        return JSONResponse({"error": 'The body must be JSON: {"token": "...", "rating": "up"}.'}, status_code=400)
    if not isinstance(body, dict):
        return JSONResponse({"error": 'The body must be a JSON object: {"token": "...", "rating": "up"}.'}, 400)
    try:
        execution = await feedback_from(records, body, request)
    except FeedbackError as error:
        return JSONResponse({"error": error.message}, status_code=error.status)
    return JSONResponse({"recorded": True, "token": execution.id, "tool": execution.tool})


async def _from_peers(records: Records, token: str) -> ExecutionRef | None:
    """Ask the other replicas to flush, then look `token` up until found or `PEER_WAIT` past a flush interval."""
    assert records.ask_peers_to_flush is not None
    await anyio.to_thread.run_sync(records.ask_peers_to_flush)
    with anyio.move_on_after(records.settings.flush_interval + PEER_WAIT):
        while (found := await anyio.to_thread.run_sync(records.store.execution, token)) is None:
            await anyio.sleep(PEER_POLL)
        return found
    return None
