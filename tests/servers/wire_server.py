"""A handshake-era MCP server written at the wire, for what the SDK's servers never send.

`stdio`, or `http --answer json|sse` on 127.0.0.1 (prints `PORT=<n>`). Its tools answer with text,
structured content, an error result, an image, progress, a sampling request in the middle of the
call, a result of `size` bytes, a result that is not a valid `CallToolResult`, or after `seconds`;
`forget` drops the HTTP session (its next request gets a 404). Its resources (`wire://<kind>[/<arg>]`)
and prompts (`<kind>`) answer the same ways: text, a blob, `big`, `malformed`, `slow`, `sample`, `forget`;
an unknown one is an error. Every `notifications/cancelled` it
receives is appended to `--log` (one `cancelled <request id>` line), so a test can see it arrive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

Send = Callable[[dict[str, Any]], Awaitable[None]]
Ask = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

OBJECT = {"type": "object"}
TOOLS = [
    {"name": name, "inputSchema": OBJECT}
    for name in (
        "text",
        "structured",
        "error",
        "image",
        "progress",
        "sample",
        "big",
        "malformed",
        "slow",
        "forget",
        "mismatch",
    )
]
TOOLS[1]["outputSchema"] = TOOLS[10]["outputSchema"] = {
    "type": "object",
    "properties": {"sum": {"type": "integer"}},
    "required": ["sum"],
}
RESOURCES = [
    {"uri": f"wire://{kind}", "name": kind}
    for kind in ("text", "blob", "big", "malformed", "slow", "sample", "forget", "unknown")
]
PROMPTS = [{"name": kind} for kind in ("text", "big", "malformed", "slow", "sample", "forget", "unknown")]
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


class Wire:
    def __init__(self, log: Path | None) -> None:
        self.log = log
        self.sessions: set[str] = set()

    def note(self, line: str) -> None:
        if self.log is not None:
            with self.log.open("a") as out:
                out.write(line + "\n")

    async def result(self, request: dict[str, Any], send: Send, ask: Ask | None) -> dict[str, Any]:
        method, params = request.get("method"), request.get("params") or {}
        if method == "initialize":
            return {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {"listChanged": True}, "resources": {}, "prompts": {}},
                "serverInfo": {"name": "wire", "version": "1"},
            }
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "ping":
            return {}
        if method == "resources/list":
            return {"resources": RESOURCES}
        if method == "prompts/list":
            return {"prompts": PROMPTS}
        if method == "resources/read":
            kind, _, arg = str(params.get("uri", "")).removeprefix("wire://").partition("/")
            return await self.other("resource", kind, arg, ask)
        if method == "prompts/get":
            return await self.other(
                "prompt", str(params.get("name")), (params.get("arguments") or {}).get("arg", ""), ask
            )
        if method != "tools/call":
            raise LookupError(method)
        name, args = params.get("name"), params.get("arguments") or {}
        token = (params.get("_meta") or {}).get("progressToken")
        if name == "text":
            return {"content": [{"type": "text", "text": f"hello {args.get('who', '')}"}]}
        if name == "structured":
            total = int(args.get("a", 0)) + int(args.get("b", 0))
            return {"content": [{"type": "text", "text": str(total)}], "structuredContent": {"sum": total}}
        if name == "mismatch":  # structured content that its output schema refuses
            return {"content": [{"type": "text", "text": "five"}], "structuredContent": {"sum": "five"}}
        if name == "error":
            return {"content": [{"type": "text", "text": "it failed"}], "isError": True}
        if name == "image":
            return {"content": [{"type": "image", "data": PIXEL, "mimeType": "image/png"}]}
        if name == "progress":
            for step in (1, 2, 3):
                if token is not None:
                    progress = {"progressToken": token, "progress": step, "total": 3, "message": f"step {step}"}
                    await send({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
            return {"content": [{"type": "text", "text": "counted"}]}
        if name == "sample":
            if ask is None:
                return {"content": [{"type": "text", "text": "no way to ask"}], "isError": True}
            answer = await ask(
                {
                    "method": "sampling/createMessage",
                    "params": {
                        "messages": [{"role": "user", "content": {"type": "text", "text": "2+2?"}}],
                        "maxTokens": 5,
                    },
                }
            )
            said = json.dumps(answer, sort_keys=True)
            return {"content": [{"type": "text", "text": f"sampled: {said}"}]}
        if name == "big":
            return {"content": [{"type": "text", "text": "x" * int(args.get("size", 100_000))}]}
        if name == "malformed":
            return {"content": "not a list"}
        if name == "slow":
            await asyncio.sleep(float(args.get("seconds", 30)))
            return {"content": [{"type": "text", "text": "slept"}]}
        if name == "forget":
            self.sessions.clear()
            return {"content": [{"type": "text", "text": "forgot"}]}
        raise LookupError(name)

    async def other(self, what: str, kind: str, arg: str, ask: Ask | None) -> dict[str, Any]:
        """A resource's contents or a prompt's messages, by kind."""

        def text(value: str) -> dict[str, Any]:
            if what == "resource":
                return {"contents": [{"uri": f"wire://{kind}", "mimeType": "text/plain", "text": value}]}
            return {"description": kind, "messages": [{"role": "user", "content": {"type": "text", "text": value}}]}

        if kind == "text":
            return text(f"the {what} {arg}")
        if kind == "blob" and what == "resource":
            return {"contents": [{"uri": "wire://blob", "mimeType": "image/png", "blob": PIXEL}]}
        if kind == "big":
            return text("x" * int(arg or 100_000))
        if kind == "malformed":
            return {"contents": "not a list"} if what == "resource" else {"messages": [{"role": "nobody"}]}
        if kind == "slow":
            await asyncio.sleep(float(arg or 30))
            return text("slept")
        if kind == "forget":
            self.sessions.clear()
            return text("forgot")
        if kind == "sample" and ask is not None:
            answer = await ask(
                {
                    "method": "sampling/createMessage",
                    "params": {
                        "messages": [{"role": "user", "content": {"type": "text", "text": "2+2?"}}],
                        "maxTokens": 5,
                    },
                }
            )
            return text(f"sampled: {json.dumps(answer, sort_keys=True)}")
        if what == "resource":
            raise _Refused(-32002, f"Resource not found: wire://{kind}")
        raise _Refused(-32602, f"Unknown prompt: {kind}")

    async def answer(self, request: dict[str, Any], send: Send, ask: Ask | None) -> dict[str, Any]:
        try:
            return {"jsonrpc": "2.0", "id": request["id"], "result": await self.result(request, send, ask)}
        except LookupError as exc:
            error = {"code": -32601, "message": f"unknown: {exc}"}
            return {"jsonrpc": "2.0", "id": request["id"], "error": error}
        except _Refused as exc:
            error = {"code": exc.code, "message": exc.message}
            return {"jsonrpc": "2.0", "id": request["id"], "error": error}


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


async def serve_stdio(wire: Wire) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    lock = asyncio.Lock()
    waiting: dict[Any, asyncio.Future[dict[str, Any]]] = {}
    calls: dict[Any, asyncio.Task[None]] = {}

    async def send(message: dict[str, Any]) -> None:
        async with lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    async def ask(request: dict[str, Any]) -> dict[str, Any]:
        asked = {"jsonrpc": "2.0", "id": f"s-{uuid.uuid4().hex[:8]}", **request}
        future = waiting[asked["id"]] = loop.create_future()
        await send(asked)
        try:
            return await future
        finally:
            waiting.pop(asked["id"])

    async def handle(request: dict[str, Any]) -> None:
        await send(await wire.answer(request, send, ask))

    while line := await reader.readline():
        message = json.loads(line)
        if "method" not in message:
            future = waiting.get(message.get("id"))
            if future is not None:
                future.set_result(message.get("result") or message.get("error") or {})
        elif message["method"] == "notifications/cancelled":
            request_id = (message.get("params") or {}).get("requestId")
            wire.note(f"cancelled {request_id}")
            task = calls.pop(request_id, None)
            if task is not None:
                task.cancel()
        elif "id" in message:
            calls[message["id"]] = asyncio.create_task(handle(message))


def http_app(wire: Wire, answer: str) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    waiting: dict[Any, asyncio.Future[dict[str, Any]]] = {}

    async def post(request: Request) -> Response:
        message = json.loads(await request.body())
        session = request.headers.get("mcp-session-id")
        if message.get("method") == "initialize":
            session = uuid.uuid4().hex
            wire.sessions.add(session)
        elif session not in wire.sessions:
            return Response(status_code=404)
        headers = {"mcp-session-id": session}
        if "method" not in message:
            future = waiting.get(message.get("id"))
            if future is not None:
                future.set_result(message.get("result") or message.get("error") or {})
            return Response(status_code=202, headers=headers)
        if message["method"] == "notifications/cancelled":
            wire.note(f"cancelled {(message.get('params') or {}).get('requestId')}")
            return Response(status_code=202, headers=headers)
        if "id" not in message:
            return Response(status_code=202, headers=headers)
        if answer == "json":

            async def no_send(_message: dict[str, Any]) -> None:
                pass

            return JSONResponse(await wire.answer(message, no_send, None), headers=headers)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def ask(asked: dict[str, Any]) -> dict[str, Any]:
            request_id = f"s-{uuid.uuid4().hex[:8]}"
            future = waiting[request_id] = asyncio.get_running_loop().create_future()
            await queue.put({"jsonrpc": "2.0", "id": request_id, **asked})
            try:
                return await future
            finally:
                waiting.pop(request_id)

        async def run() -> None:
            await queue.put(await wire.answer(message, queue.put, ask))
            await queue.put(None)

        async def events() -> AsyncIterator[bytes]:
            task = asyncio.create_task(run())
            try:
                while (item := await queue.get()) is not None:
                    yield f"event: message\ndata: {json.dumps(item)}\n\n".encode()
            finally:
                task.cancel()

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def other(request: Request) -> Response:
        return Response(status_code=405)

    return Starlette(routes=[Route("/mcp", post, methods=["POST"]), Route("/mcp", other, methods=["GET", "DELETE"])])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=("stdio", "http"))
    parser.add_argument("--answer", choices=("json", "sse"), default="json")
    parser.add_argument("--log", type=Path)
    options = parser.parse_args()
    wire = Wire(options.log)
    if options.transport == "stdio":
        asyncio.run(serve_stdio(wire))
        return
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    print(f"PORT={sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(http_app(wire, options.answer), log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
