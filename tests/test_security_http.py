"""Security over real HTTP: authentication, scopes, rate limits, Host/Origin, body size, credentials, leaks.

One gateway (module fixture) serves three upstreams: `alpha` and `beta` (the demo server
as stdio children), `rec` (an HTTP server that records the headers it receives), and the
fixture plugin's in-memory `mem`. Callers hold API keys: `admin` (everything), `alpha`
(profile: server alpha only) and `tight` (a rate limit of 3 at once).
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.cli.main import run
from gateway.errors import ERROR_META_KEY
from gateway.security.auth import hash_key, new_key
from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    start_gateway_http,
    start_script_http,
    stop_process,
    write_config,
)

pytestmark = pytest.mark.anyio

POISONED_SERVER = REPO / "tests" / "servers" / "poisoned_server.py"
KEYS = {name: new_key() for name in ("admin", "alpha", "tight")}
UPSTREAM_TOKEN = "Bearer upstream-" + secrets.token_hex(12)
FILE_SECRET = "file-secret-" + secrets.token_hex(12)
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


@dataclass
class Deployment:
    url: str
    log: Path
    data: Path
    base: str


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("security")
    (tmp / "api-key.txt").write_text(FILE_SECRET + "\n")
    recorder, rec_url = start_script_http([str(POISONED_SERVER), "http"])
    config = write_config(
        tmp / "gateway.yaml",
        f"""
        mcps:
          alpha: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, alpha]}}
          beta: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, beta]}}
          rec:
            url: {rec_url}
            credentials: {{Authorization_env: REC_TOKEN, X-Api-Key_file: api-key.txt}}
        auth:
          api_keys:
            - {{name: admin, hash: "{hash_key(KEYS["admin"])}", admin: true}}
            - {{name: alpha-only, hash: "${{ALPHA_KEY_HASH}}", profile: alpha}}
            - {{name: tight, hash: "{hash_key(KEYS["tight"])}", rate_limit: {{per_minute: 1, burst: 3}}}}
          profiles:
            alpha: {{servers: [alpha]}}
        security:
          limits: {{max_request_bytes: 65536}}
        """,
    )
    env = {"REC_TOKEN": UPSTREAM_TOKEN, "ALPHA_KEY_HASH": hash_key(KEYS["alpha"]), "GATEWAY_LOG_LEVEL": "DEBUG"}
    env["GATEWAY_ROUTING__MODE"] = "all"  # scopes are checked on full lists: the admin sees over 40 tools
    # Lists and the router's first index wait for the stdio servers to connect: under a loaded CI
    # machine a Python child can take longer than the default 5 s, and a search made before then
    # finds nothing of alpha.
    env["GATEWAY_LIST_WAIT"] = "60"
    log = tmp / "gateway.log"
    process, url = start_gateway_http(config, tmp, env, log=log)
    try:
        yield Deployment(url, log, tmp / "data", url.removesuffix("/mcp"))
    finally:
        stop_process(process)
        stop_process(recorder)


@asynccontextmanager
async def client_for(url: str, key: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def post(url: str, body: Any, key: str | None = None, **headers: str) -> httpx2.Response:
    extra = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.post(url, headers=HEADERS | extra | headers, json=body, timeout=10)


async def all_tool_names(client: Client) -> list[str]:
    return [t.name for t in (await client.list_tools()).tools]


def error_code(result: types.CallToolResult) -> str:
    assert result.is_error
    return (result.meta or {})[ERROR_META_KEY]["code"]


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


# ---- authentication -----------------------------------------------------------------


def test_a_request_without_a_key_gets_401_with_the_resource_metadata_challenge(gateway: Deployment) -> None:
    response = post(gateway.url, INITIALIZE)
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{gateway.base}/.well-known/oauth-protected-resource/mcp"' in challenge
    assert post(f"{gateway.base}/route", {"query": "add"}).status_code == 401


def test_a_wrong_key_gets_401_invalid_token(gateway: Deployment) -> None:
    response = post(gateway.url, INITIALIZE, key=new_key())
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    assert response.json()["error"] == "invalid_token"
    assert post(gateway.url, INITIALIZE, Authorization=f"Basic {KEYS['admin']}").status_code == 401


def test_the_protected_resource_metadata_is_public(gateway: Deployment) -> None:
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        response = httpx2.get(gateway.base + path, timeout=10)
        assert response.status_code == 200
        assert response.json()["resource"] == gateway.url
        assert response.json()["bearer_methods_supported"] == ["header"]


async def test_a_valid_key_is_served(gateway: Deployment) -> None:
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["admin"]) as client:
            names = await all_tool_names(client)
            assert {"alpha__echo", "beta__echo", "mem__echo", "rec__seen_headers"} <= set(names)
            result = await client.call_tool("beta__add", {"a": 2, "b": 3})
            assert not result.is_error and text_of(result) == "5"


# ---- scopes ---------------------------------------------------------------------------


async def test_a_key_limited_to_one_server_cannot_list_another_servers_tools(gateway: Deployment) -> None:
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["alpha"]) as client:
            names = await all_tool_names(client)
            assert names and all(n.startswith("alpha__") or n == "submit_feedback" for n in names)
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            assert prompts == ["alpha__greet"]
            resources = [r.uri for r in (await client.list_resources()).resources]
            assert resources and all(u.startswith("alpha+") for u in resources)
            with pytest.raises(Exception, match="Unknown prompt"):
                await client.get_prompt("beta__greet", {"who": "x"})
            with pytest.raises(Exception, match="Unknown resource"):
                await client.read_resource("beta+demo://readme")


@pytest.mark.parametrize("mode", ["search", "dynamic"])
async def test_a_key_limited_to_one_server_cannot_find_another_servers_tools(gateway: Deployment, mode: str) -> None:
    with anyio.fail_after(60):
        async with client_for(f"{gateway.url}?mode={mode}", KEYS["alpha"]) as client:
            result = await client.call_tool("search_tools", {"query": "echo the text back", "limit": 50})
            found = [tool["name"] for tool in (result.structured_content or {})["tools"]]
            assert found and all(name.startswith("alpha__") for name in found)
            names = await all_tool_names(client)
            assert all(n.startswith("alpha__") or n in ("search_tools", "call_tool", "submit_feedback") for n in names)
    response = post(f"{gateway.base}/route", {"query": "echo the text back", "k": 50}, key=KEYS["alpha"])
    assert response.status_code == 200
    routed = [tool["name"] for tool in response.json()["tools"]]
    assert routed and all(name.startswith("alpha__") for name in routed)


async def test_a_hidden_tool_is_not_found_exactly_like_an_unknown_one(gateway: Deployment) -> None:
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["alpha"]) as client:
            hidden = await client.call_tool("beta__add", {"a": 1, "b": 2})
            unknown = await client.call_tool("zeta__add", {"a": 1, "b": 2})
            plugin = await client.call_tool("mem__add", {"a": 1, "b": 2})
            via_search_mode = await client.call_tool("call_tool", {"name": "rec__seen_headers"})
        assert error_code(hidden) == error_code(unknown) == error_code(plugin) == "tool_not_found"
        assert text_of(hidden).replace("beta__add", "X") == text_of(unknown).replace("zeta__add", "X")
        assert "beta" not in text_of(hidden).replace("'beta__add'", "")
        assert error_code(via_search_mode) == "tool_not_found" and "seen_headers" in text_of(via_search_mode)
        assert "rec__" not in text_of(via_search_mode).replace("'rec__seen_headers'", "")


def test_health_probes_need_no_key_and_show_servers_only_to_a_caller(gateway: Deployment) -> None:
    assert httpx2.get(f"{gateway.base}/healthz", headers={"Host": "10.0.0.7:80"}, timeout=10).status_code == 200
    anonymous = httpx2.get(f"{gateway.base}/readyz", timeout=10).json()
    assert "ready" in anonymous and "servers" not in anonymous
    wrong = httpx2.get(f"{gateway.base}/readyz", headers={"Authorization": f"Bearer {new_key()}"}, timeout=10)
    assert "servers" not in wrong.json()
    known = httpx2.get(f"{gateway.base}/readyz", headers={"Authorization": f"Bearer {KEYS['admin']}"}, timeout=10)
    assert {s["server"] for s in known.json()["servers"]} >= {"alpha", "beta", "rec"}


def test_a_session_belongs_to_the_key_that_opened_it(gateway: Deployment) -> None:
    opened = post(gateway.url, INITIALIZE, key=KEYS["admin"])
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    stolen = post(gateway.url, listing, key=KEYS["alpha"], **session)
    assert stolen.status_code == 404 and "beta__" not in stolen.text
    assert post(gateway.url, listing, key=KEYS["admin"], **session).status_code == 200


# ---- rate limits, Host/Origin, body size -------------------------------------------------


def test_exceeding_the_rate_limit_gets_429_with_retry_after(gateway: Deployment) -> None:
    statuses = [post(f"{gateway.base}/route", {"query": "add"}, key=KEYS["tight"]).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "alpha__add", "arguments": {}}}
    response = post(gateway.url, call, key=KEYS["tight"])
    assert response.status_code == 429
    assert 1 <= int(response.headers["retry-after"]) <= 60
    error = response.json()["error"]
    assert "Rate limit exceeded for 'tight'" in error["message"] and error["data"]["retryAfter"] >= 1
    # Another caller is not affected.
    assert post(f"{gateway.base}/route", {"query": "add"}, key=KEYS["admin"]).status_code == 200


@pytest.mark.parametrize(
    "attack", [{"Host": "evil.example.com"}, {"Origin": "http://evil.example.com"}, {"Host": "127.0.0.1.evil.com"}]
)
def test_a_host_or_origin_attack_gets_403_before_authentication(gateway: Deployment, attack: dict[str, str]) -> None:
    for key in (None, KEYS["admin"]):
        assert post(gateway.url, INITIALIZE, key=key, **attack).status_code == 403
        assert post(f"{gateway.base}/route", {"query": "add"}, key=key, **attack).status_code == 403


def test_a_request_body_over_the_limit_gets_413(gateway: Deployment) -> None:
    big = {**INITIALIZE, "params": {**INITIALIZE["params"], "padding": "x" * 70_000}}
    assert post(gateway.url, big, key=KEYS["admin"]).status_code == 413


# ---- upstream credentials and leaks -------------------------------------------------------


async def test_upstream_credentials_come_from_env_and_files_and_the_callers_key_is_never_forwarded(
    gateway: Deployment,
) -> None:
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["admin"]) as client:
            seen = json.loads(text_of(await client.call_tool("rec__seen_headers", {})))
    assert seen["authorization"] == UPSTREAM_TOKEN
    assert seen["x-api-key"] == FILE_SECRET
    assert not any(KEYS["admin"] in value for value in seen.values())


async def test_no_secret_appears_in_logs_errors_or_records(gateway: Deployment) -> None:
    errors: list[str] = []
    for key in (None, new_key(), KEYS["admin"] + "x", UPSTREAM_TOKEN.split()[1]):
        errors.append(post(gateway.url, INITIALIZE, key=key).text)
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["admin"]) as client:
            for name, arguments in [("rec__nope", {}), ("alpha__add", {"a": "not a number"}), ("rec__add", {"a": 1})]:
                errors.append(text_of(await client.call_tool(name, arguments)))
        with pytest.raises(Exception) as refused:
            async with client_for(gateway.url, KEYS["admin"][:-1]) as client:
                await client.list_tools()
        errors.append(repr(refused.value))
    console = [  # the operator console's API shows the config, the servers and the calls (issue 18)
        httpx2.get(f"{gateway.base}/admin/api/v1/{path}", headers={"Authorization": f"Bearer {KEYS['admin']}"}).text
        for path in ("config", "servers", "servers/rec", "calls", "tools", "feedback", "audit")
    ]
    assert '"rec"' in console[0] and "X-Api-Key" in console[0]  # the API answered
    records = [p.read_bytes().decode("utf-8", "replace") for p in gateway.data.rglob("*") if p.is_file()]
    haystack = "\n".join([gateway.log.read_text(), *errors, *records, *console])
    assert "refused POST /mcp" in haystack  # the log was captured: refusals are logged
    for secret in [*KEYS.values(), UPSTREAM_TOKEN, UPSTREAM_TOKEN.split()[1], FILE_SECRET]:
        assert secret not in haystack


# ---- starting up --------------------------------------------------------------------------


def test_the_gateway_refuses_a_public_address_without_authentication(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    code = run(["--config", str(config), "serve", "--transport", "http", "--host", "0.0.0.0", "--port", "0"])
    assert code == 2
    assert "refusing to serve HTTP on 0.0.0.0 without authentication" in capsys.readouterr().err


def test_a_broken_auth_section_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\nauth:\n  api_keys:\n    - name: a\n      hash: abc\n")
    assert run(["--config", str(config), "tools"]) == 2
    err = capsys.readouterr().err
    assert "gw.yaml:5: auth.api_keys[0].hash: must be sha256:<64 hex digits>" in err


# ---- sessions per client ------------------------------------------------------------------------


async def test_a_keys_sessions_are_capped_while_another_key_is_still_served(tmp_path: Path) -> None:
    """One key holder opening handshake-era sessions in a loop takes at most max_sessions_per_client of
    them (503 beyond), so the other keys' clients still get theirs (the cap used to be only global)."""
    hog, other = new_key(), new_key()
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        auth:
          api_keys:
            - {{name: hog, hash: "{hash_key(hog)}"}}
            - {{name: other, hash: "{hash_key(other)}"}}
        """,
    )
    env = NO_EMBEDDINGS | {"GATEWAY_HTTP__MAX_SESSIONS_PER_CLIENT": "3", "GATEWAY_HTTP__MAX_SESSIONS": "5"}
    process, url = start_gateway_http(config, tmp_path, env)
    try:
        with anyio.fail_after(60):
            opened = [post(url, INITIALIZE, hog) for _ in range(5)]
            assert [r.status_code for r in opened] == [200, 200, 200, 503, 503]
            assert "Too many open sessions" in opened[3].text
            served = post(url, INITIALIZE, other)
            assert served.status_code == 200 and served.headers["mcp-session-id"]
            async with client_for(url, other) as client:  # a real SDK client of the other key is served too
                assert not (await client.call_tool("mem__echo", {"text": "served"})).is_error
            session = opened[0].headers["mcp-session-id"]
            ended = httpx2.delete(url, headers=HEADERS | {"Authorization": f"Bearer {hog}", "Mcp-Session-Id": session})
            assert ended.status_code == 200
            assert post(url, INITIALIZE, hog).status_code == 200  # one closed: one more may open
    finally:
        stop_process(process)


async def test_the_screen_remembers_only_what_passed_and_checks_every_other_request_again() -> None:
    from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings

    from gateway.config.security import AuthConfig
    from gateway.security.http_guard import SecurityMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("screen never runs the app")

    settings = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=["127.0.0.1:*"], allowed_origins=["http://127.0.0.1:*"]
    )
    guard = SecurityMiddleware(
        app,
        guard=TransportSecurityMiddleware(settings),
        auth=AuthConfig(),
        endpoint_path="/mcp",
        max_body=1000,
        loopback_only=lambda why: f"no: {why}",
    )

    def scope(*headers: tuple[bytes, bytes], client: str = "127.0.0.1") -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": "/mcp", "headers": list(headers), "client": (client, 5)}

    local = (b"host", b"127.0.0.1:8000")
    for _ in range(2):  # the second time from what the first one remembered
        assert await guard.screen(scope(local, (b"origin", b"http://127.0.0.1:3000"))) is None
    refused = [
        scope((b"host", b"evil.example:8000")),
        scope(local, (b"origin", b"http://evil.example")),
        scope(local, client="203.0.113.9"),
        scope(local, (b"x-forwarded-for", b"203.0.113.9")),
    ]
    for _ in range(2):
        assert [(await guard.screen(each)) is not None for each in refused] == [True] * len(refused)
    assert await guard.screen(scope(local, (b"origin", b"http://127.0.0.1:3000"))) is None
