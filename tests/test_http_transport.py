"""The downstream streamable-HTTP transport: loopback by default, DNS-rebinding guard on."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import anyio.abc
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config.runtime_settings import HttpSettings
from gateway.config.settings import Settings
from gateway.serving.http import bind_socket, loop_options, parser_protocol
from tests.conftest import NO_EMBEDDINGS, REPO, start_gateway_http, stop_process, write_config

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def gateway_url(tmp_path: Path):  # type: ignore[no-untyped-def]
    process, url = start_gateway_http(write_config(tmp_path / "gw.yaml", "mcps: {}\n"), tmp_path, NO_EMBEDDINGS)
    try:
        yield url
    finally:
        stop_process(process)


def test_the_gateway_listens_on_loopback_by_default(gateway_url: str) -> None:
    assert gateway_url.startswith("http://127.0.0.1:") and gateway_url.endswith("/mcp")


def test_a_plain_initialize_from_a_loopback_origin_is_served(gateway_url: str) -> None:
    response = httpx2.post(
        gateway_url, headers=HEADERS | {"Origin": "http://localhost:3000"}, json=INITIALIZE, timeout=10
    )
    assert response.status_code == 200
    body = response.text
    payload = json.loads(body.split("data: ", 1)[1]) if body.startswith("event:") else response.json()
    assert payload["result"]["serverInfo"]["name"] == "mcp-gateway"


def test_a_foreign_host_header_is_refused(gateway_url: str) -> None:
    response = httpx2.post(gateway_url, headers=HEADERS | {"Host": "evil.example.com"}, json=INITIALIZE, timeout=10)
    assert response.status_code == 403


def test_a_foreign_origin_is_refused(gateway_url: str) -> None:
    response = httpx2.post(
        gateway_url, headers=HEADERS | {"Origin": "http://evil.example.com"}, json=INITIALIZE, timeout=10
    )
    assert response.status_code == 403


def test_healthz_is_up_and_readyz_lists_every_server_with_its_state(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    config = write_config(tmp_path / "gw.yaml", f"mcps:\n  gone:\n    url: {refused}\n")
    process, url = start_gateway_http(config, tmp_path, NO_EMBEDDINGS)
    base = url.removesuffix("/mcp")
    try:
        # Probes come by IP address with any Host header; the health routes do not check it.
        assert httpx2.get(f"{base}/healthz", headers={"Host": "10.0.0.7:8765"}, timeout=10).json() == {"status": "ok"}
        ready = httpx2.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["ready"] is True
        servers = {s["server"]: s for s in ready.json()["servers"]}
        assert servers["mem"]["state"] == "ready" and servers["mem"]["breaker"] == "closed"
        assert servers["gone"]["state"] in ("failed", "starting") and "onnect" in servers["gone"]["reason"]
    finally:
        stop_process(process)

    empty = tmp_path / "no-plugins"
    empty.mkdir()
    process, url = start_gateway_http(config, tmp_path, NO_EMBEDDINGS | {"GATEWAY_PLUGINS__DIRECTORY": str(empty)})
    try:
        ready = httpx2.get(url.removesuffix("/mcp") + "/readyz", timeout=10)
        assert ready.status_code == 503 and ready.json()["ready"] is False  # its only server is down
    finally:
        stop_process(process)


def test_connections_the_gateway_accepts_do_not_wait_for_nagle() -> None:
    """asyncio (and so uvicorn) turns Nagle's algorithm off (TCP_NODELAY) only on connections of a
    listening socket made for IPPROTO_TCP; with protocol 0, every response met the client's
    delayed ACK and stalled about 40 ms. The socket `serve` binds must be such a socket."""
    import asyncio

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=bind_socket("127.0.0.1", 0))
        async with server:
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
            try:
                return await asyncio.wait_for(seen, 10)
            finally:
                writer.close()

    assert asyncio.run(accepted_nodelay()) != 0


REGIONAL_PLUGIN = '''
"""A plugin server with a tool whose `region` argument is mirrored in an `Mcp-Param-Region` header."""
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from gateway.hookspecs import hookimpl


@hookimpl
def gateway_register_servers(register, settings):
    server = MCPServer("regional")

    @server.tool()
    def locate(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
        """Say where the call was routed."""
        return f"routed to {region}"

    register("regional", server)
'''


def modern_tool_call(name: str, arguments: dict[str, object]) -> dict[str, object]:
    """A 2026-07-28 `tools/call`: no session, the protocol envelope in `_meta`."""
    meta = {
        types.PROTOCOL_VERSION_META_KEY: "2026-07-28",
        types.CLIENT_CAPABILITIES_META_KEY: {},
        types.CLIENT_INFO_META_KEY: {"name": "t", "version": "1"},
    }
    return {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta},
    }


def test_mcp_param_headers_are_checked_against_the_called_tools_schema(tmp_path: Path) -> None:
    """A 2026-07-28 `tools/call` whose `Mcp-Param-*` header disagrees with its argument is refused
    before it reaches the server; the gateway finds the tool's schema by name (the SDK would list
    the whole catalog on every call to find it). Raw requests: the SDK's client would list the
    tools again and retry with the right header."""
    (tmp_path / "plugins" / "regional").mkdir(parents=True)
    (tmp_path / "plugins" / "regional" / "__init__.py").write_text(REGIONAL_PLUGIN)
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    env = NO_EMBEDDINGS | {"GATEWAY_PLUGINS__DIRECTORY": str(tmp_path / "plugins")}
    process, url = start_gateway_http(config, tmp_path, env)
    headers = HEADERS | {
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "regional__locate",
    }
    try:
        agreed = httpx2.post(
            url,
            headers=headers | {"Mcp-Param-Region": "north"},
            json=modern_tool_call("regional__locate", {"region": "north"}),
            timeout=10,
        )
        refused = httpx2.post(
            url,
            headers=headers | {"Mcp-Param-Region": "north"},
            json=modern_tool_call("regional__locate", {"region": "south"}),
            timeout=10,
        )
    finally:
        stop_process(process)
    assert agreed.status_code == 200 and "routed to north" in agreed.text
    assert refused.status_code == 400
    assert "Mcp-Param-Region header does not match" in refused.json()["error"]["message"]


def open_sessions_metric(base: str) -> float:
    metrics = httpx2.get(f"{base}/metrics", timeout=10).text
    gauge = next(line for line in metrics.splitlines() if line.startswith("mcp_gateway_http_sessions "))
    return float(gauge.split()[1])


def test_sessions_a_client_left_open_are_closed_when_idle(tmp_path: Path) -> None:
    """A client that went away without DELETE does not hold its session for ever: after
    `session_idle_timeout` without a request it is closed (its id is unknown), and
    `mcp_gateway_http_sessions` counts it out."""
    env = NO_EMBEDDINGS | {"GATEWAY_HTTP__SESSION_IDLE_TIMEOUT": "1"}
    process, url = start_gateway_http(write_config(tmp_path / "gw.yaml", "mcps: {}\n"), tmp_path, env)
    base = url.rsplit("/", 1)[0]
    try:
        opened = [httpx2.post(url, headers=HEADERS, json=INITIALIZE, timeout=30) for _ in range(2)]
        assert [r.status_code for r in opened] == [200, 200]
        first = opened[0].headers["mcp-session-id"]
        deadline = time.monotonic() + 60  # a bound on a hang, generous under load; idle after 1 s
        while open_sessions_metric(base) > 0:
            assert time.monotonic() < deadline, "the idle sessions were not closed within 60 s"
            time.sleep(0.2)
        gone = httpx2.post(url, headers=HEADERS | {"Mcp-Session-Id": first}, json=INITIALIZE | {"id": 2}, timeout=30)
        assert gone.status_code == 404
        assert httpx2.post(url, headers=HEADERS, json=INITIALIZE, timeout=30).status_code == 200
    finally:
        stop_process(process)


def test_no_more_than_max_sessions_are_open_at_once(tmp_path: Path) -> None:
    """The sessions' number is bounded (`max_sessions`), whatever the clients leave open;
    `mcp_gateway_http_sessions` counts them. (Sessions idle out after the default 30 min: none
    closes while the test runs, however slowly it runs.)"""
    env = NO_EMBEDDINGS | {"GATEWAY_HTTP__MAX_SESSIONS": "2"}
    process, url = start_gateway_http(write_config(tmp_path / "gw.yaml", "mcps: {}\n"), tmp_path, env)
    base = url.rsplit("/", 1)[0]
    try:
        opened = [httpx2.post(url, headers=HEADERS, json=INITIALIZE, timeout=30) for _ in range(3)]
        assert [r.status_code for r in opened] == [200, 200, 503]
        assert "Too many open sessions" in opened[2].text
        assert open_sessions_metric(base) == 2
        first = opened[0].headers["mcp-session-id"]
        closed = httpx2.delete(url, headers=HEADERS | {"Mcp-Session-Id": first}, timeout=30)
        assert closed.status_code == 200, closed.text
        assert httpx2.post(url, headers=HEADERS, json=INITIALIZE, timeout=30).status_code == 200  # room again
        assert open_sessions_metric(base) == 2
    finally:
        stop_process(process)


SHORT_SCRIPT = """\
import sys, anyio
from mcp import Client

async def main(url: str) -> None:
    async with Client(url) as client:
        result = await client.call_tool("notes__add_note", {"title": "groceries", "text": "milk"})
        print(result.content[0].text)

anyio.run(main, sys.argv[1])
"""


def test_a_short_sdk_script_that_adds_a_note_and_closes_prints_only_its_result(tmp_path: Path) -> None:
    """The notes server's resource list changes with the note, and the gateway tells its clients so.
    With the SDK client's default protocol (2026-07-28) no stream is left open to receive that after
    the script closes: nothing but the result is printed (the handshake era's standing GET stream
    is where the SDK client logs "Error parsing SSE message", docs/compatibility.md)."""
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    built_ins = {"GATEWAY_PLUGINS__DIRECTORY": str(REPO / "plugins")}
    process, url = start_gateway_http(config, tmp_path, NO_EMBEDDINGS | built_ins)
    script = tmp_path / "short.py"
    script.write_text(SHORT_SCRIPT)
    try:
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, str(script), url], capture_output=True, text=True, timeout=60, cwd=tmp_path
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("Added note 'groceries"), done.stdout
            assert done.stderr == "", done.stderr
    finally:
        stop_process(process)


# ---- connection hygiene (gateway/serving/connections.py) --------------------------------------


async def _open(port: int, count: int, first_bytes: bytes) -> list[anyio.abc.SocketStream]:
    streams = []
    for _ in range(count):
        stream = await anyio.connect_tcp("127.0.0.1", port)
        if first_bytes:
            await stream.send(first_bytes)
        streams.append(stream)
    return streams


async def _answer_then_close(stream: anyio.abc.SocketStream) -> bytes:
    """What the gateway sends before it closes the connection (b"" for a plain close)."""
    received = b""
    try:
        while True:
            received += await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
        return received
    finally:
        await stream.aclose()


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


SERVER_STACKS = [
    pytest.param({}, id="default"),  # httptools on asyncio
    pytest.param({"GATEWAY_HTTP__EVENT_LOOP": "uvloop"}, id="httptools-uvloop"),
    pytest.param({"GATEWAY_HTTP__PARSER": "h11"}, id="h11-asyncio"),
]
"""The HTTP server's parser and event loop (`http.parser`, `http.event_loop`): the connection guard
(`gateway.serving.connections`) subclasses either parser's protocol."""


def test_the_parser_and_loop_settings_choose_uvicorns_protocol_and_anyios_loop() -> None:
    assert parser_protocol("auto") is HttpToolsProtocol and parser_protocol("httptools") is HttpToolsProtocol
    assert parser_protocol("h11") is H11Protocol
    assert loop_options(Settings(), "http") == {}  # asyncio unless asked
    assert loop_options(Settings(http=HttpSettings(event_loop="auto")), "http") == {"use_uvloop": True}  # installed
    assert loop_options(Settings(http=HttpSettings(event_loop="uvloop")), "http") == {"use_uvloop": True}
    assert loop_options(Settings(http=HttpSettings(event_loop="uvloop")), "stdio") == {}  # stdio: asyncio


@pytest.mark.anyio
@pytest.mark.parametrize("stack", SERVER_STACKS)
async def test_slow_and_silent_connections_are_closed_within_the_header_timeout_while_a_client_is_served(
    tmp_path: Path, stack: dict[str, str]
) -> None:
    """300 connections that send nothing and 300 that send half a request's headers (as the probe did):
    each is answered 408 and closed after `header_timeout`, while a real SDK client keeps calling."""
    env = (
        NO_EMBEDDINGS
        | stack
        | {"GATEWAY_HTTP__HEADER_TIMEOUT": "2", "GATEWAY_HTTP__MAX_CONNECTIONS_PER_CLIENT": "2000"}
    )
    process, url = start_gateway_http(write_config(tmp_path / "gw.yaml", "mcps: {}\n"), tmp_path, env)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    half = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl"
    served: list[bool] = []
    try:
        with anyio.fail_after(90):
            async with Client(url) as client:
                baseline = _open_fds(process.pid)
                slow = await _open(port, 300, b"") + await _open(port, 300, half)
                opened = time.monotonic()
                async with anyio.create_task_group() as tg:
                    answers: list[bytes] = []

                    async def watch(stream: anyio.abc.SocketStream) -> None:
                        answers.append(await _answer_then_close(stream))

                    for stream in slow:
                        tg.start_soon(watch, stream)
                    while len(answers) < len(slow):
                        result = await client.call_tool("mem__echo", {"text": "still served"})
                        served.append(not result.is_error)
                        await anyio.sleep(0.1)
                closed_after = time.monotonic() - opened
                assert served and all(served)  # served while the slow connections were held
                assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), {a[:40] for a in answers}
                with anyio.fail_after(10):
                    while _open_fds(process.pid) > baseline + 10:  # the server's side is closed too
                        await anyio.sleep(0.05)
    finally:
        stop_process(process)
    print(f"600 slow connections closed after {closed_after:.1f} s (header_timeout 2 s)")


@pytest.mark.anyio
@pytest.mark.parametrize("stack", SERVER_STACKS)
async def test_one_address_holds_at_most_max_connections_per_client(tmp_path: Path, stack: dict[str, str]) -> None:
    env = NO_EMBEDDINGS | stack | {"GATEWAY_HTTP__MAX_CONNECTIONS_PER_CLIENT": "20"}
    process, url = start_gateway_http(write_config(tmp_path / "gw.yaml", "mcps: {}\n"), tmp_path, env)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        with anyio.fail_after(60):
            held = await _open(port, 20, b"")
            [refused] = await _open(port, 1, b"")
            answer = await _answer_then_close(refused)
            assert answer.startswith(b"HTTP/1.1 503 ") and b"http.max_connections_per_client" in answer
            for stream in held:
                await stream.aclose()
            async with Client(url) as client:  # freed: a client is served again
                assert not (await client.call_tool("mem__echo", {"text": "back"})).is_error
    finally:
        stop_process(process)
