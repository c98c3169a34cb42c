"""JSON or SSE for a POSTed request on the 2025-era streamable-HTTP path (`gateway.serving.deferred_responses`).

A real gateway child over HTTP on 127.0.0.1, in front of the demo server as a stdio child; a raw HTTP
client reads the Content-Type and the events after a real initialize, the SDK's `Client` checks that
a client works end to end. `GATEWAY_HTTP__RESPONSE_WINDOW` is 10 s for the gateway whose quick answers
must be JSON (a loaded CI machine has taken over a second to answer `initialize`), and 1 s for the one
whose calls must go past it, so a silent call does so without a 15 s sleep.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from tests.conftest import DEMO_SERVER, NO_EMBEDDINGS, start_gateway_http, stop_process, write_config

WINDOW = 1.0
"""The short window, of the `short_window` gateway: calls that must go past it sleep a few of them."""
QUICK_WINDOW = 10.0
"""The window of every other gateway here: a quick answer must come within it to be JSON."""
ENV = NO_EMBEDDINGS | {"GATEWAY_ROUTING__MODE": "all", "GATEWAY_HTTP__RESPONSE_WINDOW": str(QUICK_WINDOW)}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
VERSION = "2025-06-18"
JSON = "application/json"
SSE = "text/event-stream"


def _start(tmp_path: Path, env: dict[str, str], log: Path | None = None) -> tuple[Any, str]:
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          demo:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, demo]
        security:
          limits:
            max_result_bytes: 4194304
        """,
    )
    return start_gateway_http(config, tmp_path, ENV | env, log)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One gateway for the module (`response_mode: auto`, the default): its URL and its log."""
    folder = tmp_path_factory.mktemp("auto")
    process, url = _start(folder, {}, folder / "gateway.log")
    try:
        yield url, folder / "gateway.log"
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def short_window(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A gateway whose window is `WINDOW` (1 s): its URL and its log."""
    folder = tmp_path_factory.mktemp("short")
    process, url = _start(folder, {"GATEWAY_HTTP__RESPONSE_WINDOW": str(WINDOW)}, folder / "gateway.log")
    try:
        yield url, folder / "gateway.log"
    finally:
        stop_process(process)


@pytest.fixture
def gateway_url(gateway: tuple[str, Path]) -> str:
    return gateway[0]


def _rpc(method: str, params: dict[str, Any] | None = None, id_: int = 2) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params is not None else {})}


def _call(name: str, arguments: dict[str, Any], progress: int | None = None, id_: int = 2) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if progress is not None:
        params["_meta"] = {"progressToken": progress}
    return _rpc("tools/call", params, id_)


def _open_session(http: httpx2.Client, url: str, answered_as: str | None = JSON) -> dict[str, str]:
    """A real initialize and `notifications/initialized`; the headers of the session's next requests."""
    opened = http.post(
        url,
        headers=HEADERS,
        json=_rpc(
            "initialize",
            {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
            1,
        ),
    )
    assert opened.status_code == 200, opened.text
    answered = opened.headers["content-type"]
    if answered_as is not None:
        assert answered.startswith(answered_as), "initialize answers at once: JSON unless `sse`"
    result = opened.json() if answered.startswith(JSON) else json.loads(_events(opened.text)[-1])
    assert result["result"]["serverInfo"]["name"] == "mcp-gateway"
    session = HEADERS | {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": VERSION}
    assert (
        http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code
        == 202
    )
    return session


def _events(body: str) -> list[str]:
    """An SSE body's events in order: the JSON of each `data:` line, or `ping` for a comment."""
    events = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line]
        if any(line.startswith("data:") for line in lines):
            events.append("".join(line[5:].strip() for line in lines if line.startswith("data:")))
        elif lines and all(line.startswith(":") for line in lines):
            events.append("ping")
    return events


def test_a_quick_call_is_answered_with_a_json_body(gateway_url: str) -> None:
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, gateway_url)
        answer = http.post(gateway_url, headers=session, json=_call("demo__echo", {"text": "hi"}))
        assert answer.status_code == 200
        assert answer.headers["content-type"] == JSON
        assert answer.headers["mcp-session-id"] == session["Mcp-Session-Id"]
        body = answer.json()
        assert body["id"] == 2 and body["result"]["content"] == [{"type": "text", "text": "hi"}]
        listed = http.post(gateway_url, headers=session, json=_rpc("tools/list", id_=3))
        assert listed.headers["content-type"] == JSON
        assert "demo__echo" in {tool["name"] for tool in listed.json()["result"]["tools"]}
        failed = http.post(gateway_url, headers=session, json=_rpc("no/such/method", id_=4))
        assert failed.headers["content-type"] == JSON and failed.json()["error"]["code"] == types.METHOD_NOT_FOUND


@pytest.mark.anyio
async def test_the_sdk_client_works_end_to_end(gateway_url: str) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    with anyio.fail_after(30):
        async with Client(gateway_url, mode="legacy") as client:
            assert (await client.call_tool("demo__add", {"a": 2, "b": 3})).structured_content == {"result": 5}
            counted = await client.call_tool("demo__count_slowly", {"steps": 3}, progress_callback=on_progress)
            assert counted.content[0].text == "counted to 3"  # type: ignore[union-attr]
            assert progress == [1.0, 2.0, 3.0]


@pytest.mark.anyio
async def test_a_quick_result_over_one_mib_reaches_the_sdk_client(gateway_url: str) -> None:
    """As one server-sent event it would not: the SDK's client refuses an event over 1 MiB
    (`DEFAULT_MAX_SSE_EVENT_SIZE`, docs/compatibility.md); a JSON body has no such cap. (The
    gateway's own `max_result_bytes` is raised to 4 MiB here, from 1 MiB.)"""
    text = "x" * 700_000  # twice in the result (text and structured content): 1.4 MB
    with anyio.fail_after(30):
        async with Client(gateway_url, mode="legacy") as client:
            result = await client.call_tool("demo__echo", {"text": text})
    assert not result.is_error, [c.text[-300:] for c in result.content]  # type: ignore[union-attr]
    assert result.content[0].text == text  # type: ignore[union-attr]


def test_progress_before_the_result_comes_as_sse_every_notification_then_the_result(gateway_url: str) -> None:
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, gateway_url)
        answer = http.post(gateway_url, headers=session, json=_call("demo__count_slowly", {"steps": 3}, progress=7))
        assert answer.status_code == 200 and answer.headers["content-type"].startswith(SSE)
        assert answer.headers["mcp-session-id"] == session["Mcp-Session-Id"]
        messages = [json.loads(event) for event in _events(answer.text) if event != "ping"]
        assert [m["params"]["progress"] for m in messages[:-1]] == [1.0, 2.0, 3.0]
        assert all(m["method"] == "notifications/progress" and m["params"]["progressToken"] == 7 for m in messages[:-1])
        assert messages[-1]["id"] == 2 and messages[-1]["result"]["content"][0]["text"] == "counted to 3"


def test_a_log_line_before_the_result_comes_as_sse_then_the_result(gateway_url: str) -> None:
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, gateway_url)
        assert (
            http.post(gateway_url, headers=session, json=_rpc("logging/setLevel", {"level": "info"})).status_code == 200
        )
        answer = http.post(gateway_url, headers=session, json=_call("demo__log_line", {"message": "hello"}))
        assert answer.headers["content-type"].startswith(SSE)
        messages = [json.loads(event) for event in _events(answer.text) if event != "ping"]
        assert [m.get("method") for m in messages] == ["notifications/message", None]
        assert messages[0]["params"]["data"] == "hello"
        assert messages[1]["result"]["content"][0]["text"] == "logged"


def test_a_call_silent_past_the_window_gets_sse_with_pings_then_its_result(short_window: tuple[str, Path]) -> None:
    gateway_url = short_window[0]
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, gateway_url, None)
        request = _call("demo__sleep", {"seconds": 3 * WINDOW})
        with http.stream("POST", gateway_url, headers=session, json=request) as answer:
            assert answer.headers["content-type"].startswith(SSE)
            chunks = iter(answer.iter_text())
            first = next(chunks)
            # Bytes came while the call still ran: a ping, not the result.
            assert first.startswith(":") and '"result"' not in first
            body = first + "".join(chunks)
        events = _events(body)
        assert events[0] == "ping" and events.count("ping") >= 2
        result = json.loads(events[-1])
        assert result["id"] == 2 and result["result"]["content"][0]["text"] == f"slept {3 * WINDOW}"


@pytest.mark.anyio
async def test_an_elicitation_relayed_from_the_upstream_reaches_the_client_and_its_answer_comes_back(
    gateway_url: str,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"ok": True})

    with anyio.fail_after(30):
        async with Client(gateway_url, mode="legacy", elicitation_callback=on_elicit) as client:
            result = await client.call_tool("demo__confirm", {"question": "proceed?"})
    assert result.content[0].text == "accepted: ok=True", result  # type: ignore[union-attr]
    assert asked == ["proceed?"]


def test_a_client_that_hangs_up_during_a_call_leaves_its_session_usable(short_window: tuple[str, Path]) -> None:
    gateway_url, log = short_window
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, gateway_url, None)
        # Hang up while the answer is deferred (no bytes yet)...
        with httpx2.Client(timeout=httpx2.Timeout(30, read=WINDOW / 2)) as impatient:
            with pytest.raises(httpx2.ReadTimeout):
                impatient.post(gateway_url, headers=session, json=_call("demo__sleep", {"seconds": 2 * WINDOW}, id_=5))
        # ...and once it is a stream.
        with http.stream(
            "POST", gateway_url, headers=session, json=_call("demo__sleep", {"seconds": 3 * WINDOW}, id_=6)
        ) as s:
            assert s.headers["content-type"].startswith(SSE) and next(s.iter_text()).startswith(":")
        answer = http.post(
            gateway_url,
            headers=session,
            json=_rpc("tools/call", {"name": "demo__echo", "arguments": {"text": "still here"}}, 9),
        )
        # JSON, unless a loaded machine kept the gateway past the 1 s window: the session works either way.
        still = answer.json() if answer.headers["content-type"] == JSON else json.loads(_events(answer.text)[-1])
        assert still["id"] == 9 and still["result"]["content"][0]["text"] == "still here"
        # A call that starts after the abandoned ones and lasts as long ends after them: by then
        # the gateway has answered them into the void, without an error.
        later = http.post(gateway_url, headers=session, json=_call("demo__sleep", {"seconds": 3 * WINDOW}, id_=10))
        assert json.loads(_events(later.text)[-1])["id"] == 10
    logged = log.read_text()
    assert "serving on" in logged and "Traceback" not in logged and "ERROR" not in logged


def test_a_client_that_accepts_only_sse_is_refused_as_before(gateway_url: str) -> None:
    with httpx2.Client(timeout=30) as http:
        session = _open_session(http, gateway_url)
        refused = http.post(gateway_url, headers=session | {"Accept": SSE}, json=_call("demo__echo", {"text": "x"}))
        assert refused.status_code == 406 and "must accept both" in refused.text


@pytest.mark.parametrize(
    ("env", "quick"),
    [({"GATEWAY_HTTP__RESPONSE_MODE": "sse"}, SSE), ({"GATEWAY_HTTP__STATELESS": "true"}, JSON)],
    ids=["response_mode-sse", "stateless"],
)
def test_the_response_mode_and_stateless_http(tmp_path: Path, env: dict[str, str], quick: str) -> None:
    """`response_mode: sse` streams even a quick answer (today's behaviour); stateless HTTP defers too."""
    process, url = _start(tmp_path, env)
    try:
        with httpx2.Client(timeout=30) as http:
            session = _open_session(http, url, quick) if "GATEWAY_HTTP__STATELESS" not in env else HEADERS
            answer = http.post(url, headers=session, json=_call("demo__echo", {"text": "hi"}))
            assert answer.status_code == 200 and answer.headers["content-type"].startswith(quick)
            body = answer.json() if quick == JSON else json.loads(_events(answer.text)[-1])
            assert body["result"]["content"] == [{"type": "text", "text": "hi"}]
            slow = http.post(url, headers=session, json=_call("demo__count_slowly", {"steps": 2}, progress=1))
            assert slow.headers["content-type"].startswith(SSE)
            assert [json.loads(e).get("method") for e in _events(slow.text) if e != "ping"] == [
                "notifications/progress",
                "notifications/progress",
                None,
            ]
    finally:
        stop_process(process)


MIRRORED = [
    (StreamableHTTPServerTransport, "_handle_request", "c7ca02ba9f5cfb06"),
    (StreamableHTTPServerTransport, "_handle_post_request", "cc4f2cd0c9e317a2"),
    (StreamableHTTPServerTransport, "connect", "fbb24a6b38c377f0"),  # its message router feeds the request streams
    (StreamableHTTPServerTransport, "_run_sse_writer", "886892073c4e09e1"),
    (StreamableHTTPServerTransport, "_create_session_message", "788a792e7b6424d7"),
    (StreamableHTTPServerTransport, "_create_json_response", "a69b220c3746c14f"),
    (StreamableHTTPServerTransport, "_create_error_response", "3df601e8b549a862"),
    (StreamableHTTPServerTransport, "_create_event_data", "89c55d1c9383d6c2"),
    (StreamableHTTPServerTransport, "_clean_up_memory_streams", "207f00589a74e039"),
    (StreamableHTTPServerTransport, "_check_content_type", "cbfd4348673d85d4"),
    (StreamableHTTPServerTransport, "_validate_session", "e72a59b20288df5e"),
    (StreamableHTTPSessionManager, "_admit_session", "be70a49c7998add8"),
    (StreamableHTTPSessionManager, "_handle_stateless_request", "5f73a16dea80a855"),
    (StreamableHTTPSessionManager, "_handle_stateful_request", "aaa548f3ce29008d"),
    (Server, "streamable_http_app", "fb7bd0f248e341de"),
]
"""The SDK code `gateway.serving.deferred_responses` copies, overrides or calls, and a digest of
its source in mcp 2.3.0."""


@pytest.mark.parametrize(("owner", "name", "digest"), MIRRORED, ids=[f"{o.__name__}.{n}" for o, n, _ in MIRRORED])
def test_the_sdk_code_that_deferred_responses_mirrors_is_unchanged(owner: type, name: str, digest: str) -> None:
    """When the SDK changes one of these, re-read it against `gateway.serving.deferred_responses`,
    then record the new digest here: the module copies two methods and reaches into private state."""
    source = inspect.getsource(getattr(owner, name))
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == digest, (
        f"mcp's {owner.__name__}.{name} changed: check gateway/serving/deferred_responses.py against it"
    )


def test_the_session_open_bench_runs_both_modes() -> None:
    """`bench/session_open.py`, run briefly: a figure for each mode."""
    done = subprocess.run(
        [sys.executable, "bench/session_open.py", "--sessions", "5", "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["modes"]) == {"auto", "sse"}
    assert all(mode["sessions_per_s"] > 0 for mode in report["modes"].values())
    assert "auto/sse gateway CPU per session" in done.stdout
