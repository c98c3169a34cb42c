"""Exposure modes (all, search, dynamic), the gateway's search tools, `POST /route` and `search`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client

from gateway.config.routing_settings import RoutingSettings
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.router.service import RouterService, build_router
from gateway.serving.exposure import resolve_mode
from gateway.serving.server import GatewayServer
from gateway.upstreams.upstream import UpstreamSpec
from tests.conftest import REPO, gateway_env, start_gateway_http, stop_process, write_config
from tests.servers.demo_server import create_server

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def gateway(tmp_path: Path, **routing: Any) -> AsyncIterator[GatewayServer]:
    """A gateway in process in front of the demo server (in memory), with its router indexed."""
    settings = Settings(data_dir=tmp_path / "data", routing=RoutingSettings(**routing))
    upstream = UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"))
    registry = Registry([upstream], settings)
    async with registry.running():
        router = RouterService(registry, settings, lambda: build_router(settings, None))
        registry.task_group.start_soon(router.run)
        await registry.wait_settled()
        with anyio.fail_after(60):
            await router.complete.wait()
        yield GatewayServer(registry, settings, router)


async def test_the_router_is_complete_once_semantic_with_every_full_text_embedded(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        router = gw.router.router
        assert router is not None and router.dense  # not the first, lexical index
        assert len(router) > 0 and router.pending_documents == 0


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_all_mode_lists_every_tool_and_no_gateway_tools(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, Client(gw.server) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "mem__add" in names and "mem__echo" in names
        assert "search_tools" not in names and "call_tool" not in names


async def test_search_mode_lists_the_gateway_tools_and_the_pinned_ones_only(tmp_path: Path) -> None:
    pinned = ["mem__echo", "mem__missing"]
    async with gateway(tmp_path, mode="search", pinned=pinned) as gw, Client(gw.server) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == ["search_tools", "call_tool", "mem__echo"]


async def test_search_tools_ranks_the_right_tool_first_with_scores_in_0_to_1(tmp_path: Path) -> None:
    async with gateway(tmp_path, mode="search") as gw, Client(gw.server) as client:
        result = await client.call_tool("search_tools", {"query": "add two integers together", "limit": 3})
        assert not result.is_error
        found = (result.structured_content or {})["tools"]
        assert [t["name"] for t in found][0] == "mem__add"
        assert len(found) <= 3
        assert all(0.0 <= t["score"] <= 1.0 for t in found)
        assert [t["score"] for t in found] == sorted((t["score"] for t in found), reverse=True)
        assert found[0]["inputSchema"]["required"] == ["a", "b"]
        again = await client.call_tool("search_tools", {"query": "add two integers together", "limit": 3})
        assert again.structured_content == result.structured_content


async def test_call_tool_calls_a_found_tool_through_the_normal_path(tmp_path: Path) -> None:
    async with gateway(tmp_path, mode="search") as gw, Client(gw.server) as client:
        result = await client.call_tool("call_tool", {"name": "mem__add", "arguments": {"a": 40, "b": 2}})
        assert result.structured_content == {"result": 42}
        missing = await client.call_tool("call_tool", {"name": "mem__nope", "arguments": {}})
        assert missing.is_error and (missing.meta or {})["mcp-gateway/error"]["code"] == "tool_not_found"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"query": ""}, "non-empty string"),
        ({"query": "   "}, "non-empty string"),
        ({}, "needs `query`"),
        ({"query": "x", "limit": 0}, "from 1 to 50"),
        ({"query": "x", "limit": 51}, "from 1 to 50"),
        ({"query": "x", "limit": "5"}, "from 1 to 50"),
        ({"query": "x", "top": 3}, "unknown argument(s): top"),
    ],
)
async def test_search_tools_rejects_bad_input_naming_the_parameter(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    async with gateway(tmp_path, mode="search") as gw, Client(gw.server) as client:
        result = await client.call_tool("search_tools", arguments)
        assert result.is_error
        assert message in _text(result)
        assert (result.meta or {})["mcp-gateway/error"]["code"] == "invalid_arguments"


async def test_dynamic_mode_adds_found_tools_to_the_session_and_says_so(tmp_path: Path) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with gateway(tmp_path, mode="dynamic", dynamic_max_tools=2) as gw:
        async with Client(gw.server, mode="legacy", message_handler=on_message) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["search_tools", "call_tool"]
            await client.call_tool("search_tools", {"query": "add two integers", "limit": 1})
            with anyio.fail_after(10):
                await changed.wait()
            assert [t.name for t in (await client.list_tools()).tools] == ["search_tools", "call_tool", "mem__add"]
            await client.call_tool("search_tools", {"query": "echo the text back", "limit": 1})
            await client.call_tool("search_tools", {"query": "sleep for some seconds", "limit": 1})
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["search_tools", "call_tool", "mem__echo", "mem__sleep"]
        async with Client(gw.server, mode="legacy") as other:
            assert [t.name for t in (await other.list_tools()).tools] == ["search_tools", "call_tool"]


async def test_search_tools_answers_no_tool_fits_with_the_closest_tools_as_hints(tmp_path: Path) -> None:
    async with gateway(tmp_path, mode="dynamic") as gw, Client(gw.server, mode="legacy") as client:
        result = await client.call_tool("search_tools", {"query": "turn off the coffee maker", "limit": 2})
        assert not result.is_error
        assert _text(result).startswith("No tool fits this request. The closest tools, as hints only:")
        structured = result.structured_content
        assert structured is not None and structured["no_tool_fits"] is True and structured["tools"] == []
        assert len(structured["hints"]) == 2
        assert all(hint["score"] < gw.settings.routing.no_fit_threshold for hint in structured["hints"])
        # hints are not matches: the session's list does not grow with them
        assert [t.name for t in (await client.list_tools()).tools] == ["search_tools", "call_tool"]
        fitting = await client.call_tool("search_tools", {"query": "add two integers", "limit": 1})
        assert fitting.structured_content is not None and "no_tool_fits" not in fitting.structured_content


def test_auto_mode_shows_a_small_catalog_whole_and_a_large_one_through_search() -> None:
    assert RoutingSettings().mode == "auto" and RoutingSettings().auto_max_tools == 40
    assert resolve_mode("auto", 40, 40) == "all"
    assert resolve_mode("auto", 41, 40) == "dynamic"
    assert resolve_mode("search", 3, 40) == "search" and resolve_mode("all", 400, 40) == "all"


async def test_auto_switches_from_all_to_dynamic_when_a_server_pushes_the_catalog_past_the_threshold(
    tmp_path: Path,
) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with gateway(tmp_path) as gw:
        assert gw.settings.routing.mode == "auto"
        tools = len(gw.registry.catalog.tools)
        gw.settings.routing.auto_max_tools = tools  # the demo server's tools fill the threshold exactly
        async with Client(gw.server, mode="legacy", message_handler=on_message) as client:
            listed = [t.name for t in (await client.list_tools()).tools]
            assert len(listed) == tools and "search_tools" not in listed
            await client.call_tool("mem__grow", {})  # the server adds a tool and says so
            with anyio.fail_after(10):
                await changed.wait()
            assert [t.name for t in (await client.list_tools()).tools] == ["search_tools", "call_tool"]
            found = await client.call_tool("search_tools", {"query": "add two integers", "limit": 1})
            assert not found.is_error  # and dynamic: the found tool joins the list
            assert "mem__add" in {t.name for t in (await client.list_tools()).tools}


def _http_config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "gw.yaml", "mcps: {}\n")


async def test_route_returns_the_top_k_in_mcp_and_openai_form_with_pinned_tools(tmp_path: Path) -> None:
    env = {"GATEWAY_ROUTING__PINNED": '["mem__echo"]'}
    process, url = start_gateway_http(_http_config(tmp_path), tmp_path, env)
    route = url.removesuffix("/mcp") + "/route"
    try:
        with anyio.fail_after(60):
            response = httpx2.post(route, json={"query": "add two integers", "k": 2}, timeout=30)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["k"] == 2 and body["tools"][0]["name"] == "mem__add"
        assert body["tools"][0]["inputSchema"]["required"] == ["a", "b"]
        assert 0.0 <= body["tools"][0]["score"] <= 1.0 and body["tools"][0]["pinned"] is False
        assert body["tools"][-1]["name"] == "mem__echo" and body["tools"][-1]["pinned"] is True
        assert body["openai"][0] == {
            "type": "function",
            "function": {
                "name": "mem__add",
                "description": "Add two integers.",
                "parameters": body["tools"][0]["inputSchema"],
            },
        }
        assert "no_tool_fits" not in body
        unfit = httpx2.post(route, json={"query": "turn off the coffee maker", "k": 2}, timeout=30).json()
        assert unfit["no_tool_fits"] is True and unfit["message"] == "No tool fits this request."
        assert [t["name"] for t in unfit["tools"]] == ["mem__echo"]  # the pinned tool alone is offered
        assert len(unfit["hints"]) == 2 and unfit["hints"][0]["score"] < 0.17
        for bad in ({"query": ""}, {"query": "x", "k": 0}, {"query": "x", "k": 99}, {"q": "x"}, [1, 2]):
            refused = httpx2.post(route, json=bad, timeout=30)
            assert refused.status_code == 400 and refused.json()["error"]
        foreign = httpx2.post(route, json={"query": "x"}, headers={"Origin": "http://evil.example.com"}, timeout=30)
        assert foreign.status_code == 403
    finally:
        stop_process(process)


def _peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


async def test_a_1_mb_request_is_cut_to_max_query_chars_before_it_is_ranked(tmp_path: Path) -> None:
    """`POST /route` and `search_tools` with a 1 MB request (under the 4 MiB body limit), while a real SDK
    client keeps calling: the request is cut before any work, it is ranked, and the memory stays bounded."""
    huge = "please add two integers for me " * 34_000  # 1.05 MB
    process, url = start_gateway_http(_http_config(tmp_path), tmp_path, {"GATEWAY_ROUTING__MODE": "search"})
    route = url.removesuffix("/mcp") + "/route"
    try:
        with anyio.fail_after(120):
            async with Client(url) as client, httpx2.AsyncClient(timeout=60) as http:
                assert not (await client.call_tool("search_tools", {"query": "add two integers"})).is_error
                baseline = _peak_rss_mb(process.pid)
                for _ in range(3):
                    response = await http.post(route, json={"query": huge, "k": 2})
                    assert response.status_code == 200, response.text
                    body = response.json()
                    assert len(body["query"]) <= 4_000 and huge.startswith(body["query"])
                    assert body["tools"][0]["name"] == "mem__add"
                    found = await client.call_tool("search_tools", {"query": huge, "limit": 2})
                    assert (found.structured_content or {})["tools"][0]["name"] == "mem__add"
                grown = _peak_rss_mb(process.pid) - baseline
    finally:
        stop_process(process)
    assert grown < 300, f"peak RSS grew by {grown:.0f} MB"


async def test_an_http_client_may_ask_for_another_mode_on_the_url_but_not_an_unknown_one(tmp_path: Path) -> None:
    process, url = start_gateway_http(_http_config(tmp_path), tmp_path)
    try:
        with anyio.fail_after(60):
            async with Client(url + "?mode=search") as client:  # records are on: feedback is a gateway tool too
                names = [t.name for t in (await client.list_tools()).tools]
                assert names == ["search_tools", "call_tool", "submit_feedback"]
            async with Client(url) as client:
                assert "mem__add" in {t.name for t in (await client.list_tools()).tools}
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}
        for query in ("?mode=serach", "?mode=search&mode=foo", "?mode="):
            refused = httpx2.post(url + query, json=initialize, headers=headers, timeout=30)
            assert refused.status_code == 400, query
            assert "use one of auto, all, search, dynamic" in refused.json()["error"]
        assert "'serach'" in httpx2.post(url + "?mode=serach", json=initialize, headers=headers, timeout=30).text
    finally:
        stop_process(process)


def test_the_search_command_prints_ranked_tools(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(_http_config(tmp_path)), "search", "add two integers"]
        + ["--k", "3", "--json"],
        capture_output=True,
        text=True,
        env=gateway_env(tmp_path),
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    ranked = json.loads(result.stdout)
    assert ranked[0]["name"] == "mem__add" and len(ranked) == 3
