"""The lean upstream path (`gateway.upstreams.lean_calls`) answers exactly as the SDK's client does.

Each scenario runs twice against a fresh real server (`tests/servers/wire_server.py`: a stdio
child, an HTTP server answering with JSON, one answering with SSE): once with
`upstreams.lean_calls` on, once off; the outcomes (results, gateway errors, progress reports,
cancellations the server saw) must be identical, and must be what the scenario expects. Tool calls,
resource reads and prompts alike (`gateway.upstreams.lean_calls`' three requests).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from gateway.config.loader import load_config
from gateway.config.runtime_settings import UpstreamSettings
from gateway.config.settings import Settings
from gateway.errors import GatewayError
from gateway.registry import Registry
from gateway.server_specs import specs_from_config
from gateway.upstreams import lean_calls, lean_http
from gateway.upstreams.lean_calls import channel_of
from gateway.upstreams.lean_http import LeanTransport
from gateway.upstreams.lean_post import DirectPost, HttpLean
from gateway.upstreams.lean_results import quick_shape, surely_shaped
from gateway.upstreams.message_bounds import bound_responses
from gateway.upstreams.sse_messages import MessageEvents
from tests.conftest import NO_EMBEDDINGS, REPO, start_gateway_http, start_script_http, stop_process, write_config

pytestmark = pytest.mark.anyio

WIRE = REPO / "tests" / "servers" / "wire_server.py"
KINDS = ("stdio", "json", "sse")
SMALLEST_BOUND = 64 * 1024

Scenario = Callable[[Registry, Path], Awaitable[Any]]


@contextmanager
def wire_entry(kind: str, log: Path, extra: str = "") -> Iterator[str]:
    """The YAML entry of a fresh wire server (`kind`: stdio, or HTTP answering json or sse)."""
    if kind == "stdio":
        args = json.dumps([str(WIRE), "stdio", "--log", str(log)])
        yield f"  wire:\n    command: {sys.executable}\n    args: {args}\n    protocol: legacy\n{extra}"
        return
    process, url = start_script_http([str(WIRE), "http", "--answer", kind, "--log", str(log)])
    try:
        yield f"  wire:\n    url: {url}\n    protocol: legacy\n{extra}"
    finally:
        stop_process(process)


@asynccontextmanager
async def gateway(tmp_path: Path, entry: str, lean: bool) -> AsyncIterator[Registry]:
    config = load_config(write_config(tmp_path / "gateway.yaml", "mcps:\n" + entry))
    settings = Settings(
        lean_path=True,  # the one switch the suite's `--lean-path off` pass sets: this test picks each path itself
        data_dir=tmp_path / "data",
        startup_timeout=20,
        upstreams=UpstreamSettings(lean_calls=lean, max_message_bytes=SMALLEST_BOUND),
    )
    registry = Registry(specs_from_config(config), settings, relay_requests=False)
    async with registry.running():
        await registry.wait_settled(25)
        client = registry.upstreams["wire"]._client
        assert client is not None
        assert (channel_of(client) is not None) == lean  # the path under test is the one taken
        yield registry


async def both(tmp_path: Path, kind: str, scenario: Scenario, extra: str = "") -> Any:
    """`scenario`'s outcome with the lean path on, asserted equal to its outcome with it off."""
    outcomes = []
    for lean in (True, False):
        run = tmp_path / ("lean" if lean else "sdk")
        run.mkdir()
        log = run / "wire.log"
        with wire_entry(kind, log, extra) as entry:
            async with gateway(run, entry, lean) as registry:
                with anyio.fail_after(30):
                    outcomes.append(await scenario(registry, log))
    assert outcomes[0] == outcomes[1]
    return outcomes[0]


async def outcome(registry: Registry, name: str, arguments: dict[str, Any], **options: Any) -> Any:
    """A result as JSON, or a gateway error as (class, code, message)."""
    try:
        result = await registry.call_tool(f"wire__{name}", arguments, **options)
    except GatewayError as exc:
        return type(exc).__name__, exc.code, exc.message
    except (ValidationError, RuntimeError) as exc:  # raised as the SDK raises it
        return type(exc).__name__, "", str(exc)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def call(name: str, arguments: dict[str, Any] | None = None) -> Scenario:
    async def scenario(registry: Registry, log: Path) -> Any:
        return await outcome(registry, name, arguments or {})

    return scenario


@pytest.mark.parametrize("kind", KINDS)
async def test_results_are_the_same_on_both_paths(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        return [
            await outcome(registry, "text", {"who": "Ada"}),
            await outcome(registry, "structured", {"a": 2, "b": 3}),
            await outcome(registry, "error", {}),
            await outcome(registry, "image", {}),
        ]

    text, structured, error, image = await both(tmp_path, kind, scenario)
    assert text["content"] == [{"type": "text", "text": "hello Ada"}] and not text["isError"]
    assert structured["structuredContent"] == {"sum": 5}
    assert error["isError"] is True and error["content"][0]["text"] == "it failed"
    assert image["content"][0]["type"] == "image" and image["content"][0]["mimeType"] == "image/png"


@pytest.mark.parametrize("kind", KINDS)
async def test_progress_reaches_the_calls_callback_on_both_paths(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        reports: list[tuple[float, float | None, str | None]] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            reports.append((value, total, message))

        return await outcome(registry, "progress", {}, progress=progress), reports

    result, reports = await both(tmp_path, kind, scenario)
    assert result["content"][0]["text"] == "counted"
    if kind != "json":  # a JSON answer has no stream to report on
        assert reports == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_too_large_result_is_refused_the_same_way(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        name, code, message = await outcome(registry, "big", {"size": 2 * SMALLEST_BOUND})
        return name, code, re.sub(r"with [\d,]+ bytes", "with N bytes", message)  # the ids differ in length

    name, code, message = await both(tmp_path, kind, scenario)
    assert (name, code) == ("ResultTooLarge", "result_too_large")
    assert "'wire'" in message and "GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES" in message


@pytest.mark.parametrize("kind", KINDS)
async def test_a_malformed_result_fails_the_same_clear_way(tmp_path: Path, kind: str) -> None:
    name, _code, message = await both(tmp_path, kind, call("malformed"))
    assert name == "ValidationError" and "CallToolResult" in message and "content" in message


@pytest.mark.parametrize("kind", ("stdio", "json"))
async def test_structured_content_its_output_schema_refuses_fails_the_same_way(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        return [await outcome(registry, "mismatch", {}), await outcome(registry, "structured", {"a": 1, "b": 1})]

    (name, _code, message), fine = await both(tmp_path, kind, scenario)
    assert name == "RuntimeError" and "Invalid structured content returned by tool mismatch" in message
    assert "'five' is not of type 'integer'" in message and fine["structuredContent"] == {"sum": 2}


SHAPES = {
    "tools/call": [
        {"content": [{"type": "text", "text": "x"}], "structuredContent": {"a": 1}, "isError": False},
        {"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]},
        {"content": [{"type": "text", "text": "x", "annotations": {"priority": 7}}]},
        {"content": "not a list"},
        {"content": [], "isError": "no"},
    ],
    "resources/read": [
        {"contents": [{"uri": "a:/b", "text": "t", "mimeType": "text/plain"}]},
        {"contents": [{"uri": "a:/b", "blob": "AA=="}]},
        {"contents": [{"uri": 5, "text": "t"}]},
    ],
    "prompts/get": [
        {"description": "d", "messages": [{"role": "user", "content": {"type": "text", "text": "t"}}]},
        {"messages": [{"role": "nobody", "content": {"type": "text", "text": "t"}}]},
        {"messages": [{"role": "user"}]},
    ],
}
ENVELOPES = [
    {},
    {"_meta": {"io.modelcontextprotocol/serverInfo": {"name": "up", "version": "1"}}},
    {"_meta": {"other": 1}},
    {"resultType": "complete"},
    {"resultType": "input_required"},
    {"resultType": "complete", "ttlMs": 5, "cacheScope": "public"},
    {"resultType": "complete", "ttlMs": -5, "cacheScope": "public"},
]


def test_a_quick_shape_is_one_the_sdk_accepts_in_every_version() -> None:
    """`lean_results.quick_shape` skips the SDK's check only where the check passes; and it does
    skip it for the common shapes of each era."""
    quick = set()
    for (method, version), _row in _methods.SERVER_RESULTS.items():
        for body in SHAPES.get(method, []):
            for envelope in ENVELOPES:
                raw = body | envelope
                if quick_shape(method, version, raw):
                    _methods.validate_server_result(method, version, raw)  # raises if the SDK would refuse it
                    quick.add((method, version in MODERN_PROTOCOL_VERSIONS))
    assert quick == {(method, modern) for method in SHAPES for modern in (False, True)}


def test_a_result_surely_shaped_is_what_the_sdks_serialization_gives_in_every_version() -> None:
    """`lean_results.surely_shaped` (the lean paths' answers) returns a served result only where it
    equals the SDK runner's `serialize_server_result`, which drops the fields a version lacks; and
    it does so for the common shapes of each era."""
    answered = set()
    for (method, version), _row in _methods.SERVER_RESULTS.items():
        for body in SHAPES.get(method, []):
            for envelope in ENVELOPES:
                raw = body | envelope
                shaped = surely_shaped(method, version, dict(raw))
                if shaped is not None:
                    assert shaped == _methods.serialize_server_result(method, version, raw), (method, version, raw)
                    answered.add((method, version in MODERN_PROTOCOL_VERSIONS))
    assert answered == {(method, modern) for method in SHAPES for modern in (False, True)}
    assert surely_shaped("tools/call", "1999-01-01", {"content": []}) is None  # the SDK's error for it


async def _cancellations(log: Path) -> list[str]:
    with anyio.fail_after(10):
        while not (log.exists() and "cancelled" in log.read_text()):
            await anyio.sleep(0.05)
    return [line.split()[0] for line in log.read_text().splitlines()]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_timed_out_call_is_cancelled_upstream_on_both_paths(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        return await outcome(registry, "slow", {"seconds": 30}), await _cancellations(log)

    (name, code, message), cancelled = await both(
        tmp_path, kind, scenario, extra="    tool_timeouts:\n      slow: 0.5\n"
    )
    assert name == "UpstreamTimeout" and "wire" in message
    assert cancelled == ["cancelled"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancelled_call_is_cancelled_upstream_on_both_paths(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        with anyio.move_on_after(0.5) as scope:
            await registry.call_tool("wire__slow", {"seconds": 30})
        assert scope.cancelled_caught
        cancelled = await _cancellations(log)
        return cancelled, await outcome(registry, "text", {"who": "again"})  # the connection stays usable

    cancelled, after = await both(tmp_path, kind, scenario)
    assert cancelled == ["cancelled"] and after["content"][0]["text"] == "hello again"


@pytest.mark.parametrize("kind", ("json", "sse"))
async def test_an_expired_http_session_is_reconnected_the_same_way(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        first = await outcome(registry, "forget", {})
        second = await outcome(registry, "text", {"who": "later"})
        third = await outcome(registry, "text", {"who": "later"})  # retried until the new session, or refused
        return first, second, third

    first, _second, third = await both(tmp_path, kind, scenario, extra="    retry_tools: [text]\n")
    assert first["content"][0]["text"] == "forgot"
    assert third["content"][0]["text"] == "hello later"


def _sampler(context: Any, params: types.CreateMessageRequestParams) -> Awaitable[types.CreateMessageResult]:
    async def answer() -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="4"), model="m")

    return answer()


@pytest.mark.parametrize("kind", ("stdio", "sse"))
async def test_a_sampling_request_during_a_request_reaches_the_client_on_both_paths(tmp_path: Path, kind: str) -> None:
    answers = []
    for lean in ("true", "false"):
        run = tmp_path / lean
        run.mkdir()
        with wire_entry(kind, run / "wire.log") as entry:
            config = write_config(run / "gateway.yaml", "mcps:\n" + entry)
            lean_calls = {"GATEWAY_LEAN_PATH": "true", "GATEWAY_UPSTREAMS__LEAN_CALLS": lean}
            process, url = start_gateway_http(config, run, NO_EMBEDDINGS | lean_calls)
            try:
                with anyio.fail_after(30):
                    async with Client(url, mode="legacy", sampling_callback=_sampler) as client:
                        result = await client.call_tool("wire__sample", {})
                        listed = await client.list_resources()
                        uri = next(r.uri for r in listed.resources if r.uri.endswith("sample"))
                        resource = await client.read_resource(uri)
                        prompt = await client.get_prompt("wire__sample")
                        answers.append(
                            [
                                result.model_dump(mode="json", exclude={"meta"}),
                                resource.model_dump(mode="json", exclude={"meta"}),
                                prompt.model_dump(mode="json", exclude={"meta"}),
                            ]
                        )
            finally:
                stop_process(process)
    assert answers[0] == answers[1]
    called, resource, prompt = answers[0]
    assert '"text": "4"' in called["content"][0]["text"], called
    assert '"text": "4"' in resource["contents"][0]["text"], resource
    assert '"text": "4"' in prompt["messages"][0]["content"]["text"], prompt


def test_the_one_lean_path_switch_turns_the_forwarding_off_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LEAN_PATH", "false")
    settings = Settings()
    assert (settings.lean_path, settings.http.lean_path, settings.upstreams.lean_calls) == (False, False, False)
    monkeypatch.setenv("GATEWAY_LEAN_PATH", "true")
    monkeypatch.setenv("GATEWAY_UPSTREAMS__LEAN_CALLS", "false")  # each part can still be turned off alone
    settings = Settings()
    assert (settings.http.lean_path, settings.upstreams.lean_calls) == (True, False)


async def read(registry: Registry, what: str, kind: str, arg: str = "", timeout: float | None = None) -> Any:
    """A resource's or a prompt's outcome through the upstream (the lean path when it is bound), as
    JSON, or an error as (class, code, message)."""
    upstream = registry.upstreams["wire"]
    if what == "resource":
        uri = f"wire://{kind}" + (f"/{arg}" if arg else "")
        operation, send = f"resources/read {uri!r}", lambda c: lean_calls.read_resource(c, uri)
    else:
        arguments = {"arg": arg} if arg else None
        operation, send = f"prompts/get {kind!r}", lambda c: lean_calls.get_prompt(c, kind, arguments)
    try:
        result = await upstream.request(operation, send, timeout=timeout)
    except GatewayError as exc:
        return type(exc).__name__, exc.code, exc.message
    except MCPError as exc:
        return type(exc).__name__, exc.code, exc.message
    except ValidationError as exc:
        return type(exc).__name__, "", str(exc)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.parametrize("kind", KINDS)
async def test_resources_and_prompts_read_the_same_on_both_paths(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        return [
            await read(registry, "resource", "text", "a"),
            await read(registry, "resource", "blob"),
            await read(registry, "resource", "unknown"),
            await read(registry, "resource", "malformed"),
            await read(registry, "prompt", "text", "b"),
            await read(registry, "prompt", "unknown"),
            await read(registry, "prompt", "malformed"),
        ]

    text, blob, unknown, malformed, prompt, no_prompt, bad_prompt = await both(tmp_path, kind, scenario)
    assert text["contents"] == [{"uri": "wire://text", "mimeType": "text/plain", "text": "the resource a"}]
    assert blob["contents"][0]["blob"] and blob["contents"][0]["mimeType"] == "image/png"
    assert unknown == ("MCPError", -32002, "Resource not found: wire://unknown")
    assert malformed[0] == "ValidationError" and "ReadResourceResult" in malformed[2]
    assert prompt["messages"] == [{"role": "user", "content": {"type": "text", "text": "the prompt b"}}]
    assert prompt["description"] == "text"
    assert no_prompt == ("MCPError", -32602, "Unknown prompt: unknown")
    assert bad_prompt[0] == "ValidationError" and "GetPromptResult" in bad_prompt[2]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_too_large_resource_or_prompt_is_refused_the_same_way(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        found = []
        for what in ("resource", "prompt"):
            name, code, message = await read(registry, what, "big", str(2 * SMALLEST_BOUND))
            found.append((name, code, re.sub(r"with [\d,]+ bytes", "with N bytes", message)))
        return found

    for name, code, message in await both(tmp_path, kind, scenario):
        assert (name, code) == ("ResultTooLarge", "result_too_large")
        assert "'wire'" in message and "GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES" in message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("what", ["resource", "prompt"])
async def test_a_timed_out_read_is_cancelled_upstream_on_both_paths(tmp_path: Path, kind: str, what: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        timed_out = await read(registry, what, "slow", "30", timeout=0.5)
        return timed_out, await _cancellations(log), await read(registry, what, "text", "again")

    (name, _code, message), cancelled, after = await both(tmp_path, kind, scenario)
    assert name == "UpstreamTimeout" and "wire" in message and cancelled == ["cancelled"]
    assert "again" in json.dumps(after)


@pytest.mark.parametrize("kind", ("json", "sse"))
async def test_an_expired_session_under_a_read_is_reconnected_the_same_way(tmp_path: Path, kind: str) -> None:
    async def scenario(registry: Registry, log: Path) -> Any:
        first = await read(registry, "resource", "forget")
        second = await read(registry, "prompt", "text", "later")
        with anyio.fail_after(10):  # the supervisor re-makes the session
            while (third := await read(registry, "resource", "text", "later")) and isinstance(third, tuple):
                await anyio.sleep(0.1)
        return first, second, third

    first, second, third = await both(tmp_path, kind, scenario)
    assert first["contents"][0]["text"] == "forgot"
    assert second[0] == "UpstreamUnavailable", second
    assert third["contents"][0]["text"] == "the resource later"


# An answer read straight off the connection (`lean_post.HttpLean`'s direct POST) against the same
# bytes read through httpx2 (`Response`, `EventSource`, `BoundedStream` as a response hook), from a
# hand-written HTTP server on 127.0.0.1 that writes each answer a few bytes at a time.

RAW_LIMIT = 2000
ASK = {"jsonrpc": "2.0", "id": "gw-1", "method": "tools/call", "params": {"name": "t"}}
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: s-2\r\nTransfer-Encoding: chunked\r\n\r\n"
)
JSON_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def _answer(result: str = "done", request_id: str = "gw-1") -> bytes:
    content = [{"type": "text", "text": result}]
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": content}}).encode()


def _notice(method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()


def _chunked(body: bytes, size: int = 7) -> bytes:
    pieces = [body[at : at + size] for at in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def _json(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )


SSE_BODY = (  # a comment, a ping, progress, a log line (CR line ends), a notification, a two-line answer
    b": a comment\r\n\r\nevent: ping\r\ndata: {}\r\n\r\nevent: message\ndata: "
    + _notice("notifications/progress", progressToken="gw-1", progress=1, total=2, message="half")
    + b"\n\ndata: "
    + _notice("notifications/message", level="info", data="a log line")
    + b"\r\rdata: "
    + _notice("notifications/tools/list_changed")
    + b'\n\nevent: message\ndata: {"jsonrpc": "2.0",\ndata:  "id": "gw-1", "result": {"content": []}}\n\n'
)
BIG = "x" * RAW_LIMIT
ZIPPED = gzip.compress(_answer("zipped"))
ANSWERS = {
    "json": _json(_answer()),
    "json-chunked": JSON_CHUNKED + _chunked(_answer()),
    "sse": SSE_HEAD + _chunked(SSE_BODY, 11),
    "sse-length": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s"
    % (len(SSE_BODY), SSE_BODY),
    "sse-to-eof": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: "
    + _answer("at eof")
    + b"\r",  # a CR at the body's very end dispatches its event
    "sse-invalid-utf8": SSE_HEAD + _chunked(b"data: " + _answer("cafX").replace(b"X", b"\xc3") + b"\n\n"),
    "json-too-large": _json(_answer(BIG)),
    "chunked-too-large": JSON_CHUNKED + _chunked(_answer(BIG), 500),
    "sse-event-too-large": SSE_HEAD
    + _chunked(
        b"data: " + _notice("notifications/message", level="info", data=BIG) + b"\n\ndata: " + _answer() + b"\n\n", 300
    ),
    "sse-no-answer": SSE_HEAD + _chunked(b"data: " + _answer("not ours", "gw-9") + b"\n\n"),
    "json-cut": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n" + _answer()[:30],
    "sse-cut": (SSE_HEAD + _chunked(b"data: " + _answer() + b"\n\n"))[:-30],
    "error-status": b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n",
    "gzip": _json(ZIPPED, b"Content-Encoding: gzip\r\n"),
}
CLOSING = ("sse-to-eof", "json-cut", "sse-cut")
"""The server closes the connection after these answers."""


async def read_post(reader: asyncio.StreamReader) -> Any:
    """The JSON body of the next request on a connection (its head read past, by Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    return json.loads(await reader.readexactly(int(length.group(1)) if length else 0))


Reply = Callable[[Any, asyncio.StreamWriter], Awaitable[bool]]
"""Writes the answer to a request's JSON body; True closes the connection after it."""


@asynccontextmanager
async def posts_served(reply: Reply) -> AsyncIterator[tuple[str, list[int]]]:
    """An HTTP server on 127.0.0.1 answering each POST with `reply`. Yields its URL and a list that
    counts its connections."""
    connections = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while not await reply(await read_post(reader), writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp", connections


@asynccontextmanager
async def scripted(answer: bytes, close: bool) -> AsyncIterator[tuple[str, list[int]]]:
    """An HTTP server answering its first request with `answer`, 13 bytes a write (then closing,
    with `close`), and every later one with a small JSON answer. Yields its URL and a list that
    counts its connections."""

    async def reply(sent: Any, writer: asyncio.StreamWriter) -> bool:
        if sent["id"] != "gw-1":
            writer.write(_json(_answer("again", sent["id"])))
            return False
        for at in range(0, len(answer), 13):
            writer.write(answer[at : at + 13])
            await writer.drain()
            await asyncio.sleep(0)
        return close

    async with posts_served(reply) as served:
        yield served


async def raw_outcome(url: str, direct: bool) -> Any:
    """One lean request to `url` (read off the connection, or through httpx2): its outcome, what
    it reported, relayed and handed to the SDK, the session id noted, and a second request's result."""
    transport = LeanTransport()
    http = bound_responses(httpx2.AsyncClient(transport=transport, timeout=5), RAW_LIMIT, "raw")
    reports: list[Any] = []
    logs: list[Any] = []
    handed: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async def progress(value: float, total: float | None, message: str | None) -> None:
        reports.append((value, total, message))

    async def inject(item: Any) -> None:
        handed.append(type(item).__name__)

    lean = HttpLean(url, on_log)
    post = DirectPost(transport, url, http.headers, http.timeout, lambda status: None, RAW_LIMIT, "raw")
    lean.attach(http, post if direct else None)
    lean.inject = inject
    async with http:
        try:
            found: Any = await lean.exchange("gw-1", dict(ASK), {}, progress)
        except MCPError as exc:
            found = (exc.error.code, re.sub(r"than \d+ bytes", "than N bytes", exc.error.message))
        while transport._finishing:  # an SSE answer's end, read in the background
            await asyncio.sleep(0.01)
        again = None if lean.broken else await lean.exchange("gw-2", dict(ASK, id="gw-2"), {}, None)
        return found, reports, logs, handed, lean.session_id, again


def _limit_error(size: str) -> tuple[int, str]:
    message = (
        f"The answer is {size} bytes, over the gateway's limit of {RAW_LIMIT} (GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES)."
    )
    return types.INTERNAL_ERROR, message


EXPECTED: dict[str, Any] = {
    "json": {"content": [{"type": "text", "text": "done"}]},
    "json-chunked": {"content": [{"type": "text", "text": "done"}]},
    "sse": {"content": []},
    "sse-length": {"content": []},
    "sse-to-eof": {"content": [{"type": "text", "text": "at eof"}]},
    "sse-invalid-utf8": {"content": [{"type": "text", "text": "caf\ufffd"}]},
    "json-too-large": _limit_error(str(len(_answer(BIG)))),
    "chunked-too-large": _limit_error("more than N"),
    "sse-event-too-large": _limit_error("more than N"),
    "sse-no-answer": (types.CONNECTION_CLOSED, "SSE stream ended without a response"),
    "json-cut": (types.CONNECTION_CLOSED, "Connection closed"),
    "sse-cut": (types.CONNECTION_CLOSED, "Connection closed"),
    "error-status": (types.INTERNAL_ERROR, "Server returned an error response"),
    "gzip": {"content": [{"type": "text", "text": "zipped"}]},
}


@pytest.mark.parametrize("case", list(ANSWERS))
async def test_an_answer_read_off_the_connection_is_what_httpx2_reads_of_it(case: str) -> None:
    outcomes = []
    with anyio.fail_after(20):
        for direct in (True, False):
            async with scripted(ANSWERS[case], case in CLOSING) as (url, connections):
                outcomes.append(await raw_outcome(url, direct))
            if direct and case in ("json", "json-chunked", "sse", "sse-length"):
                assert connections == [1], case  # read to its end (an SSE answer: after it), the connection is kept
    assert outcomes[0] == outcomes[1]
    found, reports, logs, handed, session_id, again = outcomes[0]
    assert found == EXPECTED[case]
    if case in ("sse", "sse-length"):
        assert (reports, logs, handed) == ([(1.0, 2.0, "half")], ["a log line"], ["SessionMessage"])
    assert session_id == ("s-2" if case.startswith("sse") and case not in ("sse-length", "sse-to-eof") else None)
    assert again == (None if case.endswith("cut") else {"content": [{"type": "text", "text": "again"}]})


SSE_CORPUS = [
    SSE_BODY,
    b"data: a\ndata: b\n\ndata:x\r\n\r\ndata:  y\r\rdata\n\nevent: other\ndata: z\n\n"
    + b"event:\ndata: w\n\n: c\ndata: v\n\n",
    b"id: 1\nretry: 5\n\ndata: \xc3(\n\ndata: last\r",
]


async def _httpx2_messages(pieces: list[bytes]) -> list[bytes]:
    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    stream = httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())
    stream.request = httpx2.Request("POST", "http://127.0.0.1/mcp")
    events = httpx2.EventSource(stream, max_event_size=None)
    return [event.data.encode() async for event in events if event.event == "message" and event.data]


async def test_the_message_events_are_those_httpx2_reads_wherever_the_body_is_split() -> None:
    for body in SSE_CORPUS:
        expected = await _httpx2_messages([body])
        assert len(expected) >= 2
        for cut in range(len(body) + 1):
            size = cut or 1
            for pieces in ([body[:cut], body[cut:]], [body[at : at + size] for at in range(0, len(body), size)]):
                parser = MessageEvents()
                found = [data for piece in pieces for data in parser.feed(piece)] + parser.end()
                assert [data.decode("utf-8", "replace").encode() for data in found] == expected, (body, cut)


async def test_an_sse_answer_whose_stream_stays_open_drops_its_connection_after_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lean_http, "FINISH_SECONDS", 0.2)
    unended = SSE_HEAD + _chunked(b"data: " + _answer() + b"\n\n")[: -len(b"0\r\n\r\n")]
    with anyio.fail_after(10):
        async with scripted(unended, close=False) as (url, connections):
            found, *_, again = await raw_outcome(url, direct=True)
    assert found == {"content": [{"type": "text", "text": "done"}]}
    assert again == {"content": [{"type": "text", "text": "again"}]} and connections == [2]
