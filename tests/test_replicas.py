"""Two gateway replicas behind a load balancer: stateless HTTP, one PostgreSQL, API keys.

The `replicas` fixture starts one real PostgreSQL database (tests/postgres.py) and two
`python -m gateway serve --transport http` processes on 127.0.0.1 with the same config,
`GATEWAY_DATABASE_URL` pointing at that database and `GATEWAY_HTTP__STATELESS=true`. The
second starts once the first has embedded the catalog. Clients reach them through a
round-robin HTTP transport: consecutive requests of one client go to alternate replicas,
as behind a load balancer without session affinity. Feedback given through one replica is
learnt by the router of the other, through the shared records.
"""

from __future__ import annotations

import secrets
import sys
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.security.auth import hash_key, new_key
from tests.conftest import DEMO_SERVER, start_gateway_http, stop_process, write_config
from tests.prometheus import Samples, samples, value

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]  # the postgres_server fixture
pytestmark = pytest.mark.anyio

READY_TIMEOUT = 120.0
"""Seconds a replica may take to serve with embeddings (the first one embeds the catalog)."""


@dataclass
class Replica:
    process: Any
    url: str
    """The MCP endpoint, `http://127.0.0.1:<port>/mcp`."""
    log: Path

    @property
    def base(self) -> str:
        return self.url.removesuffix("/mcp")

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])


@dataclass
class Replicas:
    """Two running replicas, the API keys they accept (`ops`: no profile) and their database."""

    replicas: list[Replica]
    keys: dict[str, str]
    database_url: str
    database: str

    def headers(self, key: str = "ops") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[key]}"}

    def metrics(self, index: int) -> Samples:
        response = httpx2.get(f"{self.replicas[index].base}/metrics", headers=self.headers(), timeout=10)
        response.raise_for_status()
        return samples(response.text)

    @asynccontextmanager
    async def client(
        self, *, mode: str = "auto", query: str = "", pin: int | None = None, **client_kwargs: Any
    ) -> AsyncIterator[tuple[Client, RoundRobin]]:
        """The SDK client, its requests sent to the replicas in turn (or all to replica `pin`)."""
        ports = [r.port for r in self.replicas] if pin is None else [self.replicas[pin].port]
        balancer = RoundRobin(ports)
        url = self.replicas[0].url + query
        async with (
            httpx2.AsyncClient(transport=balancer, headers=self.headers(), timeout=30) as http,
            Client(streamable_http_client(url, http_client=http), mode=mode, **client_kwargs) as client,
        ):
            yield client, balancer


@dataclass
class RoundRobin(httpx2.AsyncBaseTransport):
    """A client-side load balancer: each request goes to the next port, with no affinity at all."""

    ports: list[int]
    served: list[tuple[int, str]] = field(default_factory=list)
    """(port, method) of every request, in order."""
    session_ids: list[str] = field(default_factory=list)
    """Every `mcp-session-id` a replica answered with (none under stateless HTTP)."""
    inner: httpx2.AsyncHTTPTransport = field(default_factory=httpx2.AsyncHTTPTransport)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[len(self.served) % len(self.ports)]
        request.url = request.url.copy_with(port=port)
        self.served.append((port, request.method))
        response = await self.inner.handle_async_request(request)
        if "mcp-session-id" in response.headers:
            self.session_ids.append(response.headers["mcp-session-id"])
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _wait_until_semantic(replicas: Replicas, index: int) -> None:
    """Until the replica's router searches with embeddings, its tools' full texts embedded too
    (bounded; the log is in the error)."""
    replica = replicas.replicas[index]
    deadline = time.monotonic() + READY_TIMEOUT

    def semantic() -> bool:
        metrics = replicas.metrics(index)
        pending = value(metrics, "mcp_gateway_router_documents_pending")
        return value(metrics, "mcp_gateway_router_semantic") == 1 and pending == 0

    while not semantic():
        if time.monotonic() > deadline or replica.process.poll() is not None:
            raise RuntimeError(f"replica {index} did not load its router:\n{replica.log.read_text()[-3000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def replicas(postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("replicas")
    keys = {"ops": new_key()}
    config = write_config(
        tmp / "gateway.yaml",
        f"""
        mcps:
          child: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, child]}}
        auth:
          api_keys:
            - {{name: ops, hash: "{hash_key(keys["ops"])}"}}
        security:
          limits: {{max_calls_per_session: 2}}
        """,
    )
    database = f"replicas_{secrets.token_hex(4)}"
    with postgres_server.connect(autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    database_url = postgres_server.url_with_password(database)
    env = {
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_HTTP__STATELESS": "true",
        "GATEWAY_EMBEDDING__THREADS": "1",
        "GATEWAY_LOG_LEVEL": "INFO",
        "GATEWAY_RECORDS__FLUSH_INTERVAL": "0.2",
        "GATEWAY_LEARNING__REFRESH_SECONDS": "0.5",
    }
    deployment = Replicas([], keys, database_url, database)
    try:
        for index in range(2):
            home = tmp / f"replica-{index}"  # each its own data dir: only the database is shared
            home.mkdir()
            log = home / "gateway.log"
            process, url = start_gateway_http(config, home, env, log=log)
            deployment.replicas.append(Replica(process, url, log))
            _wait_until_semantic(deployment, index)
        yield deployment
    finally:
        for replica in deployment.replicas:
            stop_process(replica.process)
        with postgres_server.connect(autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def _calls(replicas: Replicas, tool: str) -> float:
    """Successful calls of `tool` counted by both replicas together."""
    return sum(
        value(replicas.metrics(i), "mcp_gateway_tool_calls_total", server=tool.split("__")[0], tool=tool,
              status="success") or 0.0
        for i in range(2)
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_one_clients_requests_alternate_between_the_replicas_and_all_succeed(
    replicas: Replicas, mode: str
) -> None:
    before = _calls(replicas, "child__echo")
    with anyio.fail_after(60):
        async with replicas.client(mode=mode) as (client, balancer):
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"mem__add", "child__echo"} <= names
            assert _text(await client.call_tool("mem__add", {"a": 2, "b": 3})) == "5"
            for word in ("one", "two", "three"):
                assert _text(await client.call_tool("child__echo", {"text": word})) == word
    served = {port for port, _ in balancer.served}
    assert served == {r.port for r in replicas.replicas} and len(balancer.served) >= 5
    assert balancer.session_ids == []
    # Three calls although max_calls_per_session is 2: without sessions that limit cannot apply.
    assert _calls(replicas, "child__echo") == before + 3


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_search_mode_searches_and_calls_across_the_replicas(replicas: Replicas, mode: str) -> None:
    with anyio.fail_after(60):
        async with replicas.client(mode=mode, query="?mode=search") as (client, balancer):
            assert [t.name for t in (await client.list_tools()).tools] == [
                "search_tools",
                "call_tool",
                "submit_feedback",
            ]
            found = await client.call_tool("search_tools", {"query": "add two integers", "limit": 3})
            assert not found.is_error
            assert (found.structured_content or {})["tools"][0]["name"].endswith("__add")
            result = await client.call_tool("call_tool", {"name": "mem__add", "arguments": {"a": 4, "b": 4}})
            assert _text(result) == "8"
    assert {port for port, _ in balancer.served} == {r.port for r in replicas.replicas}


def test_the_second_replica_takes_every_embedding_from_the_shared_cache(replicas: Replicas) -> None:
    first, second = replicas.metrics(0), replicas.metrics(1)
    assert (value(first, "mcp_gateway_router_documents_embedded_total") or 0) > 0
    assert value(second, "mcp_gateway_router_documents_embedded_total") == 0
    assert (value(second, "mcp_gateway_router_documents_cached_total") or 0) > 0
    assert "0 tool documents embedded" in replicas.replicas[1].log.read_text()


def _route_scores(replicas: Replicas, index: int, query: str) -> dict[str, float]:
    """What `POST /route` on one replica scores each tool for `query`."""
    body = {"query": query, "k": 50}
    response = httpx2.post(f"{replicas.replicas[index].base}/route", json=body, headers=replicas.headers(), timeout=10)
    response.raise_for_status()
    return {tool["name"]: tool["score"] for tool in response.json()["tools"]}


async def test_feedback_given_through_one_replica_is_seen_by_the_router_of_the_other(replicas: Replicas) -> None:
    query, unrelated = "say my words back to me, unchanged, for the replica feedback check", "add two integers"
    target = "child__echo"

    def gains() -> tuple[float, float]:
        """How much replica 1 raised the target since the start, for this query and for an unrelated one
        (calls by name in other tests add a small query-independent prior to both)."""
        return (
            _route_scores(replicas, 1, query)[target] - before,
            _route_scores(replicas, 1, unrelated)[target] - before_unrelated,
        )

    before, before_unrelated = _route_scores(replicas, 1, query)[target], _route_scores(replicas, 1, unrelated)[target]
    with anyio.fail_after(60):
        async with replicas.client(pin=0, query="?mode=search") as (client, _):
            found = await client.call_tool("search_tools", {"query": query, "limit": 50})
            assert target in {tool["name"] for tool in (found.structured_content or {})["tools"]}
            result = await client.call_tool("call_tool", {"name": target, "arguments": {"text": "hello"}})
            assert _text(result) == "hello" and result.meta is not None
            token = result.meta[FEEDBACK_TOKEN_META_KEY]
            rated = await client.call_tool("submit_feedback", {"token": token, "rating": "up"})
            assert not rated.is_error, _text(rated)
        while (gain := gains())[0] <= gain[1] + 0.02:
            await anyio.sleep(0.2)  # replica 1 reads the shared records every 0.5 s
    assert gain[0] <= 0.25 + 0.03 + 1e-6  # bounded: GATEWAY_LEARNING__MAX_BOOST plus the prior


async def test_dynamic_mode_behaves_as_search_without_sessions(replicas: Replicas) -> None:
    with anyio.fail_after(60):
        async with replicas.client(mode="legacy", query="?mode=dynamic") as (client, _):
            assert not (await client.call_tool("search_tools", {"query": "add two integers"})).is_error
            assert [t.name for t in (await client.list_tools()).tools] == [
                "search_tools",
                "call_tool",
                "submit_feedback",
            ]


async def test_a_resource_subscription_is_refused_with_the_reason(replicas: Replicas) -> None:
    with anyio.fail_after(60):
        async with replicas.client(mode="legacy") as (client, _):
            uri = next(r.uri for r in (await client.list_resources()).resources if r.uri.startswith("mem+"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # the handshake era's subscribe
                with pytest.raises(MCPError, match="Resource subscriptions need a session"):
                    await client.session.subscribe_resource(uri)


async def _sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="forty-two"), model="test"
    )


async def test_sampling_is_refused_clearly_for_a_handshake_era_client(replicas: Replicas) -> None:
    with anyio.fail_after(60):
        async with replicas.client(mode="legacy", sampling_callback=_sample) as (client, _):
            with pytest.raises(MCPError, match="cannot carry server-to-client requests .stateless HTTP"):
                await client.call_tool("mem__ask_llm", {"question": "the answer?"})


async def test_a_2026_client_answers_sampling_on_one_replica_and_is_told_why_not_across_two(
    replicas: Replicas,
) -> None:
    with anyio.fail_after(60):
        async with replicas.client(pin=1, sampling_callback=_sample) as (client, _):
            assert _text(await client.call_tool("mem__ask_llm", {"question": "the answer?"})) == "LLM said: forty-two"
        async with replicas.client(sampling_callback=_sample) as (client, _):
            with pytest.raises(MCPError, match="answers must reach the replica that asked"):
                await client.call_tool("mem__ask_llm", {"question": "the answer?"})


async def test_a_2026_client_listening_on_one_replica_hears_its_list_changes(replicas: Replicas) -> None:
    """Runs last: `mem__grown` then exists on replica 0 only."""

    async def tool_names() -> set[str]:
        return {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}

    with anyio.fail_after(60):
        async with replicas.client(pin=0) as (client, _), client.listen(tools_list_changed=True) as subscription:
            await client.call_tool("mem__grow", {})
            async for event in subscription:
                assert type(event).__name__ == "ToolsListChanged"
                if "mem__grown" in await tool_names():
                    break
            assert _text(await client.call_tool("mem__grown", {})) == "grown"
