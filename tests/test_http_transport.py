"""The downstream streamable-HTTP transport: loopback by default, DNS-rebinding guard on."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from tests.conftest import start_gateway_http, stop_process, write_config

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def gateway_url(tmp_path: Path):  # type: ignore[no-untyped-def]
    process, url = start_gateway_http(write_config(tmp_path / "gw.yaml", "mcps: {}\n"), tmp_path)
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
    assert response.status_code in (403, 421)


def test_a_foreign_origin_is_refused(gateway_url: str) -> None:
    response = httpx2.post(
        gateway_url, headers=HEADERS | {"Origin": "http://evil.example.com"}, json=INITIALIZE, timeout=10
    )
    assert response.status_code == 403
