"""An SSE answer that httpx2's route reads (an OAuth server's, or after a redirect: what the lean
direct read does not take) keeps its connection: the stream's end, which comes after the answer's
event, is read in the background (`gateway.upstreams.transports._FinishedLater`).

Real servers on 127.0.0.1 that count the connections they accept: a hand-written one (its answers
written in pieces), and the wire server (`tests/servers/wire_server.py`, answering with SSE) behind
a counting relay, called through the gateway's registry with the lean calls on and off.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from gateway.upstreams import lean_http
from gateway.upstreams.lean_post import HttpLean
from gateway.upstreams.message_bounds import bound_responses
from gateway.upstreams.transports import upstream_http_client
from tests.test_lean_upstream import gateway, outcome, posts_served, wire_entry

pytestmark = pytest.mark.anyio

CALLS = 5
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Bearer(httpx2.Auth):
    """An `Auth` flow on the client (as an OAuth server's tokens are): the lean direct read is off."""

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = "Bearer t"
        yield request


@asynccontextmanager
async def sse_server(ended: bool = True) -> AsyncIterator[tuple[str, list[int]]]:
    """Answers every POST with an SSE answer to its request: the answer's event, then (when `ended`)
    the stream's end in a later write. Yields its URL and a list counting its connections."""

    async def reply(sent: Any, writer: asyncio.StreamWriter) -> bool:
        answer = {"jsonrpc": "2.0", "id": sent["id"], "result": {"content": [], "n": sent["id"]}}
        writer.write(SSE_HEAD + _chunk(b"event: message\ndata: %s\n\n" % json.dumps(answer).encode()))
        await writer.drain()
        await asyncio.sleep(0)  # the end in a later packet
        if ended:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return False

    async with posts_served(reply) as served:
        yield served


async def _finished() -> None:
    """Until no answer's end is being read in the background (so a call finds its connection idle)."""
    while any(getattr(task.get_coro(), "__qualname__", "") == "Body._finish" for task in asyncio.all_tasks()):
        await asyncio.sleep(0.01)


async def _calls_through_httpx2(url: str, calls: int) -> list[Any]:
    """`calls` lean requests through the gateway's httpx2 client with an `Auth` flow (httpx2's route)."""
    http = bound_responses(upstream_http_client(url, {}, _Bearer(), "lean", "sse"), 64 * 1024, "sse")
    lean = HttpLean(url)
    lean.attach(http)
    found = []
    async with http:
        for n in range(calls):
            message = {"jsonrpc": "2.0", "id": f"gw-{n}", "method": "tools/call", "params": {"name": "t"}}
            found.append(await lean.exchange(f"gw-{n}", message, {}, None))
            await _finished()
    return found


async def test_sse_answers_through_httpx2_keep_their_connection() -> None:
    with anyio.fail_after(20):
        async with sse_server() as (url, connections):
            found = await _calls_through_httpx2(url, CALLS)
    assert found == [{"content": [], "n": f"gw-{n}"} for n in range(CALLS)]
    assert connections == [1]


async def test_an_sse_answer_whose_stream_stays_open_drops_its_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean_http, "FINISH_SECONDS", 0.2)
    with anyio.fail_after(20):
        async with sse_server(ended=False) as (url, connections):
            found = await _calls_through_httpx2(url, 3)
    assert found == [{"content": [], "n": f"gw-{n}"} for n in range(3)]
    assert connections == [3]  # not ended within FINISH_SECONDS: each dropped


@asynccontextmanager
async def counting_relay(url: str) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP relay to `url`'s server on 127.0.0.1; yields its URL (same path) and a list counting the
    connections it accepted."""
    target = httpx2.URL(url)
    accepted = [0]

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(target.host, target.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{target.path}", accepted


@pytest.mark.parametrize("lean", [True, False], ids=["lean-calls", "sdk"])
async def test_calls_to_an_sse_server_behind_a_redirect_keep_their_connection(tmp_path: Path, lean: bool) -> None:
    """The URL's trailing slash is redirected (307) to the server's `/mcp`: the lean calls go
    through httpx2 from then on, as the SDK's client always does."""
    with wire_entry("sse", tmp_path / "wire.log") as entry:
        url = re.search(r"url: (\S+)", entry)
        assert url is not None
        async with counting_relay(url.group(1)) as (relayed, accepted):
            entry = entry.replace(url.group(1), relayed + "/")
            with anyio.fail_after(60):
                async with gateway(tmp_path, entry, lean) as registry:
                    await _finished()
                    before = accepted[0]
                    found = []
                    for n in range(CALLS):
                        found.append(await outcome(registry, "text", {"who": f"call {n}"}))
                        await _finished()
                    opened = accepted[0] - before
    assert [item["content"][0]["text"] for item in found] == [f"hello call {n}" for n in range(CALLS)], found
    assert opened == 0
