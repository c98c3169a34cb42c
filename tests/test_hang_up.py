"""A client that hangs up cancels its call (issue 33 item 7): the SQL statement stops inside the database,
a stdio upstream is sent `notifications/cancelled`, the call is recorded `cancelled`, and another
client's calls go on.

A real gateway child over HTTP on 127.0.0.1 (the built-in sql plugin on a SQLite file, the demo server as
a stdio child), a raw HTTP client that drops its connection mid-call (the hang-up), and the SDK's client
calling `clock__now` in the background throughout. A running statement holds SQLite's shared lock on the
file, so "the query stopped" is read from the file: an exclusive lock can be taken again. Beside them:
a stream that can be resumed (an event store) is not cancelled by a disconnect, and a cancelled call's
PostgreSQL statement is cancelled on the server (tests/postgres.py's server).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import mcp_types as types
import pytest
import uvicorn
from mcp import Client
from mcp.server import MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.applications import Starlette
from starlette.routing import Route

from gateway.serving.deferred_responses import DeferringSessionManager
from gateway.serving.http import bind_socket
from plugins.sql import Config as SqlConfig
from plugins.sql import create_server as create_sql_server
from tests.conftest import DEMO_SERVER, NO_EMBEDDINGS, REPO, gateway_env, start_gateway_http, stop_process, write_config

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]  # the postgres_server and postgres_database fixtures
pytestmark = pytest.mark.anyio

WINDOW = 3.0
"""The gateway's `response_window`: a hang-up before it lands in the JSON wait, one after on the SSE stream."""
STATEMENT_LIMIT_MS = 100_000
"""The hung-up statements' own limit: nothing but the cancellation stops them sooner."""
STOPS_WITHIN = 30.0
"""Seconds a test waits for a hung-up statement to stop: far below its own limit, so only the
cancellation stops it in time, and generous on a loaded machine. How soon it stops (the issue's
bound: within a second) is measured by bench/abuse.py, not asserted here."""
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
HANDSHAKE = "2025-06-18"
MODERN = "2026-07-28"
ENV = NO_EMBEDDINGS | {
    "GATEWAY_PLUGINS__ENTRY_POINTS": "true",  # the built-in plugins: sql and clock
    "GATEWAY_ROUTING__MODE": "all",
    "GATEWAY_HTTP__RESPONSE_WINDOW": str(WINDOW),
    "GATEWAY_RECORDS__FLUSH_INTERVAL": "0.2",
}


def slow_sql(tag: int, table: str = "t") -> str:
    """A read that runs until it is stopped, reading `table` (so it holds the file's shared lock);
    `tag` tells its record from the others'."""
    return f"WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) + {tag} FROM {table}, n"


def make_database(path: Path) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x INTEGER)")
        db.execute("INSERT INTO t VALUES (1)")
    return path


def locked(database: Path) -> bool:
    """Whether a statement still reads `database`: its shared lock refuses an exclusive one."""
    db = sqlite3.connect(database, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN EXCLUSIVE")
        db.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as error:
        assert "locked" in str(error), error
        return True
    finally:
        db.close()


async def wait_until(condition: Callable[[], bool], within: float = 60.0) -> float:
    """Poll `condition` every 20 ms; the monotonic time it first held (fails after `within` seconds:
    a bound on a hang, generous on a loaded machine)."""
    with anyio.fail_after(within):
        while not condition():
            await anyio.sleep(0.02)
    return time.monotonic()


def recorded(data_dir: Path, tool: str, marker: str) -> tuple[str, str | None] | None:
    """(status, error code) of the call to `tool` whose arguments contain `marker`, once it is stored."""
    path = data_dir / "records.sqlite3"
    if not path.exists():
        return None
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT status, error_code, arguments FROM executions WHERE tool = ?", (tool,)).fetchall()
    return next(((status, code) for status, code, arguments in rows if marker in arguments), None)


async def record_of(data_dir: Path, tool: str, marker: str) -> tuple[str, str | None]:
    found: list[tuple[str, str | None]] = []

    def stored() -> bool:
        row = recorded(data_dir, tool, marker)
        found[:] = [row] if row is not None else []
        return row is not None

    await wait_until(stored)
    return found[0]


def cancelled_calls(url: str, tool: str) -> float:
    """`mcp_gateway_tool_calls_total{status="cancelled"}` of `tool`, from the gateway's `/metrics`."""
    metrics = httpx2.get(url.removesuffix("/mcp") + "/metrics", timeout=10).text
    labels = f'tool="{tool}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("mcp_gateway_tool_calls_total{") and labels in line and 'status="cancelled"' in line
    )


@dataclass
class Gateway:
    url: str
    database: Path
    data_dir: Path
    folder: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("hang_up"), ENV) as running:
        yield running


@contextmanager
def running_gateway(folder: Path, env: dict[str, str]) -> Iterator[Gateway]:
    database = make_database(folder / "shop.sqlite")
    config = write_config(
        folder / "gateway.yaml",
        f"""
        mcps:
          child:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, child]
        plugins:
          sql:
            database: {database}
            timeout_ms_limit: 120000
        """,
    )
    process, url = start_gateway_http(config, folder, env)
    try:
        yield Gateway(url, database, folder / "data", folder)
    finally:
        stop_process(process)


@dataclass
class Background:
    """The SDK's client calling `clock__now` while the test hangs up other calls."""

    answered: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@asynccontextmanager
async def background_client(url: str) -> AsyncIterator[Background]:
    seen = Background()

    async def keep_calling(client: Client) -> None:
        while True:
            with anyio.fail_after(60):  # a bound on a hang: slow under load is no failure
                result = await client.call_tool("clock__now", {})
            if result.is_error:
                seen.failures.append(str(result.content))
            seen.answered.append(time.monotonic())
            await anyio.sleep(0.2)

    async with Client(url) as client, anyio.create_task_group() as tg:
        tg.start_soon(keep_calling, client)
        yield seen
        tg.cancel_scope.cancel()


def handshake_call(request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def modern_call(request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A 2026-07-28 `tools/call`: no session, the protocol envelope in `_meta`."""
    meta = {
        types.PROTOCOL_VERSION_META_KEY: MODERN,
        types.CLIENT_CAPABILITIES_META_KEY: {},
        types.CLIENT_INFO_META_KEY: {"name": "hang-up", "version": "1"},
    }
    params = {"name": name, "arguments": arguments, "_meta": meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def handshake_headers(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """A 2025-era session's headers, after `initialize` and `notifications/initialized`."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "hang-up", "version": "1"}},
    }
    answer = await http.post(url, json=initialize, headers=HEADERS)
    assert answer.status_code == 200, answer.text
    headers = HEADERS | {"Mcp-Session-Id": answer.headers["mcp-session-id"], "MCP-Protocol-Version": HANDSHAKE}
    initialized = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert initialized.status_code == 202
    return headers


async def call_and_hang_up(
    url: str, era: str, name: str, arguments: dict[str, Any], running: Callable[[], bool], *, on_stream: bool = False
) -> float:
    """POST the call, wait until it `running` (and, `on_stream`, until its answer became an SSE stream),
    then drop the connection; the monotonic time of the hang-up."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
        if era == HANDSHAKE:
            headers, body = await handshake_headers(http, url), handshake_call(7, name, arguments)
        else:
            headers = HEADERS | {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": name}
            body = modern_call(7, name, arguments)
        streaming = anyio.Event()

        async def post() -> None:
            async with http.stream("POST", url, json=body, headers=headers) as response:
                assert response.headers["content-type"].startswith("text/event-stream"), response.headers
                streaming.set()
                await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(post)
            await wait_until(running)
            if on_stream:
                with anyio.fail_after(WINDOW + 30):
                    await streaming.wait()
            assert not streaming.is_set() or on_stream, "the answer became a stream before the hang-up"
            tg.cancel_scope.cancel()
    return time.monotonic()  # the client is closed: its connection is gone


@pytest.mark.parametrize(
    ("era", "on_stream"),
    [(HANDSHAKE, False), (HANDSHAKE, True), (MODERN, False)],
    ids=["2025-json-wait", "2025-sse-stream", "2026-07-28"],
)
async def test_a_hung_up_clients_sql_query_stops_long_before_its_limit_and_is_recorded_cancelled(
    gateway: Gateway, era: str, on_stream: bool
) -> None:
    tag = {(HANDSHAKE, False): 1, (HANDSHAKE, True): 2, (MODERN, False): 3}[(era, on_stream)]
    sql = slow_sql(tag)
    arguments = {"sql": sql, "dry_run": False, "timeout_ms": STATEMENT_LIMIT_MS}
    with anyio.fail_after(120):
        async with background_client(gateway.url) as background:
            await wait_until(lambda: not locked(gateway.database))  # another test's query has stopped
            await call_and_hang_up(
                gateway.url, era, "sql__execute_sql", arguments, lambda: locked(gateway.database), on_stream=on_stream
            )
            stopped = await wait_until(lambda: not locked(gateway.database), within=STOPS_WITHIN)
            assert await record_of(gateway.data_dir, "sql__execute_sql", f"+ {tag} FROM") == ("error", "cancelled")
            assert cancelled_calls(gateway.url, "sql__execute_sql") >= 1
            await wait_until(lambda: len([t for t in background.answered if t > stopped]) >= 2)
        assert background.failures == []


async def test_under_response_mode_sse_a_hung_up_clients_query_stops_too(tmp_path: Path) -> None:
    """`response_mode: sse` streams every answer at once; a hang-up on that stream cancels the same way."""
    with running_gateway(tmp_path, ENV | {"GATEWAY_HTTP__RESPONSE_MODE": "sse"}) as gateway:
        arguments = {"sql": slow_sql(4), "dry_run": False, "timeout_ms": STATEMENT_LIMIT_MS}
        with anyio.fail_after(120):
            await call_and_hang_up(
                gateway.url, HANDSHAKE, "sql__execute_sql", arguments, lambda: locked(gateway.database), on_stream=True
            )
            await wait_until(lambda: not locked(gateway.database), within=STOPS_WITHIN)
            assert await record_of(gateway.data_dir, "sql__execute_sql", "+ 4 FROM") == ("error", "cancelled")


@pytest.mark.parametrize("era", [HANDSHAKE, MODERN])
async def test_a_hung_up_clients_call_to_a_stdio_server_is_cancelled_there(gateway: Gateway, era: str) -> None:
    """The stdio child's handler is cancelled (it writes `cancelled`) while the gateway and the child go
    on: only a `notifications/cancelled` from the gateway does that."""
    marker = gateway.folder / f"child-{era}.cancelled"
    with anyio.fail_after(120):
        async with background_client(gateway.url) as background:
            await call_and_hang_up(
                gateway.url,
                era,
                "child__wait_for_cancel",
                {"marker": str(marker)},
                Path(f"{marker}.started").exists,
            )
            # Created, then written: wait for both.
            await wait_until(lambda: marker.exists() and marker.read_text() == "cancelled")
            assert await record_of(gateway.data_dir, "child__wait_for_cancel", marker.name) == ("error", "cancelled")
            done = time.monotonic()
            await wait_until(lambda: len([t for t in background.answered if t > done]) >= 2)
        assert background.failures == []


async def test_a_stdio_client_that_exits_mid_call_has_its_query_stopped_and_recorded_cancelled(tmp_path: Path) -> None:
    """The client's end of stdin closes (its process exited): the gateway cancels what it still runs for
    it, the statement stops, and the record says `cancelled`."""
    database = make_database(tmp_path / "shop.sqlite")
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps: {{}}
        plugins:
          sql:
            database: {database}
            timeout_ms_limit: 120000
        """,
    )
    env = gateway_env(tmp_path) | ENV
    command = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"]
    call = modern_call(5, "sql__execute_sql", {"sql": slow_sql(5), "dry_run": False, "timeout_ms": STATEMENT_LIMIT_MS})
    with anyio.fail_after(120):
        log = (tmp_path / "stderr.log").open("w")
        async with await anyio.open_process(command, env=env, cwd=REPO, stderr=log) as process:
            assert process.stdin is not None
            await process.stdin.send((json.dumps(call) + "\n").encode())
            await wait_until(lambda: locked(database))
            await process.stdin.aclose()
            await wait_until(lambda: not locked(database), within=STOPS_WITHIN)
            assert await process.wait() == 0
        log.close()
    assert recorded(tmp_path / "data", "sql__execute_sql", "+ 5 FROM") == ("error", "cancelled")


class MemoryEventStore(EventStore):
    """The smallest event store: every event kept, replayed after the one a client names."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, types.JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        self.events.append((str(len(self.events)), stream_id, message))
        return self.events[-1][0]

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        stream = next((s for i, s, _ in self.events if i == last_event_id), None)
        for index, stream_id, message in self.events[int(last_event_id) + 1 :]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, index))
        return stream


async def test_a_resumable_stream_is_not_cancelled_by_a_disconnect(tmp_path: Path) -> None:
    """With an event store a client can resume its stream, so a disconnect is no cancellation (2025 spec):
    such requests are the SDK's, and the call runs on. (The gateway configures no event store; this is
    the rule `deferred_responses` keeps for one.)"""
    server = MCPServer("resumable")
    marker = tmp_path / "slow"

    @server.tool()
    async def slow() -> str:
        """Run past the window (its answer becomes a stream); say in `marker` whether it finished or was cancelled."""
        Path(f"{marker}.started").touch()
        try:
            await anyio.sleep(WINDOW + 2)
        except anyio.get_cancelled_exc_class():
            marker.write_text("cancelled")
            raise
        marker.write_text("finished")
        return "done"

    manager = DeferringSessionManager(
        server._lowlevel_server,  # the session manager serves the low-level server, as `deferring_http_app` does
        window=WINDOW,
        json_first=True,
        max_sessions_per_client=10,
        event_store=MemoryEventStore(),
    )
    app = Starlette(routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))], lifespan=lambda _: manager.run())
    sock = bind_socket("127.0.0.1", 0)
    uvicorn_server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(uvicorn_server.serve, [sock])
            await wait_until(lambda: uvicorn_server.started)
            await call_and_hang_up(url, HANDSHAKE, "slow", {}, Path(f"{marker}.started").exists, on_stream=True)
            await wait_until(marker.exists)
            assert marker.read_text() == "finished"
            uvicorn_server.should_exit = True


async def test_a_cancelled_call_cancels_its_postgresql_statement(
    postgres_server: PostgresServer, postgres_database: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The sql plugin on PostgreSQL: cancelling the call (as a hang-up does) sends the server a cancel
    request, so the statement leaves `pg_stat_activity` long before its 100 s limit."""
    monkeypatch.setenv("MCP_GATEWAY_TEST_PG_PASSWORD", postgres_server.password)
    config = SqlConfig(
        database=postgres_server.url(postgres_database),
        password_env="MCP_GATEWAY_TEST_PG_PASSWORD",
        timeout_ms_limit=120_000,
    )

    def sleeping() -> bool:
        with postgres_server.connect(postgres_database, autocommit=True) as db:
            query = (
                "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE '%pg_sleep(100)%' AND state = 'active' "
                "AND pid <> pg_backend_pid()"
            )
            return bool(db.execute(query).fetchone()[0])

    with anyio.fail_after(60):
        async with Client(create_sql_server(config, tmp_path)) as client:
            arguments = {"sql": "SELECT pg_sleep(100)", "dry_run": False, "timeout_ms": STATEMENT_LIMIT_MS}
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "execute_sql", arguments)
                await wait_until(sleeping)
                tg.cancel_scope.cancel()
            await wait_until(lambda: not sleeping(), within=STOPS_WITHIN)
            result = await client.call_tool("execute_sql", {"sql": "SELECT 1 AS one", "dry_run": False})
            assert not result.is_error and result.structured_content is not None
