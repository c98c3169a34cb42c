"""Fuzzing the HTTP JSON-RPC surface and tool arguments with hypothesis, against a real gateway.

Every input must get a clear answer: an HTTP 4xx with a message, or a JSON-RPC
error with a message, or a tool result (an error result carries a sentence). Never
a 5xx, never a traceback in a response, and none in the gateway's log. The runs are
derandomized with a fixed number of examples, so CI tries the same inputs every time;
`docs/security.md` gives the count.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.security.auth import hash_key, new_key
from tests.conftest import DEMO_SERVER, start_gateway_http, stop_process, write_config

KEY = new_key()
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
METHODS = [
    "initialize", "ping", "tools/list", "tools/call", "prompts/list", "prompts/get", "resources/list",
    "resources/read", "resources/templates/list", "resources/subscribe", "completion/complete",
    "logging/setLevel", "server/discover", "subscriptions/listen", "notifications/initialized",
]  # fmt: skip
TOOLS = ["alpha__add", "alpha__echo", "alpha__fail", "mem__add", "search_tools", "call_tool", "nope__x", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@dataclass
class Target:
    url: str
    log: Path
    session: str
    http: httpx2.Client
    tried: dict[str, int] = field(default_factory=dict)

    def post(self, body: bytes, headers: dict[str, str | bytes] | None = None, kind: str = "") -> httpx2.Response:
        sent = HEADERS | {"Authorization": f"Bearer {KEY}", "Mcp-Session-Id": self.session} | (headers or {})
        response = self.http.post(self.url, content=body, headers=sent)
        self.tried[kind] = self.tried.get(kind, 0) + 1
        return response


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("fuzz")
    config = write_config(
        tmp / "gw.yaml",
        f"""
        mcps:
          alpha: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, alpha]}}
        auth:
          api_keys: [{{name: fuzz, hash: "{hash_key(KEY)}"}}]
          rate_limit: {{per_minute: 1000000, burst: 1000000}}
        security:
          limits: {{max_request_bytes: 65536, max_argument_bytes: 4096}}
        """,
    )
    log = tmp / "gateway.log"
    process, url = start_gateway_http(config, tmp, log=log)
    try:
        with httpx2.Client(timeout=30) as http:
            init = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "f", "version": "1"},
                },
            }
            response = http.post(url, json=init, headers=HEADERS | {"Authorization": f"Bearer {KEY}"})
            session = response.headers["mcp-session-id"]
            done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            http.post(url, json=done, headers=HEADERS | {"Authorization": f"Bearer {KEY}", "Mcp-Session-Id": session})
            yield Target(url, log, session, http)
    finally:
        stop_process(process)


def messages(response: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a response (plain JSON or server-sent events)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        lines = [line.rstrip("\r") for line in response.text.split("\n")]  # not splitlines(): U+0085 is data
        return [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip()]
    try:
        body = response.json()
    except ValueError:
        return []
    return body if isinstance(body, list) else [body]


def assert_clear(response: httpx2.Response) -> list[dict[str, Any]]:
    """A 2xx/4xx answer without a traceback; errors carry a message."""
    assert response.status_code < 500, response.text[:500]
    assert "Traceback" not in response.text
    if response.status_code >= 400:
        assert response.text.strip(), "an error response must say something"
    found = messages(response)
    for message in found:
        if "error" in message:
            assert isinstance(message["error"].get("message"), str) and message["error"]["message"]
    return found


@FUZZ
@given(body=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_arbitrary_bodies_get_a_clear_error(target: Target, body: bytes) -> None:
    assert_clear(target.post(body, kind="bodies"))


@FUZZ
@given(
    method=st.sampled_from(METHODS) | st.text(max_size=20),
    request_id=st.none() | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False) | st.booleans(),
    params=json_values,
    version=st.just("2.0") | st.text(max_size=4),
)
def test_json_rpc_messages_get_a_result_or_a_clear_error(
    target: Target, method: str, request_id: Any, params: Any, version: str
) -> None:
    body = {"jsonrpc": version, "id": request_id, "method": method, "params": params}
    assert_clear(target.post(json.dumps(body).encode(), kind="json-rpc"))


@FUZZ
@given(name=st.sampled_from(TOOLS) | st.text(max_size=30), arguments=json_values)
def test_tool_arguments_get_a_result_or_a_clear_error(target: Target, name: str, arguments: Any) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    for message in assert_clear(target.post(json.dumps(body).encode(), kind="tool-arguments")):
        if "result" in message and message["result"].get("isError"):
            texts = [block.get("text", "") for block in message["result"]["content"]]
            assert any(text.strip() for text in texts), "an error result must say what went wrong"


@FUZZ
@given(
    authorization=st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=80)
    .map(str.strip)
    .filter(bool)
)
def test_arbitrary_authorization_headers_are_refused_cleanly(target: Target, authorization: str) -> None:
    raw = authorization.encode("latin-1")  # any byte a header may carry, not only ASCII
    response = target.post(b"{}", {"Authorization": raw}, kind="authorization")
    assert response.status_code == 401 and "Traceback" not in response.text
    assert response.headers["www-authenticate"].startswith("Bearer ")


def test_the_gateway_logged_no_traceback_and_the_counts_are_known(target: Target) -> None:
    log = target.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert sum(target.tried.values()) >= 4 * 200, target.tried
    print(f"\nfuzz inputs tried: {target.tried} total={sum(target.tried.values())}", file=sys.stderr)
