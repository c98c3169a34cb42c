"""Upstreams behind OAuth (`auth: oauth`): the gateway's own login, per-user links, and what is stored.

Against a real authorization server and a real MCP server requiring its tokens
(`tests/servers/oauth_server.py`, both on 127.0.0.1), with the gateway as a child process and
`mcp-gateway login` as another. The browser's steps are followed by an HTTP client (consent is
automatic at that server: `?user=` says who consents).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import jwt
import mcp_types as types
import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client, MCPError, UrlElicitationRequiredError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.config.loader import ConfigError, load_config
from gateway.config.servers import OAuthConfig
from gateway.errors import ERROR_META_KEY
from gateway.security.auth import hash_key, new_key
from gateway.upstreams.oauth import Grant, LinkFlows, OAuthBinding, OAuthKeyMissing, Vault
from gateway.upstreams.oauth.vault import FileBackend
from tests.conftest import (
    NO_EMBEDDINGS,
    REPO,
    START_DEADLINE,
    _read_line_with_prefix,
    free_port,
    gateway_env,
    start_gateway_http,
    stop_process,
    write_config,
)

pytestmark = pytest.mark.anyio

OAUTH_SERVER = REPO / "tests" / "servers" / "oauth_server.py"
TOKEN_TTL = 2
"""Seconds the test server's access tokens live: short, so the gateway must refresh them."""
FRESH_TOKEN_TTL = 10
"""Token lifetime for tests that need a token still fresh two steps later: the gateway refreshes at
half its lifetime (5 s here; 1 s of `TOKEN_TTL`), room enough for a loaded machine between the steps."""
POLL = "0.2"
"""GATEWAY_OAUTH__POLL_INTERVAL of the gateways under test."""


@dataclass
class Provider:
    """The test's authorization server and the MCP server behind it."""

    process: subprocess.Popen[str]
    issuer: str
    url: str

    def stats(self) -> dict[str, int]:
        return dict(httpx2.get(f"{self.issuer}/admin/stats").json())

    def issued(self) -> list[str]:
        return list(httpx2.get(f"{self.issuer}/admin/issued").json()["tokens"])

    def revoke_user(self, user: str) -> None:
        assert httpx2.post(f"{self.issuer}/admin/revoke", params={"user": user}).json()["revoked"] > 0


def start_provider(transport: str = "http", *extra: str, token_ttl: int = TOKEN_TTL) -> Provider:
    process = subprocess.Popen(
        [sys.executable, str(OAUTH_SERVER), transport, "--token-ttl", str(token_ttl), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    as_port, rs_port = _read_line_with_prefix(process.stdout, "PORTS=", START_DEADLINE, process).split(",")
    path = "mcp" if transport == "http" else "sse"
    return Provider(process, f"http://127.0.0.1:{as_port}", f"http://127.0.0.1:{rs_port}/{path}")


@pytest.fixture
def provider() -> Iterator[Provider]:
    started = start_provider()
    try:
        yield started
    finally:
        stop_process(started.process)


DEBUG_JSON_LOGS = {"GATEWAY_LOG_LEVEL": "DEBUG", "GATEWAY_LOG_FORMAT": "json"}
"""The most a gateway writes in its log: what the leak checks read."""


def assert_no_token_in(issued: list[str], logs: list[Path], data: Path, said: list[str]) -> None:
    """No token or client secret the provider issued (`issued`) in the logs, the data dir (records,
    the encrypted store) or anything the gateway answered (`said`)."""
    issued = [token for token in issued if token]
    assert issued
    files = [*logs, *(path for path in data.rglob("*") if path.is_file())]
    for path in files:
        content = path.read_bytes()
        assert not [token for token in issued if token.encode() in content], f"a token is in {path.name}"
    for text in said:
        assert not [token for token in issued if token in text], f"a token is in an answer: {text[:200]}"


def oauth_env(tmp_path: Path, key: str | None = None) -> dict[str, str]:
    """A gateway child's environment with its own data dir and an OAuth key."""
    return (
        gateway_env(tmp_path)
        | NO_EMBEDDINGS
        | {
            "GATEWAY_OAUTH__KEY": key or Fernet.generate_key().decode(),
            "GATEWAY_OAUTH__POLL_INTERVAL": POLL,
        }
    )


def run_cli(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=START_DEADLINE,
    )


async def browser(url: str, user: str | None = None) -> httpx2.Response:
    """What a person's browser does with the authorization URL: consent (as `user`) and come back."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=30) as client:
        response = await client.get(url, follow_redirects=False)
        consent = response.headers["location"]
        if user is not None:
            consent += f"&user={user}"
        return await client.get(consent)


async def login(config: Path, env: dict[str, str], server: str, log: Path | None = None) -> None:
    """`mcp-gateway login SERVER` with the browser's steps followed (its page says it logged in)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--config", str(config), "login", server, "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        url = "http" + _read_line_with_prefix(process.stdout, "http", START_DEADLINE, process)
        page = await browser(url)
        assert page.status_code == 200 and "Logged in to" in page.text, page.text
        out, err = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=START_DEADLINE))
        assert process.returncode == 0, err
        if log is not None:
            log.write_text(url + "\n" + page.text + out + err)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@asynccontextmanager
async def gateway_client(url: str, token: str | None = None, **kwargs: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), **kwargs) as client:
            yield client


async def wait_for_tool(client: Client, name: str) -> None:
    """Until the gateway lists `name` (its server connected); bounded by the caller's fail_after."""
    while name not in {tool.name for tool in (await client.list_tools()).tools}:
        await anyio.sleep(0.1)


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def error_code(result: types.CallToolResult) -> str:
    assert result.is_error and result.meta is not None, result
    return str(result.meta[ERROR_META_KEY]["code"])


def oauth_config(tmp_path: Path, url: str, auth: str = "oauth", transport: str = "") -> Path:
    return write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          web:
            url: {url}
            {transport}
            auth: {auth}
        """,
    )


# ---- the gateway's own identity ------------------------------------------------------------


async def test_login_then_calls_refresh_and_relogin_after_revocation(provider: Provider, tmp_path: Path) -> None:
    """Discovery, dynamic registration, code + PKCE, a call, refresh on expiry, revocation, a new login."""
    config = oauth_config(tmp_path, provider.url)
    env = oauth_env(tmp_path)
    checked = run_cli(config, env, "check")
    assert checked.returncode == 0, checked.stderr  # needs login is not a failure
    assert re.search(r"web\s+http\s+needs login", checked.stdout), checked.stdout
    assert "run `mcp-gateway login web`" in checked.stdout

    log = tmp_path / "gateway.log"
    said: list[str] = [checked.stdout + checked.stderr]  # everything the gateway answered, for the leak check
    gateway, url = start_gateway_http(config, tmp_path, env | DEBUG_JSON_LOGS, log=log)
    try:
        with anyio.fail_after(240):
            async with gateway_client(url) as client:
                await login(config, env, "web", log=tmp_path / "login.log")
                await wait_for_tool(client, "web__whoami")  # the waiting server picked the grant up
                assert text_of(await client.call_tool("web__whoami", {})) == "operator"
                assert provider.stats()["registrations"] == 1

                await anyio.sleep(TOKEN_TTL + 0.5)  # the access token expired meanwhile
                assert text_of(await client.call_tool("web__whoami", {})) == "operator"
                assert provider.stats()["refreshes"] >= 1

                provider.revoke_user("operator")  # the person revoked the gateway's access at the provider
                await anyio.sleep(TOKEN_TTL + 0.5)
                refused = await client.call_tool("web__whoami", {})
                assert error_code(refused) == "upstream_unauthorized"
                assert "mcp-gateway login web" in text_of(refused)
                said.append(refused.model_dump_json())

                await login(config, env, "web", log=tmp_path / "relogin.log")
                while (result := await client.call_tool("web__whoami", {})).is_error:
                    await anyio.sleep(0.1)  # until the server left needs_login
                assert text_of(result) == "operator"

                servers = run_cli(config, env, "servers", "--json")
                said.append(servers.stdout + servers.stderr)
                assert json.loads(servers.stdout)["servers"][0]["status"] == "ok"
        logout = run_cli(config, env, "logout", "web")
        said.append(logout.stdout + logout.stderr)
        assert logout.returncode == 0 and "revoked at the server and deleted" in logout.stdout, logout.stderr
        assert provider.stats()["revocations"] >= 1
        assert not list((tmp_path / "data" / "oauth" / "web").glob("gateway*"))
    finally:
        stop_process(gateway)
    assert "refreshed its OAuth access token" in log.read_text()  # the log was captured, at DEBUG
    logs = [log, tmp_path / "login.log", tmp_path / "relogin.log"]
    assert_no_token_in(provider.issued(), logs, tmp_path / "data", said)


async def test_a_token_endpoint_that_is_down_at_refresh_time_is_named_not_the_server(
    provider: Provider, tmp_path: Path
) -> None:
    """The authorization server goes down while the MCP server stays up: when the access token needs
    refreshing, the call's error and the server's state name the token endpoint, not the MCP server."""
    config = oauth_config(tmp_path, provider.url)
    env = oauth_env(tmp_path)
    gateway, url = start_gateway_http(config, tmp_path, env)
    try:
        with anyio.fail_after(240):
            async with gateway_client(url) as client:
                await login(config, env, "web")
                await wait_for_tool(client, "web__whoami")
                assert text_of(await client.call_tool("web__whoami", {})) == "operator"

                provider.process.send_signal(signal.SIGUSR1)  # the authorization server alone stops
                while True:  # until its port refuses connections
                    try:
                        httpx2.get(provider.issuer + "/admin/stats", timeout=5)
                    except httpx2.ConnectError:
                        break
                    await anyio.sleep(0.1)
                await anyio.sleep(TOKEN_TTL + 0.5)  # the access token expired meanwhile
                failed = await client.call_tool("web__whoami", {})
                message = text_of(failed)
                assert error_code(failed) in ("upstream_unavailable", "exceeded_retries"), message
                assert f"token endpoint {provider.issuer}/token" in message, message
                assert "could not be reached" not in message, "the MCP server was not the one down"
                readyz = httpx2.get(url.removesuffix("/mcp") + "/readyz", timeout=10).json()
                [web] = [server for server in readyz["servers"] if server["server"] == "web"]
                assert f"token endpoint {provider.issuer}/token" in (web["reason"] or ""), web
    finally:
        stop_process(gateway)


async def test_logging_in_again_reuses_the_client_registration_and_logout_leaves_nothing_behind(
    provider: Provider, tmp_path: Path
) -> None:
    """With the default `callback_port: 0`: the second login registers no second client, and logout
    deletes the registration with the tokens."""
    config = oauth_config(tmp_path, provider.url)
    env = oauth_env(tmp_path)
    with anyio.fail_after(240):
        await login(config, env, "web")
        await login(config, env, "web")
    assert provider.stats()["registrations"] == 1
    stored = tmp_path / "data" / "oauth" / "web"
    assert [path.name for path in stored.glob("client-*.fernet")], "the registration is kept between logins"
    logout = run_cli(config, env, "logout", "web")
    assert logout.returncode == 0, logout.stderr
    assert sorted(path.name for path in stored.iterdir()) == []


async def test_a_pre_registered_client_from_the_environment(tmp_path: Path) -> None:
    secret = "cs-" + os.urandom(12).hex()
    port = free_port()  # a pre-registered client's redirect URI is fixed
    provider = start_provider("http", "--client", f"gateway-client:{secret}@http://127.0.0.1:{port}/callback")
    try:
        secret_ref = "'${WEB_CLIENT_SECRET}'"
        auth = f"{{type: oauth, client_id: gateway-client, client_secret: {secret_ref}, callback_port: {port}}}"
        config = oauth_config(tmp_path, provider.url, auth)
        env = oauth_env(tmp_path) | {"WEB_CLIENT_SECRET": secret}
        log = tmp_path / "gateway.log"
        gateway, url = start_gateway_http(config, tmp_path, env, log=log)
        try:
            with anyio.fail_after(240):
                async with gateway_client(url) as client:
                    await login(config, env, "web", log=tmp_path / "login.log")
                    await wait_for_tool(client, "web__whoami")
                    await anyio.sleep(TOKEN_TTL + 0.5)  # the refresh authenticates the client with its secret
                    assert text_of(await client.call_tool("web__whoami", {})) == "operator"
            stats = provider.stats()
            assert stats["registrations"] == 0 and stats["refreshes"] >= 1
            servers = run_cli(config, env, "servers", "--json")
            assert secret not in servers.stdout + servers.stderr
        finally:
            stop_process(gateway)
        for path in [log, tmp_path / "login.log", *(tmp_path / "data").rglob("*")]:
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path.name
    finally:
        stop_process(provider.process)


async def test_an_upstream_speaking_only_sse(tmp_path: Path) -> None:
    provider = start_provider("sse")
    try:
        config = oauth_config(tmp_path, provider.url, transport="transport: sse")
        env = oauth_env(tmp_path)
        gateway, url = start_gateway_http(config, tmp_path, env)
        try:
            with anyio.fail_after(240):
                async with gateway_client(url) as client:
                    await login(config, env, "web")
                    await wait_for_tool(client, "web__whoami")
                    assert text_of(await client.call_tool("web__whoami", {})) == "operator"
                    await anyio.sleep(TOKEN_TTL + 0.5)
                    assert text_of(await client.call_tool("web__whoami", {})) == "operator"
                    assert provider.stats()["refreshes"] >= 1
        finally:
            stop_process(gateway)
    finally:
        stop_process(provider.process)


# ---- the store and the config ---------------------------------------------------------------


def _grant() -> Grant:
    return Grant(
        access_token="at-secret-value",
        refresh_token="rt-secret-value",
        token_endpoint="http://x/token",
        client_id="c",
        expires_at=None,
    )


async def test_tokens_are_stored_encrypted_and_only_for_the_owner(tmp_path: Path) -> None:
    key = Fernet.generate_key().decode()
    binding = OAuthBinding("web", "http://127.0.0.1:1/mcp", OAuthConfig(), Vault(FileBackend(tmp_path), key))
    await binding.save(None, _grant())
    await binding.save("key:ada", _grant().model_copy(update={"access_token": "at-ada"}))
    files = sorted(tmp_path.rglob("*.fernet"))
    assert len(files) == 2 and all(f.stat().st_mode & 0o077 == 0 for f in files)
    assert not any(b"secret-value" in f.read_bytes() or b"ada" in f.read_bytes() for f in files)
    assert all("ada" not in f.name for f in files)  # a caller's slot is a hash
    loaded = await binding.grant(None)
    assert loaded is not None and loaded.access_token == "at-secret-value"
    assert "secret-value" not in repr(loaded)
    other = OAuthBinding(
        "web", binding.url, OAuthConfig(), Vault(FileBackend(tmp_path), Fernet.generate_key().decode())
    )
    with pytest.raises(Exception, match="cannot be decrypted with the configured key"):
        await other.grant(None)


async def test_without_a_key_nothing_is_stored_and_the_error_says_how_to_make_one(tmp_path: Path) -> None:
    binding = OAuthBinding("web", "http://127.0.0.1:1/mcp", OAuthConfig(), Vault(FileBackend(tmp_path)))
    with pytest.raises(OAuthKeyMissing, match=r"GATEWAY_OAUTH__KEY.*Fernet.generate_key"):
        await binding.save(None, _grant())
    assert not list(tmp_path.rglob("*"))


async def test_login_without_a_key_refuses_before_sending_anyone_anywhere(provider: Provider, tmp_path: Path) -> None:
    config = oauth_config(tmp_path, provider.url)
    env = {k: v for k, v in oauth_env(tmp_path).items() if k != "GATEWAY_OAUTH__KEY"}
    result = run_cli(config, env, "login", "web", "--no-browser")
    assert result.returncode == 2 and "GATEWAY_OAUTH__KEY" in result.stderr and "http" not in result.stdout
    assert provider.stats()["registrations"] == 0


def test_auth_oauth_is_for_http_and_sse_servers(tmp_path: Path) -> None:
    path = write_config(tmp_path / "g.yaml", "mcps:\n  local:\n    command: echo\n    auth: oauth\n")
    with pytest.raises(ConfigError, match=r"g.yaml:2: mcps.local: `auth: oauth` applies to http/sse"):
        load_config(path)


def test_a_bad_auth_entry_is_named(tmp_path: Path) -> None:
    path = write_config(tmp_path / "g.yaml", "mcps:\n  web:\n    url: http://127.0.0.1:1/mcp\n    auth: basic\n")
    with pytest.raises(ConfigError, match=r"mcps.web.auth: must be `oauth` or a mapping"):
        load_config(path)
    body = "mcps:\n  web:\n    url: http://127.0.0.1:1/mcp\n    auth: {type: oauth, client_secret: s}\n"
    with pytest.raises(ConfigError, match=r"mcps.web.auth: .*`client_secret` needs `client_id`"):
        load_config(write_config(tmp_path / "g.yaml", body))


def test_a_client_secret_from_a_file_never_shows_in_the_config_repr(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("file-secret-123\n")
    body = (
        "mcps:\n  web:\n    url: http://127.0.0.1:1/mcp\n"
        "    auth: {type: oauth, client_id: gw, client_secret_file: secret.txt}\n"
    )
    server = load_config(write_config(tmp_path / "g.yaml", body)).servers["web"]
    assert server.auth is not None and server.auth.client_secret == "file-secret-123"
    assert "file-secret-123" not in repr(server)


# ---- per user -------------------------------------------------------------------------------


async def link_as(url: str, user: str) -> None:
    """A caller's browser following a link URL, consenting at the provider as `user`."""
    page = await browser(url, user)
    assert page.status_code == 200 and f"Linked web for {user}" in page.text, page.text


async def test_each_caller_reaches_the_server_with_their_own_linked_account(provider: Provider, tmp_path: Path) -> None:
    keys = {user: new_key() for user in ("ada", "bob")}
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          web:
            url: {provider.url}
            auth: {{type: oauth, per_user: true}}
        auth:
          api_keys:
            - {{name: ada, hash: "{hash_key(keys["ada"])}"}}
            - {{name: bob, hash: "{hash_key(keys["bob"])}"}}
        """,
    )
    env = oauth_env(tmp_path)
    log = tmp_path / "gateway.log"
    gateway, url = start_gateway_http(config, tmp_path, env | DEBUG_JSON_LOGS, log=log)
    base = url.rsplit("/", 1)[0]
    said: list[str] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    try:
        with anyio.fail_after(240):
            await login(config, env, "web", log=tmp_path / "login.log")  # the catalog's listing only
            async with gateway_client(url, keys["ada"]) as ada:
                await wait_for_tool(ada, "web__whoami")
                refused = await ada.call_tool("web__whoami", {})  # not linked: never the gateway's account
                assert error_code(refused) == "upstream_unauthorized"
                assert refused.meta is not None and "operator" not in text_of(refused)
                said.append(refused.model_dump_json())
                connect_url = refused.meta[ERROR_META_KEY]["connect_url"]
                assert connect_url in text_of(refused)
                await link_as(connect_url, "ada")
                assert text_of(await ada.call_tool("web__whoami", {})) == "ada"

                async with gateway_client(url, keys["bob"], elicitation_callback=elicit) as bob:
                    with pytest.raises(MCPError) as raised:  # a client that shows URLs gets a URL elicitation
                        await bob.call_tool("web__whoami", {})
                    assert raised.value.error.code == types.URL_ELICITATION_REQUIRED
                    said.append(raised.value.error.model_dump_json())
                    [elicitation] = UrlElicitationRequiredError.from_error(raised.value.error).elicitations
                    await link_as(elicitation.url, "bob")
                    assert text_of(await bob.call_tool("web__whoami", {})) == "bob"
                    assert text_of(await ada.call_tool("web__whoami", {})) == "ada"

                    # GET /connect/web as bob: the authorization URL for his account (JSON when asked)
                    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {keys['bob']}"}) as http:
                        started = await http.get(f"{base}/connect/web", headers={"Accept": "application/json"})
                        assert started.status_code == 200 and started.json()["authorization_url"].startswith(
                            provider.issuer
                        )
                        unlinked = await http.delete(f"{base}/connect/web")
                        said.append(started.text + unlinked.text)
                        assert unlinked.json() == {"server": "web", "unlinked": True, "revoked": True}
                    with pytest.raises(MCPError):  # unlinked: asked to link again
                        await bob.call_tool("web__whoami", {})

                provider.revoke_user("ada")  # ada revoked the gateway's access at the provider
                await anyio.sleep(TOKEN_TTL + 0.5)
                ended = await ada.call_tool("web__whoami", {})
                said.append(ended.model_dump_json())
                assert error_code(ended) == "upstream_unauthorized" and "connect_url" in ended.meta[ERROR_META_KEY]
                assert "operator" not in text_of(ended) and "bob" not in text_of(ended)
            async with httpx2.AsyncClient() as anonymous:
                assert (await anonymous.get(f"{base}/connect/web")).status_code == 401
                bad = await anonymous.get(f"{base}/connect/callback", params={"state": "forged", "code": "x"})
                said.append(bad.text)
                assert bad.status_code == 400 and "unknown, used or expired" in bad.text
    finally:
        stop_process(gateway)
    assert_no_token_in(provider.issued(), [log, tmp_path / "login.log"], tmp_path / "data", said)


def test_check_without_a_key_says_how_to_make_one(provider: Provider, tmp_path: Path) -> None:
    config = oauth_config(tmp_path, provider.url)
    env = {k: v for k, v in oauth_env(tmp_path).items() if k != "GATEWAY_OAUTH__KEY"}
    checked = run_cli(config, env, "check")
    assert checked.returncode == 1 and re.search(r"web\s+http\s+failed", checked.stdout), checked.stdout
    assert "no key is configured: set GATEWAY_OAUTH__KEY" in checked.stdout


class _ReadsOneStaleCopy(FileBackend):
    """A replica's view of the shared store that read the grant just before another replica refreshed it."""

    def __init__(self, root: Path, stale: bytes) -> None:
        super().__init__(root)
        self.stale: bytes | None = stale

    def read(self, server: str, slot: str) -> bytes | None:
        stale, self.stale = self.stale, None
        return stale if stale is not None else super().read(server, slot)


async def test_a_replica_whose_refresh_lost_the_race_uses_the_grant_the_other_stored(tmp_path: Path) -> None:
    provider = start_provider(token_ttl=FRESH_TOKEN_TTL)  # A's new token is still fresh when B looks
    try:
        await _lose_the_refresh_race(provider, tmp_path)
    finally:
        stop_process(provider.process)


async def _lose_the_refresh_race(provider: Provider, tmp_path: Path) -> None:
    key, store = Fernet.generate_key().decode(), tmp_path / "oauth"
    binding = OAuthBinding("web", provider.url, OAuthConfig(), Vault(FileBackend(store), key))
    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            flows = LinkFlows(lambda: tg)
            url = await flows.begin(binding, None, "http://127.0.0.1:9/callback")
            async with httpx2.AsyncClient(timeout=30) as browser_client:
                consent = (await browser_client.get(url)).headers["location"]
                back = parse_qs(urlsplit((await browser_client.get(consent)).headers["location"]).query)
            await flows.complete(back["state"][0], back["code"][0])
        stale = FileBackend(store).read("web", "gateway")
        assert stale is not None
        await anyio.sleep(FRESH_TOKEN_TTL / 2)  # expiring: both replicas want to refresh
        first = await binding.auth(None)._usable(refused=None)  # replica A refreshes; the refresh token rotates
        late = OAuthBinding("web", provider.url, OAuthConfig(), Vault(_ReadsOneStaleCopy(store, stale), key))
        auth = late.auth(None)
        second = await auth._usable(refused=None)  # replica B's refresh token was just rotated away
        assert auth.needs_login is None and second.access_token == first.access_token
        assert await binding.grant(None) is not None  # not deleted


# ---- RFC 8693 token exchange ----------------------------------------------------------------

JWT_ISSUER = "https://id.example.com/"


def _caller_jwts(tmp_path: Path, users: tuple[str, ...]) -> tuple[Path, dict[str, str]]:
    """A JWKS file and a JWT per user, from one signing key (the callers' identity provider)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    now = int(time.time())
    claims = {"iss": JWT_ISSUER, "aud": "mcp-gateway", "exp": now + 3600, "iat": now}
    return jwks, {u: jwt.encode({**claims, "sub": u}, private, algorithm="RS256", headers={"kid": "k1"}) for u in users}


async def test_a_callers_jwt_is_exchanged_for_their_own_token_without_a_browser(tmp_path: Path) -> None:
    jwks, tokens = _caller_jwts(tmp_path, ("carol", "dave", "eve"))
    secret, port = "cs-" + os.urandom(12).hex(), free_port()
    provider = start_provider(
        "http",
        "--client",
        f"gw:{secret}@http://127.0.0.1:{port}/callback",
        "--exchange-jwks",
        str(jwks),
        "--exchange-issuer",
        JWT_ISSUER,
        token_ttl=FRESH_TOKEN_TTL,  # an exchanged token is kept from one call to the next
    )
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          web:
            url: {provider.url}
            auth:
              type: oauth
              per_user: true
              client_id: gw
              client_secret: ${{WEB_CLIENT_SECRET}}
              callback_port: {port}
              token_exchange: {{token_endpoint: "{provider.issuer}/token"}}
        auth:
          jwt: {{jwks_file: {jwks}, issuer: "{JWT_ISSUER}", audience: mcp-gateway, default_profile: everything}}
          profiles:
            everything: {{}}
        """,
    )
    env = oauth_env(tmp_path) | {"WEB_CLIENT_SECRET": secret}
    log = tmp_path / "gateway.log"
    gateway, url = start_gateway_http(config, tmp_path, env | DEBUG_JSON_LOGS, log=log)
    said: list[str] = []
    try:
        with anyio.fail_after(240):
            await login(config, env, "web", log=tmp_path / "login.log")  # the catalog's listing only
            async with gateway_client(url, tokens["dave"]) as client:
                await wait_for_tool(client, "web__whoami")
                assert text_of(await client.call_tool("web__whoami", {})) == "dave"
            async with gateway_client(url, tokens["carol"]) as client:
                assert text_of(await client.call_tool("web__whoami", {})) == "carol"
                exchanged = provider.stats()["exchanges"]
                assert text_of(await client.call_tool("web__whoami", {})) == "carol"
                assert provider.stats()["exchanges"] == exchanged  # kept until it nears expiry
                await anyio.sleep(FRESH_TOKEN_TTL / 2)
                assert text_of(await client.call_tool("web__whoami", {})) == "carol"
                assert provider.stats()["exchanges"] == exchanged + 1  # exchanged again
                provider.revoke_user("carol")  # the provider ended carol's token: exchanged anew, the call goes on
                assert text_of(await client.call_tool("web__whoami", {})) == "carol"
                assert provider.stats()["exchanges"] == exchanged + 2
            async with gateway_client(url, tokens["eve"]) as client:  # the provider refuses eve's exchange
                refused = await client.call_tool("web__whoami", {})
                said.append(refused.model_dump_json())
                assert error_code(refused) == "upstream_unauthorized"
                assert "refused to exchange the caller's token (invalid_grant)" in text_of(refused)
                assert refused.meta is not None and "connect_url" in refused.meta[ERROR_META_KEY]  # she may link
        issued = [*provider.issued(), secret, *tokens.values()]
    finally:
        stop_process(gateway)
        stop_process(provider.process)
    assert_no_token_in(issued, [log, tmp_path / "login.log"], tmp_path / "data", said)


def test_token_exchange_needs_per_user_and_a_client(tmp_path: Path) -> None:
    body = (
        "mcps:\n  web:\n    url: http://127.0.0.1:1/mcp\n"
        "    auth: {type: oauth, token_exchange: {token_endpoint: 'http://127.0.0.1:2/token'}}\n"
    )
    with pytest.raises(
        ConfigError, match=r"mcps.web.auth: .*`token_exchange` needs `per_user: true` and the `client_id`"
    ):
        load_config(write_config(tmp_path / "g.yaml", body))
