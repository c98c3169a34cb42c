"""The HTTP lean path (`gateway.serving.lean_path`) against the SDK's own path, answer for answer.

Two real gateway children over HTTP on 127.0.0.1, each in front of the demo server as a stdio
child: one with the lean path (the default), one with `GATEWAY_HTTP__LEAN_PATH=false`. A raw HTTP
client opens a session on each with a real handshake and sends both the same requests; the answers
must be the same (status, content type, JSON-RPC body), whichever path served. The lean gateway
logs at DEBUG, so that a test can see which requests its lean path served. Progress, log lines,
relayed elicitation and silent calls are covered for both paths by tests/test_http_responses.py
(run it with `--lean-path off` too).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.server.runner import ServerRunner
from mcp.server.session import ServerSession
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher, _InFlight

from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.serving.lean_path import HOT_METHODS
from tests.conftest import NO_EMBEDDINGS, demo_child_config, start_gateway_http, stop_process

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
VERSION = "2025-06-18"
ENV = NO_EMBEDDINGS | {"GATEWAY_ROUTING__MODE": "all"}


def _start(folder: Path, env: dict[str, str]) -> tuple[Any, str, Path]:
    config = demo_child_config(folder)
    log = folder / "gateway.log"
    process, url = start_gateway_http(config, folder, ENV | env, log)
    return process, url, log


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, Path]]]:
    """`lean` and `sdk`: each gateway's URL and log."""
    lean_dir, sdk_dir = tmp_path_factory.mktemp("lean"), tmp_path_factory.mktemp("sdk")
    lean = _start(
        lean_dir, {"GATEWAY_LEAN_PATH": "true", "GATEWAY_HTTP__LEAN_PATH": "true", "GATEWAY_LOG_LEVEL": "DEBUG"}
    )
    try:
        sdk = _start(sdk_dir, {"GATEWAY_HTTP__LEAN_PATH": "false"})
        try:
            yield {"lean": (lean[1], lean[2]), "sdk": (sdk[1], sdk[2])}
        finally:
            stop_process(sdk[0])
    finally:
        stop_process(lean[0])


def _rpc(method: str, params: dict[str, Any] | None = None, id_: int | str = 2) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params is not None else {})}


def _open_session(http: httpx2.Client, url: str) -> dict[str, str]:
    init = {
        "protocolVersion": VERSION,
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "t", "version": "1"},
    }
    opened = http.post(url, headers=HEADERS, json=_rpc("initialize", init, 1))
    assert opened.status_code == 200, opened.text
    session = HEADERS | {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": VERSION}
    notified = http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert notified.status_code == 202
    return session


def _answer(response: httpx2.Response) -> tuple[int, str, Any]:
    """Status, content type, and the JSON-RPC answer (an SSE body's last event), without the feedback
    token a recorded call carries (an execution id, different on each gateway)."""
    kind = response.headers.get("content-type", "").split(";")[0]
    if kind == "text/event-stream":
        body: Any = json.loads([line[5:] for line in response.text.splitlines() if line.startswith("data:")][-1])
    else:
        body = response.json() if response.content else None
    if isinstance(body, dict) and isinstance(body.get("result"), dict):
        meta = body["result"].get("_meta")
        if isinstance(meta, dict):
            meta.pop(FEEDBACK_TOKEN_META_KEY, None)
            if not meta:
                del body["result"]["_meta"]
    return response.status_code, kind, body


REQUESTS: list[tuple[str, Any]] = [
    ("a call", _rpc("tools/call", {"name": "demo__echo", "arguments": {"text": "hi"}})),
    ("a string id", _rpc("tools/call", {"name": "demo__echo", "arguments": {"text": "hi"}}, "req-7")),
    ("a call with _meta", _rpc("tools/call", {"name": "demo__add", "arguments": {"a": 1, "b": 2}, "_meta": {"k": 1}})),
    ("a failing tool", _rpc("tools/call", {"name": "demo__fail", "arguments": {"message": "boom"}})),
    ("bad arguments", _rpc("tools/call", {"name": "demo__add", "arguments": {"a": "x"}})),
    ("an unknown tool", _rpc("tools/call", {"name": "demo__nope", "arguments": {}})),
    ("params without a name", _rpc("tools/call", {"arguments": {}})),
    ("arguments not an object", _rpc("tools/call", {"name": "demo__echo", "arguments": [1]})),
    ("resource links", _rpc("tools/call", {"name": "demo__link_readme", "arguments": {}})),
    ("tools/list", _rpc("tools/list")),
    ("resources/read", _rpc("resources/read", {"uri": "demo+demo://readme"})),
    ("an unknown resource", _rpc("resources/read", {"uri": "demo+demo://nothing"})),
    ("prompts/get", _rpc("prompts/get", {"name": "demo__greet", "arguments": {"who": "Ada"}})),
    ("an unknown prompt", _rpc("prompts/get", {"name": "demo__nope"})),
    ("a batch", [_rpc("tools/list", id_=3), _rpc("tools/call", {"name": "demo__echo", "arguments": {"text": "b"}})]),
    ("a notification", {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}),
    ("not JSON-RPC", {"hello": "world"}),
    ("an unknown method", _rpc("tools/nothing")),
]


@pytest.mark.parametrize(("what", "body"), REQUESTS, ids=[what for what, _ in REQUESTS])
def test_both_paths_give_the_same_answer(gateways: dict[str, tuple[str, Path]], what: str, body: Any) -> None:
    answers = {}
    with httpx2.Client(timeout=30) as http:
        for path, (url, _) in gateways.items():
            session = _open_session(http, url)
            answers[path] = _answer(http.post(url, headers=session, json=body))
    assert answers["lean"] == answers["sdk"], what


def test_bad_json_and_an_unknown_session_get_the_sdks_answers(gateways: dict[str, tuple[str, Path]]) -> None:
    answers: dict[str, list[Any]] = {}
    with httpx2.Client(timeout=30) as http:
        for path, (url, _) in gateways.items():
            session = _open_session(http, url)
            bad = http.post(url, headers=session, content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/li')
            unknown = http.post(url, headers=session | {"Mcp-Session-Id": "0" * 32}, json=_rpc("tools/list"))
            answers[path] = [_answer(bad), _answer(unknown)]
    assert answers["lean"] == answers["sdk"]
    assert answers["lean"][1][0] == 404


def test_the_lean_path_serves_the_hot_requests_and_leaves_the_rest(gateways: dict[str, tuple[str, Path]]) -> None:
    url, log = gateways["lean"]
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, url)
        # The lean path learns a session from a request the SDK served on it; `notifications/initialized`
        # is answered before the SDK handles it, so a `ping` (the SDK's) makes sure it has.
        assert http.post(url, headers=session, json=_rpc("ping", None, 99)).json()["result"] == {}
        for n, method in enumerate(sorted(HOT_METHODS)):
            params = {
                "tools/call": {"name": "demo__echo", "arguments": {"text": "x"}},
                "resources/read": {"uri": "demo+demo://readme"},
                "prompts/get": {"name": "demo__greet", "arguments": {"who": "Ada"}},
            }.get(method)
            assert "result" in http.post(url, headers=session, json=_rpc(method, params, 100 + n)).json()
        assert "result" in http.post(url, headers=session, json=_rpc("prompts/list", None, 200)).json()
    expected = [f"lean path: {method} {100 + n}" for n, method in enumerate(sorted(HOT_METHODS))]
    deadline = time.monotonic() + 15  # a thread copies the child's stderr into the log: it may lag
    while not all(line in (logged := log.read_text()) for line in expected) and time.monotonic() < deadline:
        time.sleep(0.1)
    for line in expected:
        assert line in logged
    assert "lean path: prompts/list" not in logged and "lean path: initialize" not in logged


@pytest.mark.parametrize("path", ["lean", "sdk"])
def test_a_cancelled_request_is_answered_request_cancelled(
    gateways: dict[str, tuple[str, Path]], path: str, tmp_path: Path
) -> None:
    url, _ = gateways[path]
    marker = tmp_path / "cancel"
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, url)
        call = _rpc("tools/call", {"name": "demo__wait_for_cancel", "arguments": {"marker": str(marker)}}, 41)
        with http.stream("POST", url, headers=session, json=call) as pending:
            deadline = time.monotonic() + 20
            while not Path(f"{marker}.started").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 41}}
            assert http.post(url, headers=session, json=cancel).status_code == 202
            pending.read()
            status, _, answer = _answer(pending)
        assert status == 200 and answer == {
            "jsonrpc": "2.0",
            "id": 41,
            "error": {"code": -32800, "message": "Request cancelled"},
        }
        assert "result" in http.post(url, headers=session, json=_rpc("tools/list", None, 42)).json()


def test_a_client_that_hangs_up_cancels_its_call_upstream(
    gateways: dict[str, tuple[str, Path]], tmp_path: Path
) -> None:
    url, log = gateways["lean"]
    marker = tmp_path / "hangup"
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, url)
        call = _rpc("tools/call", {"name": "demo__wait_for_cancel", "arguments": {"marker": str(marker)}}, 51)
        with httpx2.Client(timeout=httpx2.Timeout(30, read=1.0)) as impatient:
            with pytest.raises(httpx2.ReadTimeout):
                impatient.post(url, headers=session, json=call)
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "cancelled"
        again = http.post(
            url, headers=session, json=_rpc("tools/call", {"name": "demo__echo", "arguments": {"text": "on"}}, 52)
        )
        assert again.json()["result"]["content"][0]["text"] == "on"
    assert "Traceback" not in log.read_text()


MIRRORED = [
    (ServerRunner, "_on_request", "cb7dea37a3cb2fc9"),
    (ServerRunner, "_serialize", "0030ed81bc074613"),
    (StreamableHTTPServerTransport, "handle_request", "6f39c89f48def0c0"),
    (StreamableHTTPServerTransport, "_terminate_unanswered_request", "1e65ccb1f1ac02ea"),
    (JSONRPCDispatcher, "_handle_request", "393d7c8204a71c84"),
    (JSONRPCDispatcher, "send_raw_request", "7ef07ab6bc42bab3"),
]


@pytest.mark.parametrize(("owner", "name", "digest"), MIRRORED, ids=[f"{o.__name__}.{n}" for o, n, _ in MIRRORED])
def test_the_sdk_code_the_lean_path_mirrors_is_unchanged(owner: type, name: str, digest: str) -> None:
    """The lean path copies what these do and reads the state they keep: a new SDK must be read again."""
    source = inspect.getsource(getattr(owner, name))
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == digest, f"{owner.__name__}.{name} changed"


def test_the_sdk_state_the_lean_path_reads_is_there() -> None:
    transport = StreamableHTTPServerTransport(mcp_session_id="s", idle_timeout=5.0)
    attributes = ("idle_scope", "_requests_in_flight", "_idle_timeout", "_request_streams", "is_terminated")
    for attribute in (*attributes, "_check_content_type"):
        assert hasattr(transport, attribute), attribute
    assert {"scope", "dctx"} <= set(_InFlight.__dataclass_fields__)
    assert "_related_request_id" in inspect.signature(JSONRPCDispatcher.send_raw_request).parameters
    assert "self._request_outbound = request_outbound" in inspect.getsource(ServerSession.__init__)


@pytest.mark.parametrize("version", ["2024-11-05", "2025-06-18", "2025-11-25", "2026-07-28"])
@pytest.mark.parametrize(
    "meta",
    [
        {FEEDBACK_TOKEN_META_KEY: "0" * 32},
        {FEEDBACK_TOKEN_META_KEY: "0" * 32, "mcp-gateway/error": {"code": "upstream_timeout", "server": "s"}},
        {FEEDBACK_TOKEN_META_KEY: "0" * 32, "io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"}},
        {FEEDBACK_TOKEN_META_KEY: "0" * 32, "other/key": [1, {"a": None}]},
    ],
)
def test_a_result_with_the_gateways_meta_is_shaped_as_the_sdk_shapes_it(version: str, meta: dict[str, Any]) -> None:
    import mcp_types as types
    from mcp_types import methods

    from gateway.serving.hot_requests import serialize

    result = types.CallToolResult(
        content=[types.TextContent(type="text", text="hi")], structured_content={"r": "hi"}, meta=meta
    )
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert serialize("tools/call", version, result) == methods.serialize_server_result("tools/call", version, dumped)
    assert serialize("tools/call", version, result)["_meta"] == meta


def _open_sessions(base: str) -> float:
    metrics = httpx2.get(f"{base}/metrics", timeout=10).text
    gauge = next(line for line in metrics.splitlines() if line.startswith("mcp_gateway_http_sessions "))
    return float(gauge.split()[1])


def test_a_session_the_lean_path_serves_is_held_while_used_and_closed_when_idle(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The lean path keeps the session's idle expiry itself (`_IdleClock`): a call running longer
    than `session_idle_timeout` and calls one after another keep the session; once idle that
    long it is closed, as the SDK closes it (which `--lean-path off` checks the same way)."""
    env = {"GATEWAY_HTTP__SESSION_IDLE_TIMEOUT": "1.5", "GATEWAY_LOG_LEVEL": "DEBUG"}
    process, url, log = _start(tmp_path, env)
    base = url.rsplit("/", 1)[0]
    try:
        with httpx2.Client(timeout=30) as http:
            session = _open_session(http, url)
            assert http.post(url, headers=session, json=_rpc("ping", None, 99)).json()["result"] == {}
            slow = _rpc("tools/call", {"name": "demo__sleep", "arguments": {"seconds": 2.5}}, 100)
            assert _answer(http.post(url, headers=session, json=slow))[2]["result"]["isError"] is False
            end = time.monotonic() + 2.5
            n = 101
            while time.monotonic() < end:  # calls 0.5 s apart, for longer than the idle timeout
                echo = _rpc("tools/call", {"name": "demo__echo", "arguments": {"text": "x"}}, n)
                assert "result" in http.post(url, headers=session, json=echo).json()
                n += 1
                time.sleep(0.5)
            if request.config.getoption("lean_path") != "off":
                assert f"lean path: tools/call {n - 1}" in log.read_text()
            deadline = time.monotonic() + 60  # a bound on a hang, generous under load; idle after 1.5 s
            while _open_sessions(base) > 0:
                assert time.monotonic() < deadline, "the idle session was not closed within 60 s"
                time.sleep(0.2)
            echo = _rpc("tools/call", {"name": "demo__echo", "arguments": {"text": "x"}}, n)
            assert http.post(url, headers=session, json=echo).status_code == 404
    finally:
        stop_process(process)
