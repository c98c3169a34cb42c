"""The bundled demo's obvious requests route to the right tool, and `mcp-gateway search`, `POST /route`
and `search_tools` give one verdict on whether any tool fits (issue 30, item 4).

The gateway serves the example config (`external-mcps.yaml`: clock, notes, sql with its demo shop,
openapi with the GitHub example) over streamable HTTP in this process, with the bundled model and the
default `no_fit_threshold` (chosen on the dev sets, never on these requests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from gateway.cli.common import load
from gateway.config.routing_settings import RoutingSettings
from gateway.config.runtime_settings import PluginSettings
from gateway.config.settings import Settings
from gateway.router.service import RouterService, build_router
from gateway.serving.http import bind_socket, serve_http
from gateway.serving.server import GatewayServer
from tests.conftest import REPO, gateway_env

pytestmark = pytest.mark.anyio

EXAMPLE = REPO / "external-mcps.yaml"

REQUESTS = [
    ("how many customers per country", "sql__execute_sql"),  # counts per group
    ("what tables are in the database", "sql__describe_schema"),  # a schema question
    ("find my note about the meeting", "notes__search_notes"),  # a note search
]
INFEASIBLE = "book a flight to Tokyo"


def cli_search(query: str, data_dir: Path, tmp_path: Path) -> list[dict[str, Any]]:
    env = gateway_env(tmp_path, plugins_dir=REPO / "plugins") | {"GATEWAY_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(EXAMPLE), "search", query, "--k", "3", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


async def test_the_demos_obvious_requests_route_to_the_right_tool_with_one_verdict_everywhere(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    settings = Settings(
        config=EXAMPLE,
        data_dir=data_dir,
        routing=RoutingSettings(mode="search"),
        plugins=PluginSettings(directory=REPO / "plugins", entry_points=False),
    )
    assert settings.routing.no_fit_threshold == RoutingSettings().no_fit_threshold  # the default, untuned
    _, registry, pm, _ = load(settings, serving=True)
    answers: dict[str, dict[str, Any]] = {}
    with anyio.fail_after(240):
        async with registry.running():
            service = RouterService(registry, settings, lambda: build_router(settings, pm))
            registry.task_group.start_soon(service.run)
            await registry.wait_settled()
            await service.complete.wait()  # the bundled model, with every tool's full text
            assert service.status == "embeddings + BM25"
            gateway = GatewayServer(registry, settings, service)
            stop, stopped, port = anyio.Event(), anyio.Event(), []

            async def serve() -> None:
                with bind_socket("127.0.0.1", 0) as sock:
                    await serve_http(gateway, settings, sock, stop=stop, ready=port.append)
                stopped.set()

            registry.task_group.start_soon(serve)
            while not port:
                await anyio.sleep(0.02)  # serve_http reports its port once uvicorn listens
            base = f"http://127.0.0.1:{port[0]}"
            async with httpx2.AsyncClient(trust_env=False) as http, Client(f"{base}/mcp") as client:
                for query in [q for q, _ in REQUESTS] + [INFEASIBLE]:
                    routed = (await http.post(f"{base}/route", json={"query": query, "k": 3}, timeout=60)).json()
                    searched = await client.call_tool("search_tools", {"query": query, "limit": 3})
                    assert not searched.is_error
                    answers[query] = {"route": routed, "search_tools": searched.structured_content or {}}
            stop.set()
            await stopped.wait()
            registry.task_group.cancel_scope.cancel()

    for query, expected in REQUESTS:
        route, tools = answers[query]["route"], answers[query]["search_tools"]
        assert "no_tool_fits" not in route, (query, route.get("hints"))
        assert route["tools"][0]["name"] == expected, (query, [t["name"] for t in route["tools"]])
        assert tools["tools"][0]["name"] == expected and "no_tool_fits" not in tools
    unfit = answers[INFEASIBLE]
    assert unfit["route"]["no_tool_fits"] is True and unfit["route"]["tools"] == []
    assert unfit["search_tools"]["no_tool_fits"] is True

    # the shell says the same, from the same data dir (its embedding cache: nothing embedded again)
    for query, expected in REQUESTS:
        ranked = cli_search(query, data_dir, tmp_path)
        assert ranked[0]["name"] == expected and not any(hit.get("hint") for hit in ranked)
        assert [h["name"] for h in ranked] == [t["name"] for t in answers[query]["route"]["tools"]]
    hints = cli_search(INFEASIBLE, data_dir, tmp_path)
    assert hints and all(hit["hint"] is True for hit in hints)
    assert [h["name"] for h in hints] == [t["name"] for t in answers[INFEASIBLE]["route"]["hints"]]
