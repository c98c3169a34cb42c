"""Third-party MCP servers and clients through the gateway: the quick part of bench/compat.

The servers marked `fast` in `bench/compat/servers.py` (the PyPI ones and a few from npm)
are installed once into the compatibility cache (`$MCP_GATEWAY_COMPAT_CACHE`, default
`~/.cache/mcp-gateway-compat`), then run by the same harness as `python -m bench.compat.run`:
each directly with the SDK client, then through one gateway over stdio and over HTTP.
The installs need PyPI, the npm registry and Node (`scripts/test` installs Node from Debian):
an install that fails, fails the tests, as does a server or client that fails through the gateway.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from bench.compat import install
from bench.compat.clients import ClientRow, run_clients
from bench.compat.harness import Row, run_matrix, scratch
from bench.compat.servers import CLIENTS, SERVERS, CompatClient, CompatServer

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
