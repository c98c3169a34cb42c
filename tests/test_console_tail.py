"""The console's live tail (`gateway.serving.admin.tail`): fed by the records' recorder on a gateway in
process with real in-memory servers and the SDK's client; bounded, and lossy only for a slow subscriber."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from gateway.serving.admin.tail import CallTail, TailFilter, event_stream
from tests.records_client import recorded_gateway, token_of

pytestmark = pytest.mark.anyio


def publish(tail: CallTail, n: int, *, server: str = "mem", status: str = "ok") -> None:
    for i in range(n):
        tail.publish(f"{i:032x}", 1.0, server, f"{server}__tool", status, None, 1.0, None)


async def test_every_call_the_recorder_sees_is_published_with_its_status_refused_ones_too(tmp_path: Path) -> None:
    tail = CallTail()
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        assert gw.records is not None
        tail.attach(gw.records)
        with tail.subscribe() as events:
            ok = await client.call_tool("mem__add", {"a": 2, "b": 3})
            failed = await client.call_tool("mem__fail", {"message": "it broke"})
            refused = await client.call_tool("mem__no_such_tool", {})
            with anyio.fail_after(5):
                seen = [await events.receive() for _ in range(3)]
    assert [(e.id, e.tool, e.status, e.code) for e in seen] == [
        (token_of(ok), "mem__add", "ok", None),
        (token_of(failed), "mem__fail", "error", "tool_error"),
        (token_of(refused), "mem__no_such_tool", "refused", "tool_not_found"),
    ]
    assert [e.seq for e in seen] == [1, 2, 3] and seen[0].latency_ms > 0
    assert list(tail.since(1)) == seen[1:]


async def test_a_slow_subscriber_loses_events_instead_of_holding_up_the_publisher() -> None:
    tail = CallTail(history=3, buffer=2)
    with tail.subscribe() as slow:
        publish(tail, 5)  # returns at once although nobody reads
        assert tail.dropped == 3
        assert [slow.receive_nowait().seq for _ in range(2)] == [1, 2]
    assert tail.subscribers == 0
    assert [e.seq for e in tail.recent] == [3, 4, 5], "the history is bounded"


def test_the_tail_filter_matches_server_tool_part_and_status_as_the_call_log_does() -> None:
    tail = CallTail()
    publish(tail, 1, server="a")
    publish(tail, 1, server="b", status="timeout")
    a, b = tail.recent
    assert TailFilter(server="a").matches(a) and not TailFilter(server="a").matches(b)
    assert TailFilter(tool="__to").matches(b)
    assert TailFilter(status="error").matches(b), "a timeout is an error, as in the call log"
    assert not TailFilter(status="ok").matches(b) and TailFilter().matches(b)


async def test_closing_the_tail_ends_every_open_stream_and_any_opened_later() -> None:
    """What `serve` does as it stops: an open Calls page must not hold up uvicorn's shutdown."""
    tail = CallTail()
    publish(tail, 2)
    stream = event_stream(tail, TailFilter(), 0, anyio.current_time)
    assert await anext(stream) == "retry: 1000\n\n"
    backlog = await anext(stream)
    assert backlog.count("data: ") == 2 and backlog.startswith("id: 1\n")
    tail.close()
    with anyio.fail_after(5):
        assert [chunk async for chunk in stream] == []
    with tail.subscribe() as later, pytest.raises(anyio.EndOfStream):
        await later.receive()
