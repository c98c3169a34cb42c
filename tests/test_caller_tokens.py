"""A caller's token reaches an upstream only when that server's config says so (`forward_caller_token`).

One gateway over real HTTP with JWT and API-key authentication, in front of the header
recorder (`tests/servers/poisoned_server.py`) twice: as `fwd`, which takes callers' tokens,
and as `own`, which gets only the gateway's credentials. The recorder refuses one token
(a revoked user's).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import jwt
import mcp_types as types
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.config.loader import ConfigError, load_config
from gateway.config.settings import Settings
from gateway.errors import ERROR_META_KEY
from gateway.registry import Registry
from gateway.security.auth import hash_key, new_key
from gateway.server_specs import specs_from_config
from tests.conftest import NO_EMBEDDINGS, REPO, start_gateway_http, start_script_http, stop_process, write_config

pytestmark = pytest.mark.anyio

RECORDER = REPO / "tests" / "servers" / "poisoned_server.py"
ISSUER = "https://id.example.com/"
AUDIENCE = "https://gateway.example.com/mcp"
SERVICE_TOKEN = "service-" + secrets.token_hex(12)
API_KEY = new_key()
STARTUP_TIMEOUT = Settings().startup_timeout


@dataclass
class Deployment:
    url: str
    tokens: dict[str, str]
    """JWTs by user: `ada`, `bob` and `eve` (whose token the upstream refuses)."""


def _jwt(private: Any, subject: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "exp": now + 3600, "iat": now}
    return jwt.encode(claims, private, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("caller-tokens")
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    (tmp / "jwks.json").write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    tokens = {user: _jwt(private, user) for user in ("ada", "bob", "eve")}
    recorder, url = start_script_http([str(RECORDER), "http", "--refuse-bearer", tokens["eve"]])
    config = write_config(
        tmp / "gateway.yaml",
        f"""
        mcps:
          fwd:
            url: {url}
            credentials: {{Authorization_env: SERVICE_TOKEN}}
            forward_caller_token: true
          own:
            url: {url}
            credentials: {{Authorization_env: SERVICE_TOKEN}}
        auth:
          api_keys:
            - {{name: robot, hash: "{hash_key(API_KEY)}"}}
          jwt:
            jwks_file: {tmp / "jwks.json"}
            issuer: {ISSUER}
            audience: {AUDIENCE}
            default_profile: everything
          profiles:
            everything: {{}}
        """,
    )
    gateway, gateway_url = start_gateway_http(config, tmp, NO_EMBEDDINGS | {"SERVICE_TOKEN": f"Bearer {SERVICE_TOKEN}"})
    try:
        yield Deployment(gateway_url, tokens)
    finally:
        stop_process(gateway)
        stop_process(recorder)


@asynccontextmanager
async def client_for(url: str, token: str) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


async def seen_authorization(client: Client, tool: str) -> str:
    result = await client.call_tool(tool, {})
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return str(json.loads(block.text)["authorization"])


async def test_a_server_that_takes_callers_tokens_gets_each_callers_own(deployment: Deployment) -> None:
    with anyio.fail_after(60):
        for user in ("ada", "bob", "ada"):
            async with client_for(deployment.url, deployment.tokens[user]) as client:
                assert await seen_authorization(client, "fwd__seen_headers") == f"Bearer {deployment.tokens[user]}"
                assert await seen_authorization(client, "own__seen_headers") == f"Bearer {SERVICE_TOKEN}"


async def test_a_gateway_api_key_is_never_forwarded(deployment: Deployment) -> None:
    with anyio.fail_after(60):
        async with client_for(deployment.url, API_KEY) as client:
            assert await seen_authorization(client, "fwd__seen_headers") == f"Bearer {SERVICE_TOKEN}"


async def test_a_token_the_server_refuses_is_the_callers_problem_alone(deployment: Deployment) -> None:
    eve = deployment.tokens["eve"]
    with anyio.fail_after(60):
        async with client_for(deployment.url, eve) as client:
            with anyio.fail_after(STARTUP_TIMEOUT / 2):  # a refusal is final: answered without waiting it out
                refused = await client.call_tool("fwd__seen_headers", {})
            assert refused.is_error and refused.meta is not None
            assert refused.meta[ERROR_META_KEY]["code"] == "upstream_unauthorized"
            block = refused.content[0]
            assert isinstance(block, types.TextContent)
            assert "refused the caller's token (HTTP 401)" in block.text and eve not in block.text
            assert await seen_authorization(client, "own__seen_headers") == f"Bearer {SERVICE_TOKEN}"
        async with client_for(deployment.url, deployment.tokens["ada"]) as client:
            assert await seen_authorization(client, "fwd__seen_headers") == f"Bearer {deployment.tokens['ada']}"


@asynccontextmanager
async def _forwarding(tmp_path: Path, url: str, max_sessions: int, idle_seconds: float) -> AsyncIterator[Registry]:
    """A registry whose one server `fwd` (at `url`) forwards the caller's token, running and settled."""
    tmp_path.mkdir()
    config = load_config(
        write_config(tmp_path / "g.yaml", f"mcps:\n  fwd:\n    url: {url}\n    forward_caller_token: true\n")
    )
    registry = Registry(specs_from_config(config), Settings(data_dir=tmp_path / "data"), relay_requests=False)
    registry.caller_sessions.max_sessions, registry.caller_sessions.idle_seconds = max_sessions, idle_seconds
    async with registry.running():
        await registry.wait_settled(20)
        yield registry


async def test_caller_sessions_are_bounded_and_closed_when_idle(tmp_path: Path) -> None:
    recorder, url = start_script_http([str(RECORDER), "http"])
    try:
        with anyio.fail_after(60):
            # Never idle long enough to be closed here, however slowly the machine runs the calls.
            async with _forwarding(tmp_path / "bounded", url, 2, 3600) as registry:
                sessions = registry.caller_sessions
                for caller in ("t1", "t2", "t3"):
                    await registry.call_tool("fwd__seen_headers", {}, caller_token=caller)
                assert len(sessions) == 2  # t1, the least recently used, made room for t3
                await registry.call_tool("fwd__seen_headers", {})  # no token: the shared session
                assert len(sessions) == 2
            async with _forwarding(tmp_path / "idle", url, 2, 0.5) as registry:
                sessions = registry.caller_sessions
                await registry.call_tool("fwd__seen_headers", {}, caller_token="t1")
                assert len(sessions) == 1
                while len(sessions):
                    await anyio.sleep(0.05)  # idle for 0.5 s: closed
                result = await registry.call_tool("fwd__seen_headers", {}, caller_token="t1")
                assert not result.is_error and len(sessions) == 1
    finally:
        stop_process(recorder)


def test_forward_caller_token_is_for_http_servers(tmp_path: Path) -> None:
    path = write_config(tmp_path / "g.yaml", "mcps:\n  local:\n    command: echo\n    forward_caller_token: true\n")
    with pytest.raises(ConfigError, match=r"g.yaml:2: mcps.local: `forward_caller_token` applies to http/sse"):
        load_config(path)
