"""Log lines as JSON (`GATEWAY_LOG_FORMAT=json`): one object per line, which a log pipeline reads
without parsing text, joined to traces by their ids.

Each object has `timestamp` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`,
and where known `trace_id`, `span_id` (the current OpenTelemetry span: tracing on, or a client's
trace context attached), `replica` (`GATEWAY_REPLICA_ID`), `server` and `tool` (the tool call
being made, `call_context`), and `exception` (the formatted traceback).
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.observability.tracing import current_ids

__all__ = ["JsonFormatter", "call_context", "current_call"]

_CALL: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("mcp_gateway_call", default=None)


@contextmanager
def call_context(server: str, tool: str) -> Iterator[None]:
    """Within the block, log lines name this server and (exposed) tool."""
    token = _CALL.set((server, tool))
    try:
        yield
    finally:
        _CALL.reset(token)


def current_call() -> tuple[str, str] | None:
    """`(server, tool)` of the tool call being made in this context, if any."""
    return _CALL.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module's docstring for the fields."""

    def __init__(self, replica: str | None = None) -> None:
        super().__init__()
        self.replica = replica
        """The replica id (`GATEWAY_REPLICA_ID`) on every line, when given."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        line: dict[str, object] = {
            "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.replica is not None:
            line["replica"] = self.replica
        ids = current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        call = _CALL.get()
        if call is not None:
            line["server"], line["tool"] = call
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)
