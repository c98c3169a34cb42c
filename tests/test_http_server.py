"""The gateway's HTTP/1.1 server (`gateway.serving.http_protocol`, `gateway.serving.hot_front`) seen
from real sockets: kept-alive and pipelined requests, heads in pieces, chunked bodies, bodies over
the limit, concurrent connections, a client hanging up mid-call, and refusals on the hot front
that are the guard's own (the same request sent the whole ASGI way, with a `traceparent` that
tracing-off ignores, gets the same answer).

A real gateway child on 127.0.0.1 with the demo server as a stdio child; the session is opened
with httpx2, then raw HTTP/1.1 is written on plain sockets.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.serving.http_protocol import front_protocol
from tests.conftest import NO_EMBEDDINGS, demo_child_config, start_gateway_http, stop_process

VERSION = "2025-06-18"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MAX_BODY = 20_000
LOG: list[Path] = []
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """The gateway's port and an open session's id (its handshake and a `tools/list` done); its log
    is `LOG[0]`."""
    folder = tmp_path_factory.mktemp("server")
    config = demo_child_config(folder)
    config.write_text(config.read_text() + f"security:\n  limits: {{max_request_bytes: {MAX_BODY}}}\n")
    LOG[:] = [folder / "gateway.log"]
    env = NO_EMBEDDINGS | {"GATEWAY_ROUTING__MODE": "all", "GATEWAY_LOG_LEVEL": "DEBUG"}
    process, url = start_gateway_http(config, folder, env, LOG[0])
    try:
        with httpx2.Client(timeout=20) as http:
            init = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
            opened = http.post(url, headers=HEADERS, json=_rpc("initialize", init, 1))
            session_id = opened.headers["mcp-session-id"]
            session = HEADERS | {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": VERSION}
            http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert http.post(url, headers=session, json=_rpc("tools/list", None, 2)).status_code == 200
        yield int(url.rsplit(":", 1)[1].split("/")[0]), session_id
    finally:
        stop_process(process)


def _rpc(method: str, params: dict[str, Any] | None, id_: int | str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params is not None else {})}


def _echo(text: str, id_: int | str) -> bytes:
    return json.dumps(_rpc("tools/call", {"name": "demo__echo", "arguments": {"text": text}}, id_)).encode()


def _request(session: str, body: bytes, *, extra: str = "", host: str = "127.0.0.1:8") -> bytes:
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Type: application/json\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: {VERSION}\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Reader:
    """HTTP/1.1 answers read off one socket (Content-Length or chunked bodies)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the gateway closed the connection")
        self.buffer += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        status = int(self._line().split()[1])
        headers: dict[str, str] = {}
        while line := self._line():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            return status, headers, self._take(int(headers["content-length"]))
        body = b""
        while size := int(self._line(), 16):
            body += self._take(size)
            self._take(2)
        self._take(2)
        return status, headers, body


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _echoed(body: bytes) -> str:
    answer = json.loads(body)
    return str(answer["result"]["content"][0]["text"])


def test_kept_alive_and_pipelined_calls_are_answered_in_order(gateway: tuple[int, str]) -> None:
    port, session = gateway
    with _connect(port) as sock:
        reader = _Reader(sock)
        sock.sendall(b"".join(_request(session, _echo(f"piped {n}", 10 + n)) for n in range(3)))  # one write
        for n in range(3):
            status, headers, body = reader.answer()
            assert status == 200 and headers["content-type"] == "application/json", body
            assert headers["mcp-session-id"] == session and json.loads(body)["id"] == 10 + n
            assert _echoed(body) == f"piped {n}"
        if os.environ.get("GATEWAY_LEAN_PATH") != "false":  # past the outer layers (`--lean-path off`: no front)
            deadline = time.monotonic() + 10
            while LOG[0].read_text().count("hot front: /mcp") < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert LOG[0].read_text().count("hot front: /mcp") >= 3
        for n in range(3):  # then one at a time on the same connection
            sock.sendall(_request(session, _echo(f"kept {n}", 20 + n)))
            status, _, body = reader.answer()
            assert status == 200 and _echoed(body) == f"kept {n}"


def test_a_head_and_body_sent_in_pieces_are_served(gateway: tuple[int, str]) -> None:
    port, session = gateway
    whole = _request(session, _echo("pieces", 30))
    with _connect(port) as sock:
        for start in range(0, len(whole), 97):
            sock.sendall(whole[start : start + 97])
            time.sleep(0.02)
        status, _, body = _Reader(sock).answer()
    assert status == 200 and _echoed(body) == "pieces"


def test_a_chunked_request_body_is_served(gateway: tuple[int, str]) -> None:
    port, session = gateway
    body = _echo("chunked", 40)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:20], body[20:])) + b"0\r\n\r\n"
    head = _request(session, b"").replace(b"Content-Length: 0\r\n", b"Transfer-Encoding: chunked\r\n")
    with _connect(port) as sock:
        sock.sendall(head + chunks)
        status, _, answer = _Reader(sock).answer()
    assert status == 200 and _echoed(answer) == "chunked"


def test_a_body_over_the_limit_is_refused_413_with_or_without_a_length(gateway: tuple[int, str]) -> None:
    port, session = gateway
    big = _echo("x" * MAX_BODY, 50)
    with _connect(port) as sock:
        sock.sendall(_request(session, big))
        status, _, body = _Reader(sock).answer()
    assert status == 413 and body == b"Request body too large"
    head = _request(session, b"").replace(b"Content-Length: 0\r\n", b"Transfer-Encoding: chunked\r\n")
    with _connect(port) as sock:
        sock.sendall(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big))
        status, _, body = _Reader(sock).answer()
    assert status == 413 and body == b"Request body too large"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"host": "evil.example.com"}, id="foreign-host"),
        pytest.param({"extra": "Origin: http://evil.example.com\r\n"}, id="foreign-origin"),
        pytest.param({"extra": "X-Forwarded-For: 203.0.113.9\r\n"}, id="beyond-loopback"),
    ],
)
def test_a_refused_hot_request_gets_the_guards_own_answer(gateway: tuple[int, str], change: dict[str, str]) -> None:
    """The same refused request on the hot front and the whole ASGI way (a `traceparent` sends it there)."""
    port, session = gateway
    answers = []
    for trace in ("", f"traceparent: {TRACEPARENT}\r\n"):
        kwargs = dict(change, extra=change.get("extra", "") + trace)
        with _connect(port) as sock:
            sock.sendall(_request(session, _echo("refused", 60), **kwargs))
            status, headers, body = _Reader(sock).answer()
        answers.append((status, headers["content-type"], body))
    assert answers[0] == answers[1] and answers[0][0] == 403, answers


def test_concurrent_connections_each_get_their_own_answers(gateway: tuple[int, str]) -> None:
    port, session = gateway

    def client(n: int) -> list[str]:
        got = []
        with _connect(port) as sock:
            reader = _Reader(sock)
            for k in range(5):
                sock.sendall(_request(session, _echo(f"{n}-{k}", f"c{n}-{k}")))
                status, _, body = reader.answer()
                assert status == 200 and json.loads(body)["id"] == f"c{n}-{k}"
                got.append(_echoed(body))
        return got

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(client, range(20)))
    assert results == [[f"{n}-{k}" for k in range(5)] for n in range(20)]


def test_a_client_hanging_up_mid_call_leaves_the_others_served(gateway: tuple[int, str]) -> None:
    port, session = gateway
    call = json.dumps(_rpc("tools/call", {"name": "demo__sleep", "arguments": {"seconds": 30}}, 70)).encode()
    cancelled = _metric(port, "mcp_gateway_tool_calls_total{", 'tool="demo__sleep"', 'status="cancelled"')
    hung_up = _connect(port)
    hung_up.sendall(_request(session, call))
    _wait_for(lambda: _metric(port, "mcp_gateway_tool_calls_in_flight{", 'server="demo"') == 1, "the call to run")
    hung_up.close()  # mid-call
    with _connect(port) as sock:
        sock.sendall(_request(session, _echo("after", 71)))
        status, _, body = _Reader(sock).answer()
    assert status == 200 and _echoed(body) == "after"
    _wait_for(  # well before its 30 s
        lambda: (
            _metric(port, "mcp_gateway_tool_calls_total{", 'tool="demo__sleep"', 'status="cancelled"') == cancelled + 1
        ),
        "the hung-up call to be cancelled",
    )


def _metric(port: int, prefix: str, *labels: str) -> float:
    """The sum of the series of the gateway's `/metrics` named by `prefix` with all `labels`."""
    metrics = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(prefix) and all(label in line for label in labels)
    )


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.02)


def test_the_protocol_is_uvicorns_with_its_head_handling_as_copied() -> None:
    """`front_protocol` copies uvicorn's `on_headers_complete`: a new uvicorn must be looked at."""
    source = inspect.getsource(HttpToolsProtocol.on_headers_complete)
    assert issubclass(front_protocol(None), HttpToolsProtocol)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == "1ea8589acfad92d8", (  # uvicorn 0.54
        "uvicorn's HttpToolsProtocol.on_headers_complete changed: bring "
        "gateway/serving/http_protocol.py's copy in line, then update this digest"
    )
