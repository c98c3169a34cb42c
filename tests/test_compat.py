"""Third-party MCP servers and clients through the gateway: the quick part of bench/compat.

The servers marked `fast` in `bench/compat/servers.py` (the PyPI ones and a few from npm)
are installed once into the compatibility cache (`$MCP_GATEWAY_COMPAT_CACHE`, default
`~/.cache/mcp-gateway-compat`), then run by the same harness as `python -m bench.compat.run`:
each directly with the SDK client, then through one gateway over stdio and over HTTP.
The installs need PyPI, the npm registry and Node (`scripts/test` installs Node from Debian):
an install that fails, fails the tests, as does a server or client that fails through the gateway.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from bench.compat import install
from bench.compat.clients import ClientRow, run_clients
from bench.compat.harness import Row, run_matrix, scratch
from bench.compat.servers import CLIENTS, SERVERS, CompatClient, CompatServer
from gateway.config.loader import load_config
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.server_specs import specs_from_config
from tests.conftest import free_port, stop_process, write_config

REPO = Path(__file__).resolve().parent.parent
FAST = [s for s in SERVERS if s.fast]
TRANSPORTS = ("stdio", "http")


@pytest.fixture(scope="session")
def installed() -> Path:
    """The cache, with the fast servers and the clients installed in it."""
    cache = install.cache_dir()
    install.install_servers(FAST, cache)
    install.install_clients(cache)
    return cache


@pytest.fixture(scope="session")
def matrix(installed: Path) -> Iterator[dict[tuple[str, str], Row]]:
    with scratch() as ctx:
        rows = anyio.run(run_matrix, FAST, installed, ctx)
        yield {(row.server.id, row.transport): row for row in rows}


@pytest.fixture(scope="session")
def client_rows(installed: Path) -> Iterator[dict[tuple[str, str], ClientRow]]:
    with scratch() as ctx:
        rows = anyio.run(run_clients, installed, ctx)
        yield {(row.client.id, row.transport): row for row in rows}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("server", FAST, ids=lambda s: s.id)
def test_a_third_party_server_is_listed_in_full_and_callable_through_the_gateway(
    server: CompatServer,
    transport: str,
    matrix: dict[tuple[str, str], Row],
) -> None:
    row = matrix[(server.id, transport)]
    assert row.ok, f"{server.package} {server.version} over {transport}: " + "; ".join(row.failures)
    assert row.tools == row.direct_tools and row.tools
    assert any(e.startswith("call ") for e in row.exercised) or server.skip_call


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.id)
def test_a_third_party_client_lists_and_calls_tools_through_the_gateway(
    client: CompatClient, transport: str, client_rows: dict[tuple[str, str], ClientRow]
) -> None:
    row = client_rows[(client.id, transport)]
    assert row.ok, f"{row.client.name} over {transport}: " + "; ".join(row.failures)


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "transport", "path"), [("sse", "sse", "sse"), ("streamableHttp", "http", "mcp")])
async def test_a_third_party_server_over_http_or_legacy_sse_is_listed_and_callable_through_the_gateway(
    installed: Path, tmp_path: Path, mode: str, transport: str, path: str
) -> None:
    """The matrix runs its servers as stdio children; `server-everything` (TypeScript SDK) also serves
    streamable HTTP and the legacy HTTP+SSE transport, which reach the gateway's HTTP client."""
    everything = next(s for s in SERVERS if s.id == "everything")
    port = free_port()  # the server takes its port from PORT; a moment's race with another binder
    process = subprocess.Popen(
        [install.server_command(everything, installed), mode],
        env={k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | {"PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with anyio.fail_after(60):
            while True:  # listening once a connection is accepted
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert process.poll() is None, f"server-everything {mode} exited with {process.returncode}"
                    await anyio.sleep(0.1)
            entry = f"mcps:\n  every:\n    url: http://127.0.0.1:{port}/{path}\n    transport: {transport}\n"
            config = load_config(write_config(tmp_path / "gateway.yaml", entry))
            registry = Registry(specs_from_config(config), Settings(data_dir=tmp_path / "data"), relay_requests=False)
            async with registry.running():
                await registry.wait_settled(30)
                upstream = registry.upstreams["every"]
                assert upstream.state == "ready", upstream.reason
                names = [name for name in registry.catalog.tools if name.startswith("every__")]
                assert "every__echo" in names and len(names) >= 10, names
                result = await registry.call_tool("every__echo", {"message": "through the gateway"})
                assert isinstance(result.content[0], types.TextContent)
                assert "through the gateway" in result.content[0].text and not result.is_error
                assert upstream.http_status in (200, 202)  # the statuses reach the supervisor
    finally:
        stop_process(process)


PIP_NOISE = "WARNING: Location 'file:///opt/pypi-more/simple/mcp/' is ignored: it is neither a file nor a directory."


def test_an_install_killed_by_the_system_says_so_and_shows_its_last_words_not_pips_noise() -> None:
    """A pip run killed mid-install (exit -9, as the out-of-memory killer does), after dozens of pip's
    ignored-location warnings: the error names the kill and keeps what the process said itself."""
    script = (
        "import os, sys\n"
        f"for _ in range(60): print({PIP_NOISE!r}, file=sys.stderr)\n"
        "print('Collecting mcp-server-time==2025.9.25', flush=True)\n"
        f"for _ in range(60): print({PIP_NOISE!r}, file=sys.stderr)\n"
        "sys.stderr.flush()\n"
        "os.kill(os.getpid(), 9)\n"
    )
    with pytest.raises(install.InstallError) as caught:
        install.run_step([sys.executable, "-c", script], 60, "pip install mcp-server-time==2025.9.25")
    message = str(caught.value)
    assert "killed by SIGKILL (exit -9)" in message and "out-of-memory" in message
    assert "Collecting mcp-server-time==2025.9.25" in message
    assert "is ignored" not in message


def test_an_install_that_fails_keeps_pips_error_lines_whatever_came_after() -> None:
    script = (
        "import sys\n"
        "print('ERROR: Could not find a version that satisfies the requirement nope==9', file=sys.stderr)\n"
        f"for _ in range(200): print({PIP_NOISE!r}, file=sys.stderr)\n"
        "print('x' * 3000)\n"
        "sys.exit(1)\n"
    )
    with pytest.raises(install.InstallError) as caught:
        install.run_step([sys.executable, "-c", script], 60, "pip install nope==9")
    message = str(caught.value)
    assert message.startswith("pip install nope==9 failed (exit 1):")
    assert "ERROR: Could not find a version that satisfies the requirement nope==9" in message
    assert len(message) < 1600


def test_the_matrix_has_twenty_pinned_servers_each_with_a_safe_call_or_a_reason() -> None:
    assert len(SERVERS) >= 20
    assert len({s.id for s in SERVERS}) == len(SERVERS)
    for server in SERVERS:
        assert re.fullmatch(r"[0-9][0-9A-Za-z.]*", server.version), server
        assert (server.call is None) != (not server.skip_call), server
    kinds = " ".join(s.sdk for s in SERVERS)
    for kind in ("SDK 1.x, low-level", "FastMCP 1.x", "FastMCP 2.x", "SDK 2.x", "TypeScript", "binary inside"):
        assert kind in kinds, kind


def test_the_compatibility_page_lists_every_server_and_client_of_the_matrix() -> None:
    page = (REPO / "docs" / "compatibility.md").read_text()
    for server in SERVERS:
        assert f"`{server.package}`" in page and server.version in page, server.id
    for client in CLIENTS:
        assert client.name in page, client.id
