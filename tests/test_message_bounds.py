"""One upstream message bounded while it is read (`gateway.upstreams.message_bounds`, issue 33).

A real gateway in front of real servers (`tests/servers/big_server.py`: stdio with the id first
or last, streamable HTTP answering JSON with Content-Length, chunked JSON, or SSE) whose answer
is over `upstreams.max_message_bytes`: the call gets a `result_too_large` tool error naming the
server, the tool, the size and the setting, and the next calls on the same server work.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.errors import ERROR_META_KEY
from gateway.upstreams.message_bounds import LineBuffer, message_id, too_large_error
from tests.conftest import NO_EMBEDDINGS, REPO, gateway_over_stdio, start_script_http, stop_process, write_config

BIG_SERVER = REPO / "tests" / "servers" / "big_server.py"
LIMIT = 1024 * 1024


def test_the_id_is_read_from_either_end_of_a_message_only_at_its_top_level() -> None:
    assert message_id(b'{"jsonrpc":"2.0","id":7,"result":{"content":') == 7
    assert message_id(b'{"id": "a\\"b", "jsonrpc": "2.0"') == 'a"b'
    assert message_id(b'{"result":{"x', b'xx"}]},"jsonrpc":"2.0","id":12}\n') == 12
    assert message_id(b'{"result":{"x', b'xx","id":3}}') is None  # a nested id is not the message's
    assert message_id(b'{"jsonrpc":"2.0","method":"notifications/progress"', b'"total":1}}') is None


def test_a_line_over_the_limit_is_replaced_by_an_error_and_the_next_line_is_whole() -> None:
    lines = LineBuffer(100)
    assert lines.feed(b'{"a":1}\n{"jsonrpc":"2.0","id":4,"result":"') == [b'{"a":1}']
    assert lines.feed(b"x" * 150) == []
    out = lines.feed(b'x"}\n{"b"')
    assert out == [too_large_error(4, 187, True, 100)]
    assert lines.feed(b":2}\n") == [b'{"b":2}']
    assert LineBuffer(10).feed(b'{"result":"' + b"y" * 20 + b'"}\n') == [None]  # no id to answer


@pytest.mark.anyio
async def test_an_answer_over_the_limit_is_a_clear_tool_error_and_the_server_stays_usable(tmp_path: Path) -> None:
    servers = {
        mode: start_script_http([str(BIG_SERVER), "--port", "0", "--mode", mode]) for mode in ("json", "chunked", "sse")
    }
    try:
        config = write_config(
            tmp_path / "gw.yaml",
            "mcps:\n"
            + "".join(f"  {mode}:\n    url: {url}\n" for mode, (_, url) in servers.items())
            + f"  first:\n    command: {sys.executable}\n    args: ['{BIG_SERVER}']\n"
            + f"  last:\n    command: {sys.executable}\n    args: ['{BIG_SERVER}', '--id-last']\n",
        )
        env = NO_EMBEDDINGS | {"GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES": str(LIMIT)}
        async with gateway_over_stdio(config, tmp_path, env) as client:
            for server in ("json", "chunked", "sse", "first", "last"):
                dropped = await client.call_tool(f"{server}__big", {"size": 3 * LIMIT})
                assert dropped.is_error, server
                meta = (dropped.meta or {})[ERROR_META_KEY]
                assert meta["code"] == "result_too_large" and meta["server"] == server and meta["limit"] == LIMIT
                text = dropped.content[0].text  # type: ignore[union-attr]
                assert f"Server {server!r}" in text and f"'{server}__big'" in text, text
                assert "GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES" in text and f"{LIMIT:,}" in text, text
                assert meta["bytes"] > LIMIT
                if server in (
                    "json",
                    "first",
                    "last",
                ):  # the whole size is known: Content-Length, a line read to its end
                    assert meta["bytes"] > 3 * LIMIT and f"{meta['bytes']:,} bytes" in text
                fits = await client.call_tool(f"{server}__big", {"size": LIMIT // 2})
                assert not fits.is_error and len(fits.content[0].text) == LIMIT // 2, server  # type: ignore[union-attr]
                echoed = await client.call_tool(f"{server}__echo", {"text": "still here"})
                assert echoed.content[0].text == "still here", server  # type: ignore[union-attr]
    finally:
        for process, _ in servers.values():
            stop_process(process)
