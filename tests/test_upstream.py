"""Upstreams as they are in the wild: handshake-era servers, several clients, dying and shutting down."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client

from bench.compat.install import install_servers, server_command
from bench.compat.servers import by_id
from gateway.config.loader import load_config
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.server_specs import specs_from_config
from gateway.upstreams.stderr import StderrLog
from gateway.upstreams.upstream import Upstream, UpstreamSpec, unavailable_message
from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    gateway_env,
    gateway_over_stdio,
    start_demo_http,
    start_gateway_http,
    stop_process,
    write_config,
)
from tests.test_resilience import _text, call, running

pytestmark = pytest.mark.anyio


def legacy_child_config(tmp_path: Path, *, pid_file: Path | None = None) -> Path:
    extra = f', --pid-file, "{pid_file}"' if pid_file is not None else ""
    return write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          old:
            description: the demo server, spoken to with the initialize handshake only
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, old{extra}]
            protocol: legacy
        """,
    )


def _sampler(name: str) -> Any:
    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=f"answer for {name}"), model="m"
        )

    return sample


async def test_a_handshake_era_upstream_is_served_and_its_sampling_request_reaches_the_one_client(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with gateway_over_stdio(
            legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS, sampling_callback=_sampler("A")
        ) as client:
            result = await client.call_tool("old__add", {"a": 20, "b": 22})
            assert result.structured_content == {"result": 42}
            result = await client.call_tool("old__ask_llm_after", {"question": "q", "delay": 0})
            assert result.content[0].text == "LLM said: answer for A"  # type: ignore[union-attr]


async def test_a_sampling_request_is_never_relayed_to_another_clients_session(tmp_path: Path) -> None:
    """Two clients call the same handshake-era stdio server at once: its sampling request
    cannot say which call it belongs to, so the gateway refuses rather than guess."""
    process, url = start_gateway_http(legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS)
    outcomes: dict[str, str] = {}

    async def one_client(name: str) -> None:
        async with Client(url, mode="legacy", sampling_callback=_sampler(name)) as client:
            try:
                result = await client.call_tool("old__ask_llm_after", {"question": name, "delay": 1.0})
                outcomes[name] = result.content[0].text  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the refusal arrives as the upstream's JSON-RPC error
                outcomes[name] = f"error: {exc}"

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one_client, "A")
                tg.start_soon(one_client, "B")
    finally:
        stop_process(process)
    for name, other in (("A", "B"), ("B", "A")):
        assert f"answer for {other}" not in outcomes[name]
        assert outcomes[name] == f"LLM said: answer for {name}" or "several clients" in outcomes[name]
    assert any("several clients" in text for text in outcomes.values()), outcomes


async def test_resource_links_in_a_tool_result_point_at_readable_namespaced_uris(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with gateway_over_stdio(legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS) as client:
            result = await client.call_tool("old__link_readme", {})
            link, embedded = result.content
            assert isinstance(link, types.ResourceLink) and link.uri == "old+demo://readme"
            assert isinstance(embedded, types.EmbeddedResource) and embedded.resource.uri == "old+demo://readme"
            readme = await client.read_resource(link.uri)
            assert readme.contents[0].text == "old readme"  # type: ignore[union-attr]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_sigterm_stops_the_gateway_and_reaps_its_stdio_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    process, _url = start_gateway_http(legacy_child_config(tmp_path, pid_file=pid_file), tmp_path, NO_EMBEDDINGS)
    try:
        with anyio.fail_after(30):
            while not pid_file.exists() or not pid_file.read_text():  # the child writes it on start
                await anyio.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        with anyio.fail_after(10):
            while _alive(child):
                await anyio.sleep(0.05)
    finally:
        stop_process(process)


def test_a_busy_port_is_one_clear_line_and_exit_code_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "--config", str(write_config(tmp_path / "gw.yaml", "mcps: {}\n"))]
            + ["serve", "--transport", "http", "--port", str(port)],
            capture_output=True,
            text=True,
            env=gateway_env(tmp_path),
            cwd=REPO,
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr.strip() == f"mcp-gateway: cannot listen on 127.0.0.1:{port}: Address already in use"


async def test_the_servers_instructions_reach_the_client_under_their_names(tmp_path: Path) -> None:
    """A handshake made once every server is ready (the handshake's own wait for them is bounded:
    a child slow to start on a loaded machine would be missing, which is not what is tested here)."""
    process, url = start_gateway_http(legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS)
    try:
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                while not all(
                    s["state"] == "ready"
                    for s in (await http.get(url.removesuffix("/mcp") + "/readyz")).json()["servers"]
                ):
                    await anyio.sleep(0.05)
            async with Client(url, mode="legacy") as client:
                instructions = client.instructions or ""
    finally:
        stop_process(process)
    assert "aggregates several MCP servers" in instructions
    assert "## old (tools 'old__*')\nThe old test server." in instructions


# ---- servers that implement part of MCP ------------------------------------------------------------

PARTIAL_SERVER = REPO / "tests" / "servers" / "partial_server.py"


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_server_that_answers_method_not_found_to_optional_methods_serves_its_tools(
    tmp_path: Path, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.upstreams.listing")
    servers = f"  partial:\n    command: {sys.executable}\n    args: [{json.dumps(str(PARTIAL_SERVER))}]\n"
    servers += f"    protocol: {protocol}\n"
    with anyio.fail_after(60):
        async with running(tmp_path, servers) as registry:
            partial = registry.upstreams["partial"]
            assert partial.state == "ready", partial.reason
            assert sorted(registry.catalog.tools) == ["partial__echo"]
            assert [r.uri for r in partial.listing.resources] == ["memo://note"] and partial.listing.templates == []
            assert _text(await call(registry, "partial__echo", {"text": "whole"})) == "whole"

            reference = types.ResourceTemplateReference(uri="memo://{name}")
            completion = await partial.request(
                "completion/complete", lambda c: c.session.complete(reference, {"name": "name", "value": ""})
            )
            assert completion.completion.values == []  # "method not found" means: no suggestions
            await partial.subscriptions.subscribe("memo://note")  # nothing to subscribe to, and no error

            assert partial.pid is not None
            os.kill(partial.pid, signal.SIGKILL)  # the next session lists again
            with anyio.fail_after(20):
                while partial.sessions < 2 or partial.state != "ready":
                    await anyio.sleep(0.05)
            assert _text(await call(registry, "partial__echo", {"text": "again"})) == "again"
    notes = [r for r in caplog.records if "does not support resources/templates/list" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.DEBUG  # once per server, at DEBUG


@pytest.fixture(scope="session")
def sqlite_server() -> Path:
    """`mcp-server-sqlite` on the Python SDK 1.x low-level `Server`, which answers
    `resources/templates/list` with "method not found": the compatibility matrix's pinned install
    (its own venv in the compatibility cache, with the 1.x SDK it was written for)."""
    server = by_id("sqlite")
    return Path(server_command(server, install_servers([server])))


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_mcp_server_sqlite_connects_through_the_gateway_and_its_tools_are_callable(
    tmp_path: Path, sqlite_server: Path, protocol: str
) -> None:
    database = tmp_path / "shop.db"
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          sqlite:
            command: {sqlite_server}
            args: [--db-path, "{database}"]
            protocol: {protocol}
        """,
    )
    with anyio.fail_after(90):
        async with gateway_over_stdio(config, tmp_path) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"sqlite__list_tables", "sqlite__create_table", "sqlite__read_query"} <= tools
            created = await client.call_tool("sqlite__create_table", {"query": "CREATE TABLE fruit (name TEXT)"})
            assert not created.is_error, created
            await client.call_tool("sqlite__write_query", {"query": "INSERT INTO fruit VALUES ('fig')"})
            listed = await client.call_tool("sqlite__list_tables", {})
            assert "fruit" in _text(listed)
            rows = await client.call_tool("sqlite__read_query", {"query": "SELECT name FROM fruit"})
            assert "fig" in _text(rows)


# ---- stderr -----------------------------------------------------------------------------------------


def test_repeated_stderr_lines_are_collapsed_and_only_the_last_lines_are_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.upstream.stderr")
    log = StderrLog("s", size=5)
    log.add("starting\n")
    for _ in range(89):
        log.add("warning: deprecated\n")
    assert log.tail == ["starting", "warning: deprecated", "... repeated 88 times"]  # a count in progress
    log.add("ready\n")
    assert log.tail == ["starting", "warning: deprecated", "... repeated 88 times", "ready"]
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "gateway.upstream.stderr"]
    assert logged == [
        (logging.DEBUG, "[s] starting"),
        (logging.DEBUG, "[s] warning: deprecated"),
        (logging.DEBUG, "[s] ... repeated 88 times"),
        (logging.DEBUG, "[s] ready"),
    ]
    for i in range(100):
        log.add(f"line {i}")
    assert log.tail == [f"line {i}" for i in range(95, 100)] and log.last_line == "line 99"


CHATTY = (
    "import sys\n"
    "print('starting', file=sys.stderr)\n"
    "for _ in range(89): print('warning: deprecated', file=sys.stderr)\n"
    "print('fatal: missing API key', file=sys.stderr)\n"
    "sys.exit(1)\n"
)


@pytest.mark.parametrize("level", ["default", "warning"])
def test_check_shows_a_failed_servers_last_stderr_lines_which_are_logged_at_debug_unless_raised(
    tmp_path: Path, level: str
) -> None:
    setting = f"    stderr_log_level: {level}\n" if level != "default" else ""
    config = write_config(
        tmp_path / "gw.yaml",
        f"mcps:\n  chatty:\n    command: {sys.executable}\n    args: {json.dumps(['-c', CHATTY])}\n{setting}",
    )
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(config), "check"],
        capture_output=True,
        text=True,
        env=gateway_env(tmp_path) | {"GATEWAY_LOG_LEVEL": "INFO", "GATEWAY_STARTUP_TIMEOUT": "10"},
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 1
    assert "its last stderr line: fatal: missing API key" in result.stdout
    assert result.stdout.splitlines()[-3:] == [
        "    stderr: warning: deprecated",
        "    stderr: ... repeated 88 times",
        "    stderr: fatal: missing API key",
    ]
    relayed = [line for line in result.stderr.splitlines() if "gateway.upstream.stderr" in line]
    if level == "default":
        assert relayed == []
    else:
        assert [line.split(": ", 1)[1] for line in relayed[:4]] == [
            "[chatty] starting",
            "[chatty] warning: deprecated",
            "[chatty] ... repeated 88 times",
            "[chatty] fatal: missing API key",
        ]


STALE_STDERR = """
import os, subprocess, sys, time
marks = sys.argv[1]
attempt = len(os.listdir(marks)) + 1
open(os.path.join(marks, f"attempt{attempt}"), "w").close()
if attempt == 1:  # leaves a process behind that writes on this attempt's stderr later
    code = f"import os, sys, time\\nwhile not os.path.exists({os.path.join(marks, 'attempt2')!r}): time.sleep(0.02)\\n"
    code += "print('stale line from attempt 1', file=sys.stderr, flush=True)\\n"
    code += f"open({os.path.join(marks, 'stale')!r}, 'w').close()"
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    print("attempt 1 failed", file=sys.stderr)
    sys.exit(1)
print(f"attempt {attempt} failed", file=sys.stderr, flush=True)
while not os.path.exists(os.path.join(marks, "stale")):
    time.sleep(0.02)
time.sleep(0.3)
sys.exit(1)
"""


async def test_a_failure_reason_quotes_only_the_stderr_of_its_own_attempt(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    servers = f"  flaky:\n    command: {sys.executable}\n    args: {json.dumps(['-c', STALE_STDERR, str(marks)])}\n"
    with anyio.fail_after(60):
        async with running(tmp_path, servers, startup_timeout=10) as registry:
            flaky = registry.upstreams["flaky"]
            with anyio.fail_after(30):
                while "attempt 2" not in (flaky.reason or "") or flaky.state != "failed":
                    await anyio.sleep(0.05)
            assert (marks / "stale").exists()
            assert (flaky.reason or "").endswith("its last stderr line: attempt 2 failed"), flaky.reason
            assert "stale" not in " ".join(flaky.stderr_tail)


def test_the_unavailable_message_says_when_the_gateway_reconnects_and_never_0_s() -> None:
    from mcp.server import MCPServer

    upstream = Upstream(UpstreamSpec(id="w", prefix="w", transport="memory", target=MCPServer("w")), events=None)  # type: ignore[arg-type]
    upstream.state, upstream.reason = "failed", "MCPError: Connection closed"
    upstream.retry_at = datetime.now(UTC) + timedelta(seconds=0.2)
    assert "The gateway reconnects in 1 s" in unavailable_message(upstream)
    upstream.retry_at = datetime.now(UTC) - timedelta(seconds=1)  # due: the attempt is being made
    message = unavailable_message(upstream)
    assert "0 s" not in message and "reconnecting now" in message


def _connections_to(port: int) -> list[socket.socket]:
    """This process's TCP sockets connected to 127.0.0.1:`port`, each a duplicate to inspect."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername()[1:2] == (port,):
                found.append(sock)
                continue
        except OSError:
            pass
        sock.close()
    return found


async def test_connections_to_an_http_upstream_do_not_wait_for_nagle(tmp_path: Path) -> None:
    """The gateway's requests to an HTTP upstream go out with TCP_NODELAY: a request written in two
    parts (headers, then body) would otherwise wait about 40 ms for the server's delayed ACK. The
    upstream is this test's own, so every connection to its port is the registry's."""
    upstream, url = start_demo_http("own")
    try:
        config = load_config(write_config(tmp_path / "gateway.yaml", f"mcps:\n  web:\n    url: {url}\n"))
        registry = Registry(specs_from_config(config), Settings(data_dir=tmp_path / "data"), relay_requests=False)
        with anyio.fail_after(30):
            async with registry.running():
                await registry.wait_settled(20)
                result = await registry.call_tool("web__echo", {"text": "hi"})
                assert not result.is_error
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                # A connection the client is opening at this moment (its GET stream, a health probe)
                # gets the option just after its connect completes: look again, briefly, for that one.
                for _ in range(20):
                    connections = _connections_to(port)
                    try:
                        assert connections, "no connection to the upstream was found"
                        delays = [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in connections]
                    finally:
                        for sock in connections:
                            sock.close()
                    if all(delays):
                        break
                    await anyio.sleep(0.1)
                assert all(delays), f"{delays.count(0)} of {len(delays)} connections wait for Nagle"
    finally:
        stop_process(upstream)
