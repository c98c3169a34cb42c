"""The stdio lean path (`gateway.serving.stdio_lean`) against the SDK's own path, answer for answer.

Two real gateway children over stdio, each in front of the demo server as a stdio child: one with the
lean path (the default, logging at DEBUG so that a test sees what it served), one with
`GATEWAY_LEAN_PATH=false`. A line client on the children's real pipes does the handshake and sends
both the same requests; what each writes back for a request (its answer, the progress before it,
the requests it makes of the client) must be the same, whichever path served. The SDK's own client
calls through the lean path too, with progress and elicitation.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server import runner
from mcp.server.runner import _NoServerRequestsDispatchContext
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher, _InFlight, _JSONRPCDispatchContext

from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.serving.hot_requests import HOT_METHODS
from tests.conftest import NO_EMBEDDINGS, REPO, demo_child_config, gateway_env, stop_process

VERSION = "2025-06-18"
ENV = NO_EMBEDDINGS | {"GATEWAY_ROUTING__MODE": "all"}
PATHS = {"lean": {"GATEWAY_LEAN_PATH": "true", "GATEWAY_LOG_LEVEL": "DEBUG"}, "sdk": {"GATEWAY_LEAN_PATH": "false"}}
"""Each gateway's own settings (the lean one turned on even under `pytest --lean-path off`)."""


def _command(config: Path) -> list[str]:
    return [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"]


class LineClient:
    """A JSON-RPC client on a gateway child's stdin and stdout, one message a line."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.log = folder / "stderr.log"
        self._log = self.log.open("w")
        self.process = subprocess.Popen(
            _command(demo_child_config(folder)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=gateway_env(folder) | ENV | env,
            cwd=REPO,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, message: Any) -> None:
        self.send_raw(json.dumps(message).encode())

    def send_raw(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout: float = 90) -> Any:
        line = self.lines.get(timeout=timeout)
        if not line:
            raise EOFError("the gateway closed stdout")
        return json.loads(line)

    def until(self, request_id: Any, *, answer: dict[str, Any] | None = None) -> list[Any]:
        """What the gateway writes until the answer to `request_id` (notifications other than progress
        and log lines left out: list changes arrive as the upstream connects); a request of the client
        (elicitation) is answered with `answer`."""
        seen: list[Any] = []
        while True:
            message = self.receive()
            if isinstance(message, dict) and "method" in message and "id" in message and answer is not None:
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": answer})
                message = {**message, "id": "<the gateway's>"}
            if isinstance(message, dict) and "method" in message and "id" not in message:
                if message["method"] not in ("notifications/progress", "notifications/message"):
                    continue
            seen.append(_without_token(message))
            if isinstance(message, dict) and message.get("id") == request_id and "method" not in message:
                return seen

    def handshake(self) -> None:
        init = {
            "protocolVersion": VERSION,
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "t", "version": "1"},
        }
        self.send(_rpc("initialize", init, 0))
        assert "result" in self.until(0)[-1]
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.send(_rpc("ping", None, "warm"))  # the lean path learns the session from a request the SDK served
        self.until("warm")

    def close(self) -> None:
        if self.process.stdin is not None:
            with suppress(OSError):  # the gateway may have gone, and a flush with it
                self.process.stdin.close()
        stop_process(self.process)  # type: ignore[arg-type]
        self._log.close()


def _without_token(message: Any) -> Any:
    """Without the feedback token a recorded call carries (an execution id, different on each gateway)."""
    if isinstance(message, dict) and isinstance(message.get("result"), dict):
        meta = message["result"].get("_meta")
        if isinstance(meta, dict):
            meta.pop(FEEDBACK_TOKEN_META_KEY, None)
            if not meta:
                del message["result"]["_meta"]
    return message


def _rpc(method: str, params: dict[str, Any] | None = None, id_: int | str = 2) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params is not None else {})}


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LineClient]]:
    started: dict[str, LineClient] = {}
    try:
        for path, env in PATHS.items():
            started[path] = LineClient(tmp_path_factory.mktemp(path), env)
        for client in started.values():
            client.handshake()
        yield started
    finally:
        for client in started.values():
            client.close()


CALL = {"name": "demo__echo", "arguments": {"text": "hi"}}
REQUESTS: list[tuple[str, Any]] = [
    ("a call", _rpc("tools/call", CALL, 10)),
    ("a string id", _rpc("tools/call", CALL, "req-7")),
    (
        "a call with _meta",
        _rpc("tools/call", {"name": "demo__add", "arguments": {"a": 1, "b": 2}, "_meta": {"k": 1}}, 11),
    ),
    ("a failing tool", _rpc("tools/call", {"name": "demo__fail", "arguments": {"message": "boom"}}, 12)),
    ("bad arguments", _rpc("tools/call", {"name": "demo__add", "arguments": {"a": "x"}}, 13)),
    ("an unknown tool", _rpc("tools/call", {"name": "demo__nope", "arguments": {}}, 14)),
    ("params without a name", _rpc("tools/call", {"arguments": {}}, 15)),
    ("arguments not an object", _rpc("tools/call", {"name": "demo__echo", "arguments": [1]}, 16)),
    ("resource links", _rpc("tools/call", {"name": "demo__link_readme", "arguments": {}}, 17)),
    ("tools/list", _rpc("tools/list", None, 18)),
    ("resources/read", _rpc("resources/read", {"uri": "demo+demo://readme"}, 19)),
    ("an unknown resource", _rpc("resources/read", {"uri": "demo+demo://nothing"}, 20)),
    ("prompts/get", _rpc("prompts/get", {"name": "demo__greet", "arguments": {"who": "Ada"}}, 21)),
    ("an unknown prompt", _rpc("prompts/get", {"name": "demo__nope"}, 22)),
    ("a task-augmented call", _rpc("tools/call", {**CALL, "task": {"ttl": 60000}}, 23)),
    ("a 2026 envelope", _rpc("tools/call", {**CALL, "_meta": {"io.modelcontextprotocol/protocolVersion": "x"}}, 24)),
    ("a batch", [_rpc("tools/list", id_=25), _rpc("tools/call", CALL, 26)]),
    ("an unknown method", _rpc("tools/nothing", None, 27)),
    (
        "progress",
        _rpc(
            "tools/call", {"name": "demo__count_slowly", "arguments": {"steps": 3}, "_meta": {"progressToken": "p"}}, 28
        ),
    ),
    ("a log line", _rpc("tools/call", {"name": "demo__log_line", "arguments": {"message": "hello"}}, 29)),
    ("elicitation", _rpc("tools/call", {"name": "demo__confirm", "arguments": {"question": "sure?"}}, 30)),
]


@pytest.mark.parametrize(("what", "body"), REQUESTS, ids=[what for what, _ in REQUESTS])
def test_both_paths_write_the_same(clients: dict[str, LineClient], what: str, body: Any) -> None:
    seen = {}
    for path, client in clients.items():
        client.send(body)
        if isinstance(body, list):  # whatever the batch gets, then a ping's answer
            client.send(_rpc("ping", None, "after"))
        request_id = "after" if isinstance(body, list) else body["id"]
        seen[path] = client.until(request_id, answer={"action": "accept", "content": {"ok": True}})
    assert seen["lean"] == seen["sdk"], what
    assert seen["lean"][-1]["id"] == request_id


def test_bad_json_gets_the_sdks_answer(clients: dict[str, LineClient]) -> None:
    seen = {}
    for path, client in clients.items():
        client.send_raw(b'{"jsonrpc": "2.0", "id": 40, "method": "tools/li')
        client.send(_rpc("ping", None, 41))
        seen[path] = client.until(41)
    assert seen["lean"] == seen["sdk"]


def test_the_lean_path_serves_the_hot_requests_and_leaves_the_rest(clients: dict[str, LineClient]) -> None:
    client = clients["lean"]
    for n, method in enumerate(sorted(HOT_METHODS)):
        params = {
            "tools/call": CALL,
            "resources/read": {"uri": "demo+demo://readme"},
            "prompts/get": {"name": "demo__greet", "arguments": {"who": "Ada"}},
        }.get(method)
        client.send(_rpc(method, params, 100 + n))
        assert "result" in client.until(100 + n)[-1]
    client.send(_rpc("prompts/list", None, 200))
    assert "result" in client.until(200)[-1]
    expected = [f"lean path: {method} {100 + n}" for n, method in enumerate(sorted(HOT_METHODS))]
    deadline = time.monotonic() + 15
    while not all(line in (logged := client.log.read_text()) for line in expected) and time.monotonic() < deadline:
        time.sleep(0.1)
    for line in expected:
        assert line in logged
    assert "lean path: prompts/list" not in logged and "lean path: ping" not in logged
    assert "lean path: tools/call 23" not in logged and "lean path: tools/call 24" not in logged


ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
}


def _modern(method: str, params: dict[str, Any], id_: int | str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return _rpc(method, {**params, "_meta": ENVELOPE | (meta or {})}, id_)


MODERN: list[tuple[str, Any]] = [
    ("a call", _modern("tools/call", CALL, 70)),
    ("a string id", _modern("tools/call", CALL, "m-7")),
    ("a failing tool", _modern("tools/call", {"name": "demo__fail", "arguments": {"message": "boom"}}, 71)),
    ("bad arguments", _modern("tools/call", {"name": "demo__add", "arguments": {"a": "x"}}, 72)),
    ("an unknown tool", _modern("tools/call", {"name": "demo__nope", "arguments": {}}, 73)),
    ("tools/list", _modern("tools/list", {}, 74)),
    ("resources/read", _modern("resources/read", {"uri": "demo+demo://readme"}, 75)),
    ("an unknown resource", _modern("resources/read", {"uri": "demo+demo://nothing"}, 76)),
    ("prompts/get", _modern("prompts/get", {"name": "demo__greet", "arguments": {"who": "Ada"}}, 77)),
    (
        "a half envelope",
        _rpc("tools/call", {**CALL, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}, 78),
    ),
    (
        "an unknown version",
        _rpc("tools/call", {**CALL, "_meta": ENVELOPE | {"io.modelcontextprotocol/protocolVersion": "1999-01-01"}}, 79),
    ),
    (
        "progress",
        _modern("tools/call", {"name": "demo__count_slowly", "arguments": {"steps": 3}}, 80, {"progressToken": "p"}),
    ),
    ("elicitation refused", _modern("tools/call", {"name": "demo__confirm", "arguments": {"question": "sure?"}}, 81)),
    ("no envelope", _rpc("tools/call", CALL, 82)),
]


@pytest.fixture(scope="module")
def modern_clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LineClient]]:
    """A gateway of each path whose client opened the session with a 2026-07-28 request (no handshake)."""
    started: dict[str, LineClient] = {}
    try:
        for path, env in PATHS.items():
            started[path] = LineClient(tmp_path_factory.mktemp(f"modern-{path}"), env)
        for client in started.values():
            client.send(_modern("tools/list", {}, "open"))
            client.until("open")
        yield started
    finally:
        for client in started.values():
            client.close()


@pytest.mark.parametrize(("what", "body"), MODERN, ids=[what for what, _ in MODERN])
def test_both_paths_write_the_same_on_a_2026_connection(
    modern_clients: dict[str, LineClient], what: str, body: Any
) -> None:
    seen = {path: (client.send(body), client.until(body["id"]))[1] for path, client in modern_clients.items()}
    assert seen["lean"] == seen["sdk"], what
    assert seen["lean"][-1]["id"] == body["id"]


def test_the_lean_path_serves_2026_requests(modern_clients: dict[str, LineClient]) -> None:
    client = modern_clients["lean"]
    client.send(_modern("tools/call", CALL, 90))
    assert "result" in client.until(90)[-1]
    deadline = time.monotonic() + 15
    while "lean path: tools/call 90" not in (logged := client.log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "lean path: tools/call 90" in logged
    assert "lean path: tools/call 82" not in logged  # no envelope: the SDK's refusal


@pytest.mark.parametrize("path", ["lean", "sdk"])
def test_a_cancelled_call_is_cancelled_upstream_and_not_answered(
    clients: dict[str, LineClient], path: str, tmp_path: Path
) -> None:
    client, marker = clients[path], tmp_path / "cancel"
    client.send(_rpc("tools/call", {"name": "demo__wait_for_cancel", "arguments": {"marker": str(marker)}}, 50))
    deadline = time.monotonic() + 20
    while not Path(f"{marker}.started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 50}})
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "cancelled"
    client.send(_rpc("tools/call", CALL, 51))
    assert [m.get("id") for m in client.until(51)] == [51]  # nothing for 50


@pytest.mark.parametrize("path", ["lean", "sdk"])
def test_stdin_closing_cancels_the_calls_in_flight(path: str, tmp_path: Path) -> None:
    client, marker = LineClient(tmp_path, PATHS[path]), tmp_path / "hangup"
    try:
        client.handshake()
        client.send(_rpc("tools/call", {"name": "demo__wait_for_cancel", "arguments": {"marker": str(marker)}}, 60))
        deadline = time.monotonic() + 20
        while not Path(f"{marker}.started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.process.stdin is not None
        client.process.stdin.close()
        answer = client.until(60)[-1]
        assert answer == {"jsonrpc": "2.0", "id": 60, "error": {"code": -32000, "message": "Connection closed"}}
        assert client.process.wait(timeout=30) == 0
        assert marker.read_text() == "cancelled"
    finally:
        client.close()


@pytest.mark.anyio
async def test_the_sdks_client_calls_through_the_lean_path_with_progress_and_elicitation(tmp_path: Path) -> None:
    config = demo_child_config(tmp_path)
    env = gateway_env(tmp_path) | ENV | PATHS["lean"]
    params = StdioServerParameters(command=sys.executable, args=_command(config)[1:], env=env, cwd=str(REPO))
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def elicit(context: Any, request: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"ok": True})

    log = (tmp_path / "stderr.log").open("w")
    with anyio.fail_after(90):
        async with Client(stdio_client(params, errlog=log), mode="legacy", elicitation_callback=elicit) as client:
            counted = await client.call_tool("demo__count_slowly", {"steps": 3}, progress_callback=on_progress)
            confirmed = await client.call_tool("demo__confirm", {"question": "sure?"})
    log.close()
    assert counted.content[0].text == "counted to 3"  # type: ignore[union-attr]
    assert progress == [1, 2, 3]
    assert confirmed.content[0].text == "accepted: ok=True"  # type: ignore[union-attr]
    assert "lean path: tools/call" in (tmp_path / "stderr.log").read_text()


MODERN_STREAM = "d8b11353b7bd0878"


def test_the_sdk_state_the_stdio_lean_path_reads_is_there() -> None:
    """It enters requests in the dispatcher's own tables and task group: a new SDK must be read again."""
    source = inspect.getsource(JSONRPCDispatcher._handle_request)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == "393d7c8204a71c84", "_handle_request changed"
    init = inspect.getsource(JSONRPCDispatcher.__init__)
    for attribute in ("self._in_flight", "self._tg", "self._write_stream", "self._closed"):
        assert attribute in init, attribute
    assert {"scope", "dctx"} <= set(_InFlight.__dataclass_fields__)
    fields = set(_JSONRPCDispatchContext.__dataclass_fields__)
    assert {"transport", "_dispatcher", "_request_id", "_progress_token", "cancel_requested"} <= fields
    assert "_inner" in _NoServerRequestsDispatchContext.__dataclass_fields__
    modern = inspect.getsource(runner._serve_modern_stream)  # what the 2026-07-28 lean path mirrors
    assert hashlib.sha256(modern.encode()).hexdigest()[:16] == MODERN_STREAM, "_serve_modern_stream changed"
