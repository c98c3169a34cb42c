"""The downstream streamable-HTTP transport: loopback by default, DNS-rebinding guard on."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx2
import pytest

from gateway.serving.http import bind_socket
from tests.conftest import NO_EMBEDDINGS, start_gateway_http, stop_process, write_config

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
