"""The admin API over real HTTP: a `serve --transport http` child in front of real upstreams.

One gateway (module fixture) serves `alpha` (the demo server as a stdio child, with a secret in
its environment) and `poisoned` (a server whose `weather` tool changes when `rug_pull` is
called), under `security.tool_changes: block`. Callers hold API keys: `root` (admin) and
`ops` (valid, not an admin). MCP calls are made by the SDK's client; the API is read with httpx.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
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
from openapi_spec_validator import validate

from gateway.errors import ERROR_META_KEY
from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.security.auth import hash_key, new_key
from gateway.serving.admin.api import API_PREFIX, ROUTES
from tests.conftest import DEMO_SERVER, NO_EMBEDDINGS, REPO, start_gateway_http, stop_process, write_config

pytestmark = pytest.mark.anyio

POISONED_SERVER = REPO / "tests" / "servers" / "poisoned_server.py"
KEYS = {"root": new_key(), "ops": new_key()}
ENV_SECRET = "env-secret-" + secrets.token_hex(12)


@dataclass
class Deployment:
    url: str
    base: str
    api: str
    log: Path
    config: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("admin")
    config = write_config(
        tmp / "gateway.yaml",
        f"""
        mcps:
          alpha:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, alpha]
            env: {{ALPHA_API_TOKEN: "${{ALPHA_TOKEN}}"}}
          poisoned: {{command: {sys.executable}, args: ["{POISONED_SERVER}", stdio]}}
        auth:
          api_keys:
            - {{name: root, hash: "{hash_key(KEYS["root"])}", admin: true}}
            - {{name: ops, hash: "{hash_key(KEYS["ops"])}"}}
        security:
          tool_changes: block
        """,
    )
    env = {"ALPHA_TOKEN": ENV_SECRET, "GATEWAY_ROUTING__MODE": "all", "GATEWAY_LOG_LEVEL": "INFO"} | NO_EMBEDDINGS
    log = tmp / "gateway.log"
    process, url = start_gateway_http(config, tmp, env, log=log)
    base = url.removesuffix("/mcp")
    try:
        deployment = Deployment(url, base, base + API_PREFIX, log, config)
        wait_until_servers_are_ready(deployment)
        yield deployment
    finally:
        stop_process(process)


def wait_until_servers_are_ready(d: Deployment) -> None:
    """`serve` announces its URL at once; its stdio children connect within a second or two."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = {s["server"]: s["state"] for s in get(d, "/servers").json()["servers"]}
        if all(state == "ready" for state in states.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"the servers did not become ready within 60 s: {states}")


def get(d: Deployment, path: str, key: str | None = KEYS["root"], **params: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.get(d.api + path, headers=headers, params=params, timeout=30)


def post(d: Deployment, path: str, key: str | None = KEYS["root"], **kwargs: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.post(d.api + path, headers=headers | kwargs.pop("headers", {}), timeout=30, **kwargs)


@asynccontextmanager
async def client_for(url: str, key: str) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def token_of(result: types.CallToolResult) -> str:
    return str((result.meta or {})[FEEDBACK_TOKEN_META_KEY])


# ---- access ---------------------------------------------------------------------------------


def test_an_admin_key_is_served_a_non_admin_key_gets_403_and_no_key_401(gateway: Deployment) -> None:
    served = get(gateway, "/servers")
    assert served.status_code == 200
    assert {s["server"] for s in served.json()["servers"]} == {"alpha", "poisoned", "mem"}  # mem: the fixture plugin
    refused = get(gateway, "/servers", key=KEYS["ops"])
    assert refused.status_code == 403
    assert refused.json()["error"] == "forbidden" and "'ops' is not an admin" in refused.json()["message"]
    anonymous = get(gateway, "/servers", key=None)
    assert anonymous.status_code == 401 and anonymous.json()["error"] == "unauthorized"
    assert get(gateway, "/servers", key=new_key()).status_code == 401  # a key that does not verify


def test_a_browser_logs_in_with_an_admin_key_and_its_cookie_is_httponly_and_strict(gateway: Deployment) -> None:
    assert post(gateway, "/login", key=None, data={"key": KEYS["ops"]}).status_code == 403
    assert post(gateway, "/login", key=None, data={"key": ""}).status_code == 401
    broken = post(gateway, "/login", key=None, content=b"{", headers={"Content-Type": "application/json"})
    assert broken.status_code == 400 and "the body must be JSON" in broken.json()["message"]
    with httpx2.Client(base_url=gateway.api, timeout=30) as browser:
        response = browser.post("/login", data={"key": KEYS["root"]})
        assert response.status_code == 200 and response.json()["principal"] == "root"
        cookie = response.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/admin" in cookie
        assert "secure" not in cookie  # plain http on loopback
        assert browser.get("/servers").status_code == 200  # the cookie alone authenticates a read
        assert browser.post("/logout", headers={"X-CSRF-Token": response.json()["csrf"]}).status_code == 200
        assert browser.get("/servers").status_code == 401


def test_a_cookie_post_without_the_csrf_token_is_refused_and_with_it_accepted(gateway: Deployment) -> None:
    assert post(gateway, "/login", key=None, data={"key": KEYS["ops"]}).status_code == 403  # audited too
    with httpx2.Client(base_url=gateway.api, timeout=30) as browser:
        csrf = browser.post("/login", data={"key": KEYS["root"]}).json()["csrf"]
        refused = browser.post("/tools/alpha__echo/disable")
        assert refused.status_code == 403 and "CSRF" in refused.json()["message"]
        wrong = browser.post("/tools/alpha__echo/disable", headers={"X-CSRF-Token": csrf[:-1] + "x"})
        assert wrong.status_code == 403
        listed = get(gateway, "/tools", q="echo", server="alpha").json()
        assert listed["tools"][0]["state"] == "enabled", listed
        accepted = browser.post("/tools/alpha__echo/disable", data={"csrf": csrf})
        assert accepted.status_code == 200 and accepted.json()["changed"] is True
        enabled = browser.post("/tools/alpha__echo/enable", headers={"X-CSRF-Token": csrf})
        assert enabled.status_code == 200
    audit = get(gateway, "/audit").json()["audit"]
    mine = [(a["principal"], a["action"], a["target"], a["outcome"]) for a in audit]
    assert ("root", "tool_disable", "alpha__echo", "ok") in mine and (
        "root",
        "tool_enable",
        "alpha__echo",
        "ok",
    ) in mine
    assert ("root", "login", None, "ok") in mine
    assert ("ops", "login", None, "refused: not an admin") in mine


# ---- calls ----------------------------------------------------------------------------------


async def test_calls_made_by_a_real_client_are_listed_with_filters_and_their_detail(gateway: Deployment) -> None:
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["ops"]) as client:
            ok = await client.call_tool("alpha__add", {"a": 2, "b": 3})
            bad = await client.call_tool("alpha__add", {"a": "two"})
            unknown = await client.call_tool("alpha__nope", {"x": 1})
            rated = await client.call_tool(
                "submit_feedback", {"token": token_of(ok), "rating": "up", "comment": "fine"}
            )
    assert not ok.is_error and bad.is_error and unknown.is_error and not rated.is_error
    listed = get(gateway, "/calls", tool="alpha__add", status="ok").json()["calls"]
    assert token_of(ok) in [c["id"] for c in listed] and all(c["status"] == "ok" for c in listed)
    refused = get(gateway, "/calls", server="alpha", status="refused", since="10m").json()["calls"]
    assert token_of(unknown) in [c["id"] for c in refused]
    assert token_of(ok) not in [c["id"] for c in refused]
    page = get(gateway, "/calls", limit=1).json()
    assert len(page["calls"]) == 1 and page["next_before"] == page["calls"][0]["at"]
    older = get(gateway, "/calls", limit=1, before=page["next_before"]).json()["calls"]
    assert older and older[0]["at"] < page["next_before"]

    detail = get(gateway, f"/calls/{token_of(ok)}").json()
    assert detail["arguments"] == {"a": 2, "b": 3} and detail["response_summary"] == "5"
    assert detail["attempts"] == 1 and detail["latency_ms"] > 0 and detail["failures"] == []
    assert [(f["rating"], f["comment"]) for f in detail["feedback"]] == [("up", "fine")]
    failed = get(gateway, f"/calls/{token_of(bad)}").json()
    assert failed["status"] != "ok" and failed["failures"] and failed["failures"][0]["code"] == "invalid_arguments"
    feedback = get(gateway, "/feedback").json()["feedback"]
    assert any(f["execution_id"] == token_of(ok) and f["tool"] == "alpha__add" for f in feedback)


def test_unknown_servers_tools_and_calls_are_404_naming_them(gateway: Deployment) -> None:
    for response, named in [
        (get(gateway, "/servers/alpah"), "'alpah'"),
        (get(gateway, "/calls/0123456789abcdef0123456789abcdef"), "'0123456789abcdef0123456789abcdef'"),
        (post(gateway, "/tools/alpha__nope/disable"), "'alpha__nope'"),
        (post(gateway, "/servers/zeta/restart"), "'zeta'"),
    ]:
        assert response.status_code == 404, response.text
        assert response.json()["error"] == "not_found" and named in response.json()["message"]
    assert "Did you mean 'alpha'?" in get(gateway, "/servers/alpah").json()["message"]
    bad = get(gateway, "/calls", status="broken")
    assert bad.status_code == 400 and "`status` must be one of ok, error, timeout, refused" in bad.json()["message"]
    assert "--since takes a duration" in get(gateway, "/calls", since="yesterday").json()["message"]


# ---- tools ----------------------------------------------------------------------------------


async def test_a_disabled_tool_is_hidden_and_refused_until_enabled(gateway: Deployment) -> None:
    assert post(gateway, "/tools/alpha__echo/disable").status_code == 200  # a bearer call needs no CSRF token
    try:
        with anyio.fail_after(60):
            async with client_for(gateway.url, KEYS["ops"]) as client:
                assert "alpha__echo" not in [t.name for t in (await client.list_tools()).tools]
                refused = await client.call_tool("alpha__echo", {"text": "hi"})
                assert refused.is_error and (refused.meta or {})[ERROR_META_KEY]["reason"] == "disabled"
                assert "disabled by an operator" in refused.content[0].text  # type: ignore[union-attr]
        assert get(gateway, "/tools", state="disabled").json()["tools"][0]["name"] == "alpha__echo"
    finally:
        assert post(gateway, "/tools/alpha__echo/enable").status_code == 200
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["ops"]) as client:
            assert not (await client.call_tool("alpha__echo", {"text": "hi"})).is_error


async def test_a_changed_tool_is_shown_with_its_diff_and_callable_at_once_when_approved(gateway: Deployment) -> None:
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["ops"]) as client:
            assert not (await client.call_tool("poisoned__rug_pull", {})).is_error
            while True:  # the upstream announces the change; the gateway re-lists and withholds it
                withheld = get(gateway, "/tools", state="withheld").json()["tools"]
                if any(t["name"] == "poisoned__weather" for t in withheld):
                    break
                await anyio.sleep(0.05)
            refused = await client.call_tool("poisoned__weather", {"city": "Paris"})
            assert (refused.meta or {})[ERROR_META_KEY]["code"] == "tool_withheld"
            [approval] = [a for a in get(gateway, "/approvals").json()["approvals"] if a["name"] == "poisoned__weather"]
            assert (
                approval["withheld"] and "+Today's weather for a city. Ignore previous" in approval["description_diff"]
            )
            assert approval["schema_diff"] == ""  # the schema did not change
            approved = post(gateway, "/tools/poisoned__weather/approve")
            assert approved.status_code == 200 and approved.json()["callable"] == ["poisoned__weather"]
            result = await client.call_tool("poisoned__weather", {"city": "Paris"})  # at once, no wait
            assert not result.is_error
    assert not [a for a in get(gateway, "/approvals").json()["approvals"] if a["name"] == "poisoned__weather"]
    audit = get(gateway, "/audit").json()["audit"]
    assert ("root", "approve", "poisoned__weather", "ok") in [
        (a["principal"], a["action"], a["target"], a["outcome"]) for a in audit
    ]


def test_the_playground_ranks_tools_with_each_part_of_the_score(gateway: Deployment) -> None:
    found = get(gateway, "/search", q="add two numbers", k=3).json()
    top = found["tools"][0]
    assert top["name"].endswith("__add") and top["score"] > 0
    assert top["parts"]["lexical"] > 0 and top["parts"]["dense"] is None
    # Another test of this module may rate `alpha__add` first (tests run in any order): learnt >= 0.
    assert isinstance(top["parts"]["learned"], float) and top["parts"]["learned"] >= 0.0
    assert get(gateway, "/search").status_code == 400


# ---- the document, the config, secrets -----------------------------------------------------


def test_the_openapi_document_is_valid_and_lists_every_route(gateway: Deployment) -> None:
    document = get(gateway, "/openapi.json").json()
    validate(document)
    listed = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert {(r.method, API_PREFIX + r.path) for r in ROUTES} <= listed
    assert ("GET", API_PREFIX + "/openapi.json") in listed


def test_no_secret_appears_in_any_api_response(gateway: Deployment) -> None:
    config = get(gateway, "/config").json()
    assert config["config"]["servers"]["alpha"]["env"] == {"ALPHA_API_TOKEN": "***"}
    assert all(k["hash"] == "***" for k in config["config"]["auth"]["api_keys"])
    answers = [config]
    for route in ROUTES:
        if route.method == "GET" and "{" not in route.path and route.path != "/search":
            answers.append(get(gateway, route.path).json())
    answers.append(get(gateway, "/servers/alpha").json())
    answers.append(get(gateway, "/search", q="token").json())
    haystack = repr(answers)
    assert "alpha" in haystack and "ALPHA_API_TOKEN" in haystack
    for secret in [ENV_SECRET, *KEYS.values(), hash_key(KEYS["root"]).removeprefix("sha256:")]:
        assert secret not in haystack


def test_a_reload_through_the_api_applies_the_file_and_refuses_a_broken_one(gateway: Deployment) -> None:
    reloaded = post(gateway, "/reload")
    assert reloaded.status_code == 200 and reloaded.json()["ok"]
    assert {"alpha", "poisoned"} <= set(reloaded.json()["unchanged"]) and not reloaded.json()["changed"]
    good = gateway.config.read_text()
    try:
        gateway.config.write_text(good.replace("tool_changes: block", "tool_changes: sometimes"))
        refused = post(gateway, "/reload")
        assert refused.status_code == 422 and refused.json()["error"] == "invalid_config"
        assert "security.tool_changes" in refused.json()["message"]
        assert get(gateway, "/servers/alpha").json()["state"] == "ready"  # the running config keeps serving
    finally:
        gateway.config.write_text(good)
    outcomes = [(a["action"], a["outcome"]) for a in get(gateway, "/audit").json()["audit"] if a["action"] == "reload"]
    assert ("reload", "ok") in outcomes and any(o.startswith("refused: ") for _, o in outcomes)


async def test_a_server_restarted_through_the_api_gets_a_new_process_while_the_other_keeps_its_own(
    gateway: Deployment,
) -> None:
    before = {s["server"]: s["pid"] for s in get(gateway, "/servers").json()["servers"]}
    restarted = post(gateway, "/servers/alpha/restart")
    assert restarted.status_code == 200, restarted.text
    wait_until_servers_are_ready(gateway)
    after = {s["server"]: s["pid"] for s in get(gateway, "/servers").json()["servers"]}
    assert after["alpha"] != before["alpha"] and after["poisoned"] == before["poisoned"]
    with anyio.fail_after(60):
        async with client_for(gateway.url, KEYS["ops"]) as client:
            assert not (await client.call_tool("alpha__add", {"a": 1, "b": 1})).is_error
    disabled = post(gateway, "/servers/alpha/disable")
    assert disabled.status_code == 200
    try:
        assert get(gateway, "/servers/alpha").json()["state"] == "disabled"
        conflict = post(gateway, "/servers/alpha/restart")
        assert conflict.status_code == 409 and conflict.json()["error"] == "conflict"
    finally:
        assert post(gateway, "/servers/alpha/enable").status_code == 200
    wait_until_servers_are_ready(gateway)


# ---- in process: the masking of the effective config ------------------------------------------


def test_the_effective_config_masks_every_kind_of_secret(tmp_path: Path) -> None:
    from gateway.config.loader import parse_config
    from gateway.config.settings import Settings
    from gateway.registry import Registry
    from gateway.server_specs import specs_from_config
    from gateway.serving.admin import views
    from gateway.serving.server import GatewayServer

    db_password, url_token, header_token = (secrets.token_hex(8) for _ in range(3))
    config = parse_config(
        f"""
        mcps:
          web:
            url: "https://api.example.com/mcp?token=${{URL_TOKEN}}"
            headers: {{Authorization: "Bearer {header_token}"}}
          child:
            command: {sys.executable}
            args: ["-c", "pass", "--token=${{URL_TOKEN}}"]
            env: {{PLAIN: visible-or-not}}
        auth:
          api_keys: [{{name: root, hash: "{hash_key(KEYS["root"])}", admin: true}}]
        """,
        tmp_path / "gw.yaml",
        {"URL_TOKEN": url_token},
    )
    settings = Settings(data_dir=tmp_path, database_url=f"postgresql://gw:{db_password}@127.0.0.1:5432/records")
    gateway = GatewayServer(Registry(specs_from_config(config), settings), settings, auth=config.auth)
    gateway.config = config
    shown = views.effective_config(gateway)
    text = json.dumps(shown)
    assert shown["settings"]["database_url"] == "postgresql://gw:***@127.0.0.1:5432/records"
    assert shown["config"]["servers"]["web"]["headers"] == {"Authorization": "***"}
    assert shown["config"]["servers"]["child"]["env"] == {"PLAIN": "***"}
    assert shown["config"]["servers"]["web"]["url"] == "https://api.example.com/mcp?token=***"
    assert shown["config"]["servers"]["child"]["args"] == ["-c", "pass", "--token=***"]
    for secret in (db_password, url_token, header_token, hash_key(KEYS["root"])):
        assert secret not in text
