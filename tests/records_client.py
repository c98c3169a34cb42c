"""Helpers of the records tests: a gateway in process with records on, and reading them back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.server import MCPServer

from gateway.config.routing_settings import EmbeddingSettings, RoutingSettings
from gateway.config.runtime_settings import RecordsSettings
from gateway.config.settings import Settings
from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.records.service import Records, open_store
from gateway.registry import Registry
from gateway.router.service import RouterService, build_router
from gateway.serving.server import GatewayServer
from gateway.upstreams.upstream import UpstreamSpec
from tests.servers.demo_server import create_server

SECRET = "hunter2-very-secret"
SLOW = 60.0
"""A flush interval no test waits for: what a test reads was flushed on demand or at shutdown."""


def vault_server() -> MCPServer:
    """A server whose tool takes secrets, nested, under several key spellings."""
    server = MCPServer("vault")

    @server.tool()
    def login(user: str, password: str, options: dict[str, Any]) -> str:
        """Log in (and say so)."""
        return f"welcome {user}"

    return server


def records_settings(**overrides: Any) -> RecordsSettings:
    return RecordsSettings(**({"flush_interval": SLOW} | overrides))


@asynccontextmanager
async def recorded_gateway(
    tmp_path: Path,
    *,
    records: RecordsSettings | None = None,
    database_url: str | None = None,
    mode: str = "all",
    search: bool = False,
) -> AsyncIterator[GatewayServer]:
    """A gateway in process with records on, in front of the demo server (`mem`) and `vault`."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        records=records or records_settings(),
        routing=RoutingSettings(mode=mode),  # type: ignore[arg-type]
        embedding=EmbeddingSettings(enabled=False),
    )
    specs = [
        UpstreamSpec(
            id="mem", prefix="mem", transport="memory", target=create_server("mem"), tool_timeouts={"sleep": 0.3}
        ),
        UpstreamSpec(id="vault", prefix="vault", transport="memory", target=vault_server(), secrets=(SECRET,)),
    ]
    registry = Registry(specs, settings)
    kept = Records(settings.records, open_store(settings), registry.redact)
    registry.record_calls(kept.recorder)
    with anyio.fail_after(60):
        async with registry.running(), kept.running():
            router = None
            if search:
                router = RouterService(registry, settings, lambda: build_router(settings, None))
                registry.task_group.start_soon(router.run)
            await registry.wait_settled()
            if router is not None:
                await router.complete.wait()
            yield GatewayServer(registry, settings, router, records=kept)


def records_of(gateway: GatewayServer) -> Records:
    assert gateway.records is not None
    return gateway.records


async def table(gateway: GatewayServer, name: str) -> list[dict[str, Any]]:
    """Every row of a records table, after writing what is buffered."""
    records = records_of(gateway)
    await records.flush()
    names, rows = await anyio.to_thread.run_sync(records.store.rows, name)
    return [dict(zip(names, row, strict=True)) for row in rows]


def token_of(result: types.CallToolResult) -> str:
    token = (result.meta or {}).get(FEEDBACK_TOKEN_META_KEY)
    assert isinstance(token, str) and len(token) == 32
    return token


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def check_usage_signals(gw: GatewayServer, client: Client) -> None:
    """Shared by both backends: a search, a tied success rated down, a failure by name scored 4."""
    records = records_of(gw)
    await client.call_tool("search_tools", {"query": "add two integers", "limit": 3})
    tied = await client.call_tool("call_tool", {"name": "mem__add", "arguments": {"a": 1, "b": 2}})
    failed = await client.call_tool("mem__fail", {"message": "no"})
    await client.call_tool("mem__add", {"a": "one", "b": 2})  # invalid: never reached mem, teaches nothing
    await client.call_tool("mem__nope", {})  # refused: no such tool, teaches nothing
    await client.call_tool("submit_feedback", {"token": token_of(tied), "rating": "down"})
    await client.call_tool("submit_feedback", {"token": token_of(failed), "score": 4})
    await records.flush()
    signals = await records.store.usage_signals()
    assert [(s.query, s.tool, s.value, s.kind) for s in signals] == [
        ("add two integers", "mem__add", 1.0, "call"),
        (None, "mem__fail", -1.0, "call"),
        ("add two integers", "mem__add", -1.0, "feedback"),
        (None, "mem__fail", 0.5, "feedback"),
    ]
    assert [s.at for s in signals] == sorted(s.at for s in signals)
    later = await records.store.usage_signals(since=signals[2].at)
    assert [s.kind for s in later] == ["feedback", "feedback"]


async def check_cut_records(gw: GatewayServer, client: Client) -> None:
    """Shared by both backends: a 100 kB argument echoed back, and a 2 MiB one refused by the limits."""
    text = "ab" * 50_000
    echoed = await client.call_tool("mem__echo", {"text": text})
    refused = await client.call_tool("mem__echo", {"text": "x" * (2 * 1024 * 1024)})  # over max_argument_bytes
    rows = {row["id"]: row for row in await table(gw, "executions")}
    limit = records_of(gw).settings.max_argument_bytes
    row = rows[token_of(echoed)]
    assert len(row["arguments"].encode()) <= limit
    stored = json.loads(row["arguments"])
    assert stored["_truncated"] is True and stored["original_bytes"] == len(f'{{"text":"{text}"}}')
    assert stored["preview"].startswith('{"text":"abab') and len(stored["preview"]) > limit - 100
    summary = row["response_summary"]
    assert summary.startswith("abab") and summary.endswith("…") and len(summary.encode()) <= limit
    assert row["response_size"] > 2 * len(text)  # the text twice: a content block and the structured result
    refused_row = rows[token_of(refused)]
    assert refused.is_error and refused_row["error_code"] == "invalid_arguments" and refused_row["attempts"] == 0
    assert json.loads(refused_row["arguments"]) == {
        "_truncated": True,
        "original_bytes": 2 * 1024 * 1024 + len('{"text":""}'),
        "names": ["text"],
    }
