"""Prometheus metrics: what calls and searches count, states read at scrape time, and `GET /metrics`
over real HTTP with and without authentication."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from gateway.config.routing_settings import EmbeddingSettings, RoutingSettings
from gateway.config.settings import Settings
from gateway.observability.metrics import GatewayMetrics
from gateway.registry import Registry
from gateway.router.service import RouterService, build_router
from gateway.security.auth import hash_key, new_key
from gateway.serving.server import GatewayServer
from gateway.upstreams.upstream import UpstreamSpec
from tests.conftest import start_gateway_http, stop_process, write_config
from tests.prometheus import samples, value
from tests.servers.demo_server import create_server

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayServer]:
    """A gateway in process before the demo server (in memory, 0.5 s timeout), its router on BM25."""
    settings = Settings(
        data_dir=tmp_path / "data", routing=RoutingSettings(mode="search"), embedding=EmbeddingSettings(enabled=False)
    )
    spec = UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"), timeout=0.5)
    registry = Registry([spec], settings)
    with anyio.fail_after(30):
        async with registry.running():
            router = RouterService(registry, settings, lambda: build_router(settings, None))
            registry.task_group.start_soon(router.run)
            await registry.wait_settled()
            await router.complete.wait()
            yield GatewayServer(registry, settings, router)


async def test_calls_are_counted_by_server_tool_and_status_with_errors_by_code_class_and_latency(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as gw, Client(gw.server) as client:
        for _ in range(2):
            assert not (
                await client.call_tool("call_tool", {"name": "mem__add", "arguments": {"a": 1, "b": 2}})
            ).is_error
        assert (await client.call_tool("call_tool", {"name": "mem__fail", "arguments": {"message": "no"}})).is_error
        bad = await client.call_tool("call_tool", {"name": "mem__add", "arguments": {"a": "x", "b": 2}})
        assert bad.is_error
        slow = await client.call_tool("call_tool", {"name": "mem__sleep", "arguments": {"seconds": 5}})
        assert slow.is_error
        assert (await client.call_tool("call_tool", {"name": "nonexistent__tool", "arguments": {}})).is_error
        found = samples(gw.registry.metrics.exposition().decode())

    calls = "mcp_gateway_tool_calls_total"
    assert value(found, calls, server="mem", tool="mem__add", status="success") == 2
    assert value(found, calls, server="mem", tool="mem__add", status="error") == 1
    assert value(found, calls, server="mem", tool="mem__fail", status="error") == 1
    assert value(found, calls, server="mem", tool="mem__sleep", status="timeout") == 1
    errors = "mcp_gateway_tool_call_errors_total"
    upstream, caller = {"class": "upstream"}, {"class": "caller"}  # whose failure: the server's, the caller's
    assert value(found, errors, server="mem", code="tool_error", **upstream) == 1
    assert value(found, errors, server="mem", code="invalid_arguments", **caller) == 1
    assert value(found, errors, server="mem", code="upstream_timeout", **upstream) == 1
    assert value(found, errors, server="(no server)", code="tool_not_found", **caller) == 1
    assert value(found, calls, server="(no server)", tool="nonexistent__tool", status="error") == 1
    assert not [key for key in found if ("server", "") in key[1]], "no series with an empty server name"
    assert value(found, "mcp_gateway_tool_call_duration_seconds_count", server="mem") == 5
    assert value(found, "mcp_gateway_tool_call_duration_seconds_bucket", server="mem", le="0.25") == 4
    assert value(found, "mcp_gateway_tool_calls_in_flight", server="mem") == 0


async def test_a_call_in_flight_is_seen_while_it_runs(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, Client(gw.server) as client:

        def in_flight() -> float | None:
            found = samples(gw.registry.metrics.exposition().decode())
            return value(found, "mcp_gateway_tool_calls_in_flight", server="mem")

        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "call_tool", {"name": "mem__sleep", "arguments": {"seconds": 0.3}})
            with anyio.fail_after(5):
                while in_flight() != 1:
                    await anyio.sleep(0.01)
        assert in_flight() == 0


async def test_searches_are_counted_with_their_latency(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, Client(gw.server) as client:
        for query in ("add two numbers", "echo text back", "sleep a while"):
            assert not (await client.call_tool("search_tools", {"query": query})).is_error
        found = samples(gw.registry.metrics.exposition().decode())
    assert value(found, "mcp_gateway_searches_total", status="success") == 3
    assert value(found, "mcp_gateway_search_duration_seconds_count") == 3
    assert value(found, "mcp_gateway_search_duration_seconds_bucket", le="+Inf") == 3
    assert value(found, "mcp_gateway_router_semantic") == 0  # embeddings are off here


async def test_upstream_and_breaker_states_are_read_when_scraped(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        found = samples(gw.registry.metrics.exposition().decode())
        assert value(found, "mcp_gateway_upstream_state", server="mem", state="ready") == 1
        assert value(found, "mcp_gateway_upstream_state", server="mem", state="failed") == 0
        assert value(found, "mcp_gateway_circuit_breaker_state", server="mem", state="closed") == 1

        breaker = gw.registry.breakers.get("mem")
        for _ in range(breaker.failures):
            breaker.failed()
        gw.registry.upstreams["mem"].stop()
        with anyio.fail_after(10):
            while gw.registry.upstreams["mem"].state != "stopped":
                await anyio.sleep(0.02)
        found = samples(gw.registry.metrics.exposition().decode())
    assert value(found, "mcp_gateway_upstream_state", server="mem", state="stopped") == 1
    assert value(found, "mcp_gateway_upstream_state", server="mem", state="ready") == 0
    assert value(found, "mcp_gateway_circuit_breaker_state", server="mem", state="open") == 1
    assert value(found, "mcp_gateway_circuit_breaker_state", server="mem", state="closed") == 0


def test_records_dropped_reads_the_callable_it_is_given_at_each_scrape() -> None:
    metrics = GatewayMetrics()
    assert value(samples(metrics.exposition().decode()), "mcp_gateway_records_dropped_total") is None
    dropped = [0]
    metrics.watch_records_dropped(lambda: dropped[0])
    assert value(samples(metrics.exposition().decode()), "mcp_gateway_records_dropped_total") == 0
    dropped[0] = 7
    assert value(samples(metrics.exposition().decode()), "mcp_gateway_records_dropped_total") == 7


def test_a_failing_dropped_count_is_logged_and_the_scrape_still_works(caplog: pytest.LogCaptureFixture) -> None:
    metrics = GatewayMetrics()
    metrics.observe_search("success", 0.01)

    def broken() -> int:
        raise OSError("store gone")

    metrics.watch_records_dropped(broken)
    found = samples(metrics.exposition().decode())
    assert value(found, "mcp_gateway_searches_total", status="success") == 1
    assert "mcp_gateway_records_dropped_total" not in {name for name, _ in found}
    assert "dropped count failed" in caplog.text


def test_two_gateways_in_one_process_count_apart() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.observe_call("s", "s__t", "success", None, 0.01)
    assert (
        value(
            samples(first.exposition().decode()),
            "mcp_gateway_tool_calls_total",
            server="s",
            tool="s__t",
            status="success",
        )
        == 1
    )
    assert (
        value(
            samples(second.exposition().decode()),
            "mcp_gateway_tool_calls_total",
            server="s",
            tool="s__t",
            status="success",
        )
        is None
    )


# ---- GET /metrics over HTTP -------------------------------------------------------------

KEYS = {name: new_key() for name in ("ops", "narrow")}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[str]:
    """A gateway child with API keys: `ops` sees everything, `narrow` has a profile."""
    config = write_config(
        tmp_path / "gw.yaml",
        f"""
        mcps: {{}}
        auth:
          api_keys:
            - {{name: ops, hash: "{hash_key(KEYS["ops"])}"}}
            - {{name: narrow, hash: "{hash_key(KEYS["narrow"])}", profile: mem-only}}
          profiles:
            mem-only: {{servers: [mem]}}
        """,
    )
    process, url = start_gateway_http(config, tmp_path)
    try:
        yield url.removesuffix("/mcp")
    finally:
        stop_process(process)


def _bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def test_metrics_need_the_same_credentials_as_mcp_and_a_caller_without_a_profile(secured: str) -> None:
    url = f"{secured}/metrics"
    assert httpx2.get(url, timeout=10).status_code == 401
    assert (
        httpx2.get(url, headers={"Authorization": "Bearer mgw_wrong-key-of-enough-length"}, timeout=10).status_code
        == 401
    )
    narrow = httpx2.get(url, headers=_bearer("narrow"), timeout=10)
    assert narrow.status_code == 403 and narrow.json()["error"] == "insufficient_scope"
    ops = httpx2.get(url, headers=_bearer("ops"), timeout=10)
    assert ops.status_code == 200
    assert ops.headers["content-type"].startswith("text/plain; version=")
    found = samples(ops.text)
    assert value(found, "mcp_gateway_upstream_state", server="mem", state="ready") == 1
    foreign = httpx2.get(url, headers=_bearer("ops") | {"Host": "evil.example.com"}, timeout=10)
    assert foreign.status_code == 403


def test_public_metrics_need_no_credentials_and_accept_any_host(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "gw.yaml", f'mcps: {{}}\nauth: {{api_keys: [{{name: ops, hash: "{hash_key(KEYS["ops"])}"}}]}}\n'
    )
    process, url = start_gateway_http(config, tmp_path, {"GATEWAY_HTTP__METRICS_PUBLIC": "true"})
    base = url.removesuffix("/mcp")
    try:
        response = httpx2.get(f"{base}/metrics", headers={"Host": "10.0.0.7:8765"}, timeout=10)
        assert response.status_code == 200
        assert value(samples(response.text), "mcp_gateway_upstream_state", server="mem", state="ready") == 1
        assert httpx2.post(url, json={}, timeout=10).status_code == 401  # the MCP endpoint still needs a key
    finally:
        stop_process(process)


def test_metrics_can_be_turned_off(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    process, url = start_gateway_http(config, tmp_path, {"GATEWAY_HTTP__METRICS": "false"})
    try:
        assert httpx2.get(url.removesuffix("/mcp") + "/metrics", timeout=10).status_code == 404
    finally:
        stop_process(process)
