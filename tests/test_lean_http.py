"""The lean HTTP/1.1 transport under the upstream httpx2 client (`gateway.upstreams.lean_http`).

Against servers on 127.0.0.1: hand-written HTTP servers that do exactly one awkward thing
each (close a kept-alive connection, split a chunked SSE body at odd bytes, never answer),
and the demo MCP server over streamable HTTP in both protocol eras, through a real registry.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.config.loader import load_config
from gateway.config.runtime_settings import UpstreamSettings
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.server_specs import specs_from_config
from gateway.upstreams import lean_http
from gateway.upstreams.lean_http import LeanTransport
from gateway.upstreams.transports import proxy_for, upstream_http_client
from tests.conftest import start_demo_http, stop_process, write_config
from tests.test_resilience import _text

pytestmark = pytest.mark.anyio

Handler = Callable[["Peer"], Awaitable[None]]


@dataclass
class Peer:
    """One accepted connection of a `RawServer`, and what the server has seen so far."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    server: RawServer

    async def request(self) -> bytes | None:
        """The next request (head and Content-Length body), or None at EOF."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await self.reader.readexactly(length)
        self.server.requests.append(head.split(b"\r\n", 1)[0])
        return head + body

    async def answer(self, body: bytes = b"ok", extra: bytes = b"") -> None:
        self.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body))
        await self.writer.drain()


@dataclass
class RawServer:
    handler: Handler
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed: int = 0
    """Connections whose client closed them (EOF seen by the handler's `request`)."""
    url: str = ""


@asynccontextmanager
async def raw_server(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[RawServer]:
    """An HTTP server (HTTPS with `tls`) on 127.0.0.1 whose every connection runs `handler`."""
    state = RawServer(handler)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            await handler(Peer(reader, writer, state))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    state.url = f"{'https' if tls else 'http'}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with server:
            yield state
    finally:
        server.close()


async def keep_alive(peer: Peer) -> None:
    """Answer every request on the connection; count the client's close."""
    while await peer.request() is not None:
        await peer.answer()
    peer.server.closed += 1


@asynccontextmanager
async def lean_client(timeout: float = 5.0) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(transport=LeanTransport(), timeout=timeout) as client:
        yield client


async def test_sequential_requests_share_one_kept_alive_connection() -> None:
    with anyio.fail_after(10):
        async with raw_server(keep_alive) as server, lean_client() as client:
            for i in range(5):
                response = await client.post(server.url + "/mcp", json={"n": i})
                assert (response.status_code, response.content) == (200, b"ok")
            assert server.connections == 1
            assert len(server.requests) == 5


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def answer_once_then_close(peer: Peer) -> None:
        await peer.request()
        await peer.answer()  # keep-alive by default in HTTP/1.1, then gone anyway

    with anyio.fail_after(10):
        async with raw_server(answer_once_then_close) as server, lean_client() as client:
            assert (await client.post(server.url, json={})).status_code == 200
            await anyio.sleep(0.1)  # the FIN arrives
            assert (await client.post(server.url, json={})).status_code == 200
            assert server.connections == 2


async def test_a_post_the_server_closed_on_without_answering_is_an_error_and_not_sent_again() -> None:
    """The server may have run the call: a POST is not replayed on a new connection; a GET is."""

    async def answer_once_then_drop_the_next(peer: Peer) -> None:
        if peer.server.connections == 1:
            await peer.request()
            await peer.answer()
            await peer.request()  # read the second request, then close without a word
            return
        await keep_alive(peer)

    with anyio.fail_after(10):
        async with raw_server(answer_once_then_drop_the_next) as server, lean_client() as client:
            await client.post(server.url + "/mcp", json={})
            with pytest.raises(httpx2.RemoteProtocolError, match=r"127\.0\.0\.1:\d+ closed a kept-alive .* POST /mcp"):
                await client.post(server.url + "/mcp", json={"call": 2})
            assert [line.split(b" ")[0] for line in server.requests] == [b"POST", b"POST"]

        async with raw_server(answer_once_then_drop_the_next) as server, lean_client() as client:
            await client.get(server.url + "/mcp")
            response = await client.get(server.url + "/mcp")  # sent again, on a new connection
            assert response.status_code == 200 and server.connections == 2


async def test_connection_close_is_honoured_and_idle_connections_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def close_after_answer(peer: Peer) -> None:
        await peer.request()
        await peer.answer(extra=b"Connection: close\r\n")

    with anyio.fail_after(10):
        async with raw_server(close_after_answer) as server, lean_client() as client:
            await client.get(server.url)
            await client.get(server.url)
            assert server.connections == 2

    monkeypatch.setattr(lean_http, "KEEPALIVE_EXPIRY", 0.2)
    with anyio.fail_after(10):
        async with raw_server(keep_alive) as server, lean_client() as client:
            await client.get(server.url)
            await anyio.sleep(0.3)
            await client.get(server.url)  # a new connection; the expired one is closed
            while server.closed < 1:  # the server sees its EOF (bounded by the fail_after)
                await anyio.sleep(0.01)
            assert server.connections == 2 and server.closed == 1


SSE_EVENTS = [b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\n\n'] + [
    b'event: message\ndata: {"jsonrpc":"2.0","id":%d,"result":{"n":"%s"}}\n\n' % (i, b"x" * (i * 37))
    for i in range(1, 9)
]


async def test_a_chunked_sse_body_split_at_odd_bytes_streams_whole_and_in_order() -> None:
    """Chunk-size lines, data and CRLFs split across writes at 1, 2, 3, 5, 7... bytes; the first
    event reaches the client before the server has sent the rest."""
    first_read = asyncio.Event()

    async def chunked_sse(peer: Peer) -> None:
        await peer.request()
        wire = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in SSE_EVENTS) + b"0\r\n\r\n"
        peer.writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        first = len(b"%x\r\n%s\r\n" % (len(SSE_EVENTS[0]), SSE_EVENTS[0]))
        peer.writer.write(wire[:first])
        await peer.writer.drain()
        await first_read.wait()
        sizes, at = [1, 2, 3, 5, 7, 11, 13], first
        while at < len(wire):
            step = sizes[at % len(sizes)]
            peer.writer.write(wire[at : at + step])
            await peer.writer.drain()
            await asyncio.sleep(0.001)
            at += step
        await keep_alive(peer)

    with anyio.fail_after(10):
        async with raw_server(chunked_sse) as server, lean_client() as client:
            received = b""
            async with client.stream("POST", server.url, json={}) as response:
                async for piece in response.aiter_bytes():
                    received += piece
                    if received == SSE_EVENTS[0]:
                        first_read.set()  # the rest is sent only now
            assert received == b"".join(SSE_EVENTS)
            assert (await client.get(server.url)).content == b"ok"
            assert server.connections == 1  # the chunked body was read to its end: reused


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "sent no HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "sent Content-Length b'ten'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", "chunk longer than its size"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "closed the connection before the whole body"),
    ],
)
async def test_a_malformed_answer_is_an_error_naming_the_origin_and_its_connection_is_dropped(
    answer: bytes, error: str
) -> None:
    async def send(peer: Peer) -> None:
        await peer.request()
        peer.writer.write(answer)
        await peer.writer.drain()
        if answer.endswith(b"abc"):
            return  # close mid-body
        await peer.request()  # EOF once the client drops the connection
        peer.server.closed += 1

    with anyio.fail_after(10):
        async with raw_server(send) as server, lean_client() as client:
            with pytest.raises(httpx2.RemoteProtocolError, match=r"127\.0\.0\.1:\d+ .*" + re.escape(error)):
                await client.get(server.url)
            for _ in range(100):
                if server.closed or answer.endswith(b"abc"):
                    break
                await anyio.sleep(0.02)
            assert server.closed == 1 or answer.endswith(b"abc")


async def test_an_informational_answer_before_the_response_is_skipped() -> None:
    async def early_hints(peer: Peer) -> None:
        await peer.request()
        peer.writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
        await peer.answer(b"the answer")
        await keep_alive(peer)

    with anyio.fail_after(10):
        async with raw_server(early_hints) as server, lean_client() as client:
            response = await client.get(server.url)
            assert (response.status_code, response.content) == (200, b"the answer")
            assert (await client.get(server.url)).content == b"ok" and server.connections == 1


async def test_timeouts_and_refused_connections_are_httpx_errors_naming_the_origin() -> None:
    async def never_answer(peer: Peer) -> None:
        await peer.request()
        await asyncio.sleep(30)

    with anyio.fail_after(10):
        async with raw_server(never_answer) as server, lean_client(timeout=0.3) as client:
            with pytest.raises(httpx2.ReadTimeout, match=r"127\.0\.0\.1:\d+"):
                await client.post(server.url, json={})
        port = int(server.url.rsplit(":", 1)[1])  # closed now
        async with lean_client() as client:
            with pytest.raises(httpx2.ConnectError, match=rf"127\.0\.0\.1:{port}"):
                await client.get(server.url)


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


async def test_https_is_verified_against_the_trust_httpx_would_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS with httpx2's default verification (`SSL_CERT_FILE` honoured); an unknown certificate
    is refused."""
    cert_file, key_file = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    with anyio.fail_after(10):
        async with raw_server(keep_alive, tls) as server:
            monkeypatch.delenv("SSL_CERT_FILE", raising=False)
            monkeypatch.delenv("SSL_CERT_DIR", raising=False)
            async with upstream_http_client(server.url, {}, None, "lean", "web") as client:
                with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await client.get(server.url)
            monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
            async with upstream_http_client(server.url, {}, None, "lean", "web") as client:
                assert isinstance(client._transport, LeanTransport)
                for _ in range(3):
                    assert (await client.post(server.url, json={})).content == b"ok"
            assert server.connections == 1  # handshakes that succeeded: one kept-alive connection


def test_a_proxy_from_the_environment_keeps_httpx_own_transport(caplog: pytest.LogCaptureFixture) -> None:
    assert proxy_for("http://127.0.0.1:9/mcp", {}) is None
    assert proxy_for("https://mcp.example.com/mcp", {"https": "http://proxy:3128"}) == "http://proxy:3128"
    assert proxy_for("http://mcp.example.com/mcp", {"all": "http://proxy:3128"}) == "http://proxy:3128"
    assert proxy_for("http://127.0.0.1:9/mcp", {"all": "http://proxy:3128", "no": "localhost,127.0.0.1"}) is None
    assert proxy_for("http://api.example.com/mcp", {"http": "http://proxy:3128", "no": "example.com"}) is None


def test_the_setting_and_a_proxy_choose_httpx_own_transport(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    url = "https://mcp.example.com/mcp"
    assert isinstance(upstream_http_client(url, {}, None, "lean", "web")._transport, LeanTransport)
    assert not isinstance(upstream_http_client(url, {}, None, "httpx", "web")._transport, LeanTransport)
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.internal:3128")
    with caplog.at_level(logging.INFO, logger="gateway.upstreams.transports"):
        client = upstream_http_client(url, {}, None, "lean", "web")
    assert not isinstance(client._transport, LeanTransport)
    assert "'web'" in caplog.text and "proxy.internal:3128" in caplog.text and "secret" not in caplog.text
    monkeypatch.setenv("GATEWAY_UPSTREAMS__HTTP_CLIENT", "httpx")
    assert Settings().upstreams.http_client == "httpx"


@pytest.fixture
def lean_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The methods of the requests the lean transport sent (the real one, counted on the way)."""
    sent: list[str] = []
    handle = LeanTransport.handle_async_request

    async def counted(self: LeanTransport, request: httpx2.Request) -> httpx2.Response:
        sent.append(request.method)
        return await handle(self, request)

    monkeypatch.setattr(LeanTransport, "handle_async_request", counted)
    return sent


@pytest.mark.parametrize(("protocol", "client"), [("auto", "lean"), ("legacy", "lean"), ("auto", "httpx")])
async def test_an_http_upstream_is_served_over_the_chosen_transport_in_both_protocol_eras(
    tmp_path: Path, lean_requests: list[str], protocol: str, client: Any
) -> None:
    """`auto` speaks 2026-07-28 with the demo server (JSON responses); `legacy` the handshake era
    (SSE responses and the GET stream)."""
    upstream, url = start_demo_http("web")
    try:
        config = load_config(
            write_config(tmp_path / "gateway.yaml", f"mcps:\n  web:\n    url: {url}\n    protocol: {protocol}\n")
        )
        settings = Settings(data_dir=tmp_path / "data", upstreams=UpstreamSettings(http_client=client))
        registry = Registry(specs_from_config(config), settings, relay_requests=False)
        with anyio.fail_after(30):
            async with registry.running():
                await registry.wait_settled(20)
                for i in range(3):
                    assert _text(await registry.call_tool("web__echo", {"text": f"hi {i}"})) == f"hi {i}"
                version = registry.upstreams["web"].protocol_version
        assert version == ("2026-07-28" if protocol == "auto" else "2025-11-25")
        if client == "lean":
            assert lean_requests.count("POST") >= 4
            assert ("GET" in lean_requests) == (protocol == "legacy")
        else:
            assert lean_requests == []
    finally:
        stop_process(upstream)


async def test_a_legacy_sse_upstream_is_served_over_the_lean_transport_and_reports_its_statuses(
    tmp_path: Path, lean_requests: list[str]
) -> None:
    """`transport: sse`: the GET event stream and every POSTed message go through the lean transport,
    and the statuses reach the supervisor as they do for streamable HTTP (202 for a POSTed message)."""
    upstream, url = start_demo_http("old", transport="sse")
    try:
        config = load_config(
            write_config(tmp_path / "gateway.yaml", f"mcps:\n  old:\n    url: {url}\n    transport: sse\n")
        )
        registry = Registry(specs_from_config(config), Settings(data_dir=tmp_path / "data"), relay_requests=False)
        with anyio.fail_after(30):
            async with registry.running():
                await registry.wait_settled(20)
                for i in range(3):
                    assert _text(await registry.call_tool("old__echo", {"text": f"hi {i}"})) == f"hi {i}"
                status = registry.upstreams["old"].http_status
        assert lean_requests[0] == "GET" and lean_requests.count("POST") >= 4
        assert status == 202
    finally:
        stop_process(upstream)


async def test_an_unreachable_http_upstream_fails_with_a_reason_naming_it(tmp_path: Path) -> None:
    async with raw_server(keep_alive) as server:
        url = server.url + "/mcp"
    config = load_config(write_config(tmp_path / "gateway.yaml", f"mcps:\n  gone:\n    url: {url}\n"))
    registry = Registry(specs_from_config(config), Settings(data_dir=tmp_path / "data"), relay_requests=False)
    with anyio.fail_after(30):
        async with registry.running():
            await registry.wait_settled(20)
            upstream = registry.upstreams["gone"]
            assert upstream.state == "failed"
            assert "ConnectError" in (upstream.reason or "") and url.split("//")[1].split("/")[0] in (
                upstream.reason or ""
            )
