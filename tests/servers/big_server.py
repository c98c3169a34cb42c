"""A real MCP server whose `big` tool answers with as many bytes as asked, written piece by piece.

Standard library only, over stdio (one JSON line per message) or plain streamable HTTP
(`--port`: prints `PORT=<n>`; answers as JSON with Content-Length, JSON chunked, or SSE).
It never holds a large answer whole, so 200 MB costs it no memory and the gateway's reading
is what a test or benchmark measures. `--id-last` writes the id after the result, as the
TypeScript SDK does. Tools: `big {size}` (text of `size` bytes) and `echo {text}`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PIECE = 1024 * 1024
TOOLS = [
    {
        "name": "big",
        "description": "Answer with a text of `size` bytes.",
        "inputSchema": {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]},
    },
    {
        "name": "echo",
        "description": "Echo the text back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
]


def answer(message: dict, id_last: bool) -> Iterator[bytes]:
    """The reply to a request, in pieces."""
    method, params = message.get("method"), message.get("params") or {}
    ident = json.dumps(message["id"]).encode()
    head, tail = (
        (b'{"result":', b',"jsonrpc":"2.0","id":' + ident + b"}")
        if id_last
        else (
            b'{"jsonrpc":"2.0","id":' + ident + b',"result":',
            b"}",
        )
    )
    if method == "initialize":
        result = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "big", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "ping":
        result = {}
    elif method == "tools/call" and params.get("name") == "big":
        size = int(params["arguments"]["size"])
        yield head + b'{"content":[{"type":"text","text":"'
        for start in range(0, size, PIECE):
            yield b"x" * min(PIECE, size - start)
        yield b'"}],"isError":false}' + tail
        return
    elif method == "tools/call" and params.get("name") == "echo":
        result = {"content": [{"type": "text", "text": params["arguments"]["text"]}], "isError": False}
    else:
        error = {"code": -32601, "message": f"Method not found: {method}"}
        yield json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}).encode()
        return
    yield head + json.dumps(result).encode() + tail


def serve_stdio(id_last: bool) -> None:
    out = sys.stdout.buffer
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue  # a notification, or an answer
        for piece in answer(message, id_last):
            out.write(piece)
        out.write(b"\n")
        out.flush()


def handler(mode: str, id_last: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # no server-to-client stream
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_DELETE = do_GET

        def do_POST(self) -> None:
            message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if "id" not in message or "method" not in message:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            try:
                self._reply(lambda: answer(message, id_last))
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the gateway stopped reading: what the test wants

        def _reply(self, pieces: Callable[[], Iterator[bytes]]) -> None:
            self.send_response(200)
            if mode == "json":
                length = sum(len(piece) for piece in pieces())
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(length))
                self.end_headers()
                for piece in pieces():
                    self.wfile.write(piece)
                return
            self.send_header("Content-Type", "text/event-stream" if mode == "sse" else "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            framed: Iterator[bytes] = pieces()
            if mode == "sse":
                framed = itertools.chain([b"event: message\ndata: "], pieces(), [b"\n\n"])
            for piece in framed:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, help="serve streamable HTTP on this port (0: a free one)")
    parser.add_argument("--mode", choices=["json", "chunked", "sse"], default="json")
    parser.add_argument("--id-last", action="store_true")
    args = parser.parse_args()
    if args.port is None:
        serve_stdio(args.id_last)
        return
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.mode, args.id_last))
    print(f"PORT={server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
