"""What a request forwarded upstream carries in `_meta` (`gateway.relay`, `gateway.serving.passthrough`,
`gateway.upstreams.lean_calls`): the client's own keys, the upstream's protocol envelope, the log-level
opt-in, and a progress token only when the client asked for progress.

The upstream is `tests/servers/meta_server.py` (its tool answers with the `_meta` it received), as a
2026-07-28 stdio child and as a handshake-era one; the client is the SDK's, over stdio and HTTP, in
both protocol eras, and in memory.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest
from mcp import Client
from mcp.client.session import _make_handshake_stamp, _make_modern_stamp

from gateway.config.loader import load_config
from gateway.config.routing_settings import EmbeddingSettings, RoutingSettings
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.server_specs import specs_from_config
from gateway.serving.server import GatewayServer
from gateway.upstreams.lean_calls import LeanCalls, _Bound
from tests.conftest import NO_EMBEDDINGS, REPO, gateway_over_http, gateway_over_stdio, write_config

pytestmark = pytest.mark.anyio

META_SERVER = REPO / "tests" / "servers" / "meta_server.py"
LOG_LEVEL = "io.modelcontextprotocol/logLevel"
VERSION = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
PROGRESS = "progress_token"
"""How the upstream's SDK names `progressToken` once read."""
SERVERS = ("modern", "hand")
EVERY_TOOL = NO_EMBEDDINGS | {"GATEWAY_ROUTING__MODE": "all"}

Connect = Callable[..., AbstractAsyncContextManager[Client]]


def _config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          modern:
            command: {sys.executable}
            args: ["{META_SERVER}"]
          hand:
            command: {sys.executable}
            args: ["{META_SERVER}"]
            protocol: legacy
        """,
    )


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def connect(transport: str, mode: str, tmp_path: Path) -> Connect:
    opener = gateway_over_stdio if transport == "stdio" else gateway_over_http

    def open_client(**kwargs: Any) -> AbstractAsyncContextManager[Client]:
        return opener(_config(tmp_path), tmp_path, EVERY_TOOL, mode=mode, **kwargs)

    return open_client


@asynccontextmanager
async def in_memory(tmp_path: Path, mode: str) -> AsyncIterator[Client]:
    """The SDK's client on the gateway in process (the in-memory transport: progress is a callback)."""
    settings = Settings(
        data_dir=tmp_path / "data", embedding=EmbeddingSettings(enabled=False), routing=RoutingSettings(mode="all")
    )
    registry = Registry(specs_from_config(load_config(_config(tmp_path))), settings)
    async with registry.running():
        await registry.wait_settled(25)
        async with Client(GatewayServer(registry, settings).server, mode=mode) as client:  # type: ignore[arg-type]
            yield client


async def seen(client: Client, server: str, **options: Any) -> dict[str, Any]:
    """The `_meta` the upstream `server` received for one call."""
    arguments = {"report": True} if "progress_callback" in options else {}
    result = await client.call_tool(f"{server}__seen_meta", arguments, **options)
    assert not result.is_error, result
    return json.loads(result.content[0].text)  # type: ignore[union-attr,no-any-return]


async def check_progress_asked_only_when_wanted(client: Client) -> None:
    reports: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total, message))

    for server in SERVERS:
        assert PROGRESS not in await seen(client, server)
        reports.clear()
        assert PROGRESS in await seen(client, server, progress_callback=on_progress)
        assert reports == [(1, 1, "reported")]
        assert PROGRESS not in await seen(client, server)


async def test_the_upstream_is_asked_for_progress_only_when_the_client_asked(connect: Connect) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            await check_progress_asked_only_when_wanted(client)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_in_memory_the_progress_callback_decides_too(tmp_path: Path, mode: str) -> None:
    with anyio.fail_after(60):
        async with in_memory(tmp_path, mode) as client:
            await check_progress_asked_only_when_wanted(client)


async def test_the_clients_meta_and_the_upstreams_envelope_are_sent(connect: Connect, mode: str) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            for server in SERVERS:
                for _ in range(2):  # the envelope read once per upstream session is the same the second time
                    meta = await seen(client, server, meta={"trace": "abc"})
                    assert meta["trace"] == "abc"
                    if server == "modern":
                        assert meta[VERSION] == "2026-07-28"
                        assert meta[CLIENT_INFO]["name"] == "mcp-gateway"
                    else:
                        assert VERSION not in meta and CLIENT_INFO not in meta
                    # A handshake-era client that never sent logging/setLevel gets every level; a
                    # 2026-07-28 one only what its request opts in to.
                    assert meta.get(LOG_LEVEL) == ("debug" if mode == "legacy" else None)


async def test_a_2026_clients_log_opt_in_goes_upstream(tmp_path: Path, transport: str) -> None:
    opener = gateway_over_stdio if transport == "stdio" else gateway_over_http
    with anyio.fail_after(60):
        async with opener(_config(tmp_path), tmp_path, EVERY_TOOL, mode="auto") as client:
            for server in SERVERS:
                assert (await seen(client, server, meta={LOG_LEVEL: "warning"}))[LOG_LEVEL] == "warning"


def test_the_envelope_read_once_a_session_is_what_the_sdks_stamp_writes_on_each_request() -> None:
    info, capabilities = {"name": "mcp-gateway", "version": "1"}, {"sampling": {}}
    modern = [
        _make_modern_stamp("2026-07-28", info, capabilities, lambda name, arguments: {}, log_level=level)
        for level in (None, "info")
    ]
    metas: list[dict[str, Any] | None] = [None, {}, {"x": 1}, {LOG_LEVEL: "warning", "x": 1}, {VERSION: "1999-01-01"}]
    session = SimpleNamespace(_stamp=None)
    bound = _Bound(cast(Client, None), cast(LeanCalls, None))
    for stamp in [*modern, _make_handshake_stamp("2025-11-25")]:
        session._stamp = stamp  # a session that re-negotiates has a new stamp: read again
        for meta in metas:
            data: dict[str, Any] = {"method": "tools/call", "params": {"name": "t"}}
            if meta is not None:
                data["params"]["_meta"] = dict(meta)
            stamp(data, {})
            assert bound.stamped(session, None if meta is None else dict(meta)) == data["params"].get("_meta")
