"""A small MCP server used as a real upstream in tests: over stdio, HTTP, or in memory.

Run `python tests/servers/demo_server.py stdio`, `... http` or `... sse` (the HTTP
ones print `PORT=<n>` on stdout once listening on 127.0.0.1; paths `/mcp` and `/sse`).
`--name` sets the server name, so one script can play several upstreams.
`--misbehave` makes it fail in one of the ways the resilience tests inject: `garbage`
(writes non-MCP lines on stdout instead of answering), `exit` (exits at start with a
message on stderr), `slow` (waits `--start-delay` seconds, default 3, before serving).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Annotated

import anyio
import mcp_types as types
from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, ListRoots
from pydantic import BaseModel


def _ask(question: str) -> Sample:
    return Sample(
        [types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))], max_tokens=50
    )


class Answer(BaseModel):
    ok: bool


def _confirm(question: str) -> Elicit[Answer]:
    return Elicit(question, Answer)


def _roots() -> ListRoots:
    return ListRoots()


def create_server(name: str = "demo") -> MCPServer:
    mcp = MCPServer(name, instructions=f"The {name} test server.")

    @mcp.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @mcp.tool()
    def fail(message: str) -> str:
        """Always fails with the given message (an error the upstream returns itself)."""
        raise ToolError(message)

    @mcp.tool()
    async def count_slowly(steps: int, ctx: Context) -> str:
        """Count to `steps`, reporting progress at each step."""
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i}")
        return f"counted to {steps}"

    @mcp.tool()
    async def ask_llm(question: str, answer: Annotated[types.CreateMessageResult, Resolve(_ask)]) -> str:
        """Ask the client's LLM a question (sampling)."""
        content = answer.content
        return f"LLM said: {content.text if isinstance(content, types.TextContent) else content}"

    @mcp.tool()
    async def confirm(question: str, answer: Annotated[ElicitationResult[Answer], Resolve(_confirm)]) -> str:
        """Ask the user to confirm (elicitation)."""
        if isinstance(answer, AcceptedElicitation):
            return f"accepted: ok={answer.data.ok}"
        return f"not accepted: {answer.action}"

    @mcp.tool()
    async def client_roots(roots: Annotated[types.ListRootsResult, Resolve(_roots)]) -> str:
        """List the client's roots."""
        return ", ".join(str(root.uri) for root in roots.roots)

    @mcp.tool()
    async def log_line(message: str, ctx: Context) -> str:
        """Send a log message at info level."""
        await ctx.log("info", message, logger_name="demo-logger")
        return "logged"

    @mcp.tool()
    async def wait_for_cancel(marker: str) -> str:
        """Wait up to a minute; if cancelled, write 'cancelled' into the file `marker`.

        On start it creates `<marker>.started`, so that a test cancels a call that is running."""
        Path(f"{marker}.started").touch()
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            written = Path(f"{marker}.partial")  # renamed whole: a test polling for the marker never reads it empty
            written.write_text("cancelled")
            written.replace(marker)
            raise
        return "not cancelled"

    @mcp.tool()
    def link_readme() -> list[types.ContentBlock]:
        """Return a link to demo://readme and the readme embedded."""
        return [
            types.ResourceLink(type="resource_link", uri="demo://readme", name="readme"),
            types.EmbeddedResource(
                type="resource", resource=types.TextResourceContents(uri="demo://readme", text=f"{name} readme")
            ),
        ]

    @mcp.tool()
    async def ask_llm_after(question: str, delay: float, ctx: Context) -> str:
        """Wait, then ask the client's LLM mid-call (handshake-era sampling request)."""
        await anyio.sleep(delay)
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = await ctx.request_context.session.create_message([message], max_tokens=20)
        content = result.content
        return f"LLM said: {content.text if isinstance(content, types.TextContent) else content}"

    @mcp.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    async def slow_lookup(seconds: float, marker: str) -> str:
        """A read-only lookup that takes a while; appends a line to `marker` each time it starts."""
        with Path(marker).open("a") as f:
            f.write("start\n")
        await anyio.sleep(seconds)
        return f"looked up in {seconds}"

    @mcp.tool()
    async def slow_append(seconds: float, marker: str) -> str:
        """Appends a line to `marker` (not idempotent), then takes a while to answer."""
        with Path(marker).open("a") as f:
            f.write("start\n")
        await anyio.sleep(seconds)
        return "appended"

    @mcp.tool()
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    @mcp.tool()
    async def sleep(seconds: float) -> str:
        """Sleep, then answer."""
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @mcp.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool named `grown` and announce that the tool list changed."""

        def grown() -> str:
            """A tool that did not exist at start."""
            return "grown"

        mcp.add_tool(grown)
        await ctx.notify_tools_changed()
        return "added grown"

    @mcp.tool()
    async def touch_readme(ctx: Context) -> str:
        """Announce that demo://readme changed (to both protocol eras' subscribers)."""
        await ctx.notify_resource_updated("demo://readme")
        await ctx.request_context.session.send_resource_updated("demo://readme")
        return "touched"

    @mcp.completion()
    async def complete(
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: types.CompletionArgument,
        context: types.CompletionContext | None,
    ) -> types.Completion:
        """Item ids for demo://items/{item_id}; names for greet's `who`."""
        pool = ["1", "2", "42", "420"] if argument.name == "item_id" else ["Ada", "Alan", "Grace"]
        return types.Completion(values=[v for v in pool if v.startswith(argument.value)])

    @mcp.resource("demo://readme", mime_type="text/plain")
    def readme() -> str:
        """What this server is."""
        return f"{name} readme"

    @mcp.resource("demo://items/{item_id}")
    def item(item_id: str) -> str:
        """One item by id."""
        return f"item {item_id}"

    @mcp.prompt()
    def greet(who: str) -> str:
        """Greet someone."""
        return f"Hello, {who}!"

    return mcp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http", "sse"])
    parser.add_argument("--name", default="demo")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--pid-file", help="write this process's pid here (tests check it is reaped)")
    parser.add_argument("--misbehave", choices=["garbage", "exit", "slow"])
    parser.add_argument("--start-delay", type=float, default=3.0)
    args = parser.parse_args()
    if args.pid_file:
        Path(args.pid_file).write_text(str(os.getpid()))
    if args.misbehave == "garbage":
        while True:
            print("this is not JSON-RPC", flush=True)
            time.sleep(0.05)
    if args.misbehave == "exit":
        print("demo: missing API key, giving up", file=sys.stderr, flush=True)
        sys.exit(3)
    if args.misbehave == "slow":
        time.sleep(args.start_delay)
    server = create_server(args.name)
    if args.transport == "stdio":
        server.run("stdio")
        return
    from http_runner import serve_http

    serve_http(server.streamable_http_app() if args.transport == "http" else server.sse_app(), args.port)


if __name__ == "__main__":
    main()
