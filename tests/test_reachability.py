"""Reachable means authenticated: a gateway without `auth:` serves loopback and nobody else.

Behind Debian's nginx (tests/reverse_proxy.py, a child process on 127.0.0.1), a gateway with
no `auth:` refuses every route alike (`/mcp`, `/route`, `/feedback`, `/admin`, `/metrics`) with
a message that says how to add auth, while it still serves a client on loopback directly and
answers the load balancer's health probes. Settings that say the gateway is reachable (allowed
hosts or origins beyond loopback, trusted proxies) stop it at start.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from gateway.cli.main import run
from gateway.config.runtime_settings import HttpSettings
from gateway.security.auth import hash_key, new_key
from gateway.security.reachability import beyond_loopback, is_loopback, request_beyond_loopback
from tests.conftest import NO_EMBEDDINGS, REPO, gateway_env, start_gateway_http, stop_process, write_config
from tests.reverse_proxy import nginx_proxy

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HOW_TO = "mcp-gateway keys new"
"""Part of the sentence that says how to add auth, in every refusal."""


@dataclass
class Proxied:
    direct: str
    """The gateway's own base URL on 127.0.0.1."""
    proxied: str
    """The same gateway through nginx."""
    config: Path


@contextmanager
def _serve_behind_nginx(tmp: Path, auth: str = "", env: dict[str, str] | None = None) -> Iterator[Proxied]:
    config = write_config(tmp / "gateway.yaml", "mcps: {}\n" + auth)
    process, url = start_gateway_http(config, tmp, NO_EMBEDDINGS | (env or {}))
    direct = url.removesuffix("/mcp")
    try:
        with nginx_proxy(tmp, [int(direct.rsplit(":", 1)[1])]) as proxy:
            yield Proxied(direct, proxy.base, config)
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def open_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    """A gateway with no `auth:`, on 127.0.0.1, and nginx in front of it."""
    with _serve_behind_nginx(tmp_path_factory.mktemp("open")) as gateway:
        yield gateway


def _requests(base: str, key: str | None = None) -> dict[str, httpx2.Response]:
    """One request to each kind of route, as a client would send it."""
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx2.Client(base_url=base, headers=auth, timeout=30) as http:
        return {
            "/mcp": http.post("/mcp", json=INITIALIZE, headers=HEADERS),
            "/route": http.post("/route", json={"query": "add two numbers"}),
            "/feedback": http.post("/feedback", json={"token": "x", "rating": 1}),
            "/admin/api/v1/servers": http.get("/admin/api/v1/servers"),
            "/admin": http.get("/admin/"),
            "/metrics": http.get("/metrics"),
        }


def test_behind_nginx_a_gateway_without_auth_refuses_every_endpoint_and_says_how_to_add_auth(
    open_gateway: Proxied,
) -> None:
    answers = _requests(open_gateway.proxied)
    for path, response in answers.items():
        assert response.status_code == 403, (path, response.status_code, response.text)
        message = response.json().get("message", response.text)
        assert "no authentication but is reachable beyond loopback" in message, path
        assert "x-forwarded-for" in message and HOW_TO in message and str(open_gateway.config) in message, path


def test_behind_nginx_the_health_probes_still_answer(open_gateway: Proxied) -> None:
    assert httpx2.get(f"{open_gateway.proxied}/healthz", timeout=30).json() == {"status": "ok"}
    assert httpx2.get(f"{open_gateway.proxied}/readyz", timeout=30).status_code in (200, 503)


def test_the_same_gateway_serves_a_client_on_loopback_directly(open_gateway: Proxied) -> None:
    answers = _requests(open_gateway.direct)
    assert answers["/mcp"].status_code == 200
    assert answers["/route"].status_code == 200
    assert answers["/admin/api/v1/servers"].status_code == 200
    assert answers["/metrics"].status_code == 200


def test_behind_nginx_a_gateway_with_auth_serves_a_key_and_refuses_none(tmp_path: Path) -> None:
    key = new_key()
    auth = f'auth:\n  api_keys:\n    - {{name: ops, hash: "{hash_key(key)}", admin: true}}\n'
    with _serve_behind_nginx(tmp_path, auth) as gateway:
        served = _requests(gateway.proxied, key)
        for path in ("/mcp", "/route", "/admin/api/v1/servers", "/metrics"):
            assert served[path].status_code == 200, (path, served[path].text)
        refused = _requests(gateway.proxied)
        for path in ("/mcp", "/route", "/admin/api/v1/servers", "/metrics"):
            assert refused[path].status_code == 401, (path, refused[path].text)


def test_insecure_no_auth_serves_behind_nginx_when_the_proxy_authenticates(tmp_path: Path) -> None:
    with _serve_behind_nginx(tmp_path, env={"GATEWAY_HTTP__INSECURE_NO_AUTH": "true"}) as gateway:
        served = _requests(gateway.proxied)
        assert served["/mcp"].status_code == 200
        assert served["/route"].status_code == 200


def test_a_gateway_allowed_the_proxys_public_host_name_refuses_to_start_without_auth(tmp_path: Path) -> None:
    """What a same-host nginx needs (the public Host allowed) shows the gateway is reachable."""
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    env = gateway_env(tmp_path) | NO_EMBEDDINGS | {"GATEWAY_HTTP__ALLOWED_HOSTS": '["mcp.example.com"]'}
    command = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "http", "--port", "0"]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "refusing to serve HTTP on 127.0.0.1 without authentication" in done.stderr
    assert "GATEWAY_HTTP__ALLOWED_HOSTS accepts mcp.example.com" in done.stderr
    assert HOW_TO in done.stderr


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        (
            "GATEWAY_HTTP__ALLOWED_ORIGINS",
            '["https://app.example.com"]',
            "ALLOWED_ORIGINS accepts https://app.example.com",
        ),
        ("GATEWAY_HTTP__TRUSTED_PROXIES", '["10.0.0.2"]', "TRUSTED_PROXIES trusts 10.0.0.2"),
    ],
)
def test_origins_or_trusted_proxies_beyond_loopback_need_auth_at_start(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    reason: str,
) -> None:
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(variable, value)
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    assert run(["--config", str(config), "serve", "--transport", "http", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert reason in err and HOW_TO in err


def test_loopback_names_addresses_and_patterns_are_told_from_others() -> None:
    for host in ("127.0.0.1", "127.0.0.1:8765", "127.0.0.1:*", "localhost", "LOCALHOST:80", "::1", "[::1]:8765"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "mcp.example.com", "mcp.example.com:443", "10.0.0.1", "[2001:db8::1]:80", ""):
        assert not is_loopback(host), host


def test_the_settings_say_why_the_gateway_is_reachable() -> None:
    assert beyond_loopback(HttpSettings()) == []
    assert beyond_loopback(HttpSettings(allowed_hosts=["localhost:*"], allowed_origins=["http://127.0.0.1:*"])) == []
    reasons = beyond_loopback(HttpSettings(host="0.0.0.0", allowed_hosts=["mcp.example.com"]))
    assert reasons == ["it listens on 0.0.0.0", "GATEWAY_HTTP__ALLOWED_HOSTS accepts mcp.example.com"]


def test_a_request_shows_it_came_from_beyond_loopback_by_its_headers_client_or_host() -> None:
    local = {"host": "127.0.0.1:8765"}
    assert request_beyond_loopback(local, ("127.0.0.1", 5000)) is None
    assert request_beyond_loopback(local | {"x-real-ip": "203.0.113.9"}, ("127.0.0.1", 1)) is not None
    assert request_beyond_loopback(local | {"forwarded": "for=203.0.113.9"}, ("127.0.0.1", 1)) is not None
    assert request_beyond_loopback(local, ("203.0.113.9", 1)) == "it came from 203.0.113.9"
    assert request_beyond_loopback({"host": "mcp.example.com"}, None) == "it was sent to mcp.example.com"
