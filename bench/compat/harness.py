"""Run third-party MCP servers directly and through the gateway, and say what worked.

For a set of installed servers (`bench.compat.install`):

1. each server alone, with the SDK 2 client over stdio: its tools, prompts, resources and
   templates are counted, and its safe call is made (the reference);
2. one gateway with all of them as stdio children, served downstream over stdio (the
   client negotiates the 2026 protocol) and over streamable HTTP (the 2025 handshake, as
   released clients speak it); through each, for every server: the same counts (its items are told
   apart by the `_meta` server key), the safe call, a resource read and a prompt got where
   it offers them. Over HTTP, `/readyz` gives each server's state and failure reason.

Everything runs in a scratch directory on 127.0.0.1 only, every wait is bounded, and every
process started is stopped when its block exits (the SDK's stdio client stops its child).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from bench.compat.install import server_command
from bench.compat.servers import CompatServer
from gateway.catalog import SERVER_META_KEY, expose_name
from gateway.upstreams.tasks import task_support

__all__ = ["Context", "Listing", "Row", "gateway_env", "render", "run_matrix", "scratch", "start_gateway_http"]

REPO = Path(__file__).resolve().parents[2]
DIRECT_TIMEOUT = 90.0
GATEWAY_TIMEOUT = 300.0
CALL_TIMEOUT = 60.0
HTTP_MODE = "legacy"
"""Over HTTP the SDK 2 client speaks the 2025 protocol (the initialize handshake), as released
clients do; over stdio it negotiates the 2026 one (`auto`): both sides of the gateway get used."""
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: nobody, user: {token: not-a-real-token}}]
contexts: [{name: local, context: {cluster: local, user: nobody}}]
current-context: local
"""


@dataclass(frozen=True)
class Context:
    """The run's scratch directory, a git repository in it, and a web page on 127.0.0.1."""

    work: Path
    repo: Path
    http: str

    @property
    def logs(self) -> Path:
        return self.work / "logs"


def render(value: Any, ctx: Context) -> Any:
    """`value` with `{work}`, `{repo}` and `{http}` filled in, in every string it holds."""
    if isinstance(value, str):
        return value.replace("{work}", str(ctx.work)).replace("{repo}", str(ctx.repo)).replace("{http}", ctx.http)
    if isinstance(value, dict):
        return {k: render(v, ctx) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [render(v, ctx) for v in value]
    return value


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def scratch(keep_logs: Path | None = None) -> Iterator[Context]:
    """A scratch directory with a git repository, a kubeconfig and a page served on 127.0.0.1.

    `keep_logs`: where the servers' and gateways' stderr logs are copied before it is removed.
    """
    with tempfile.TemporaryDirectory(prefix="mcp-compat-") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        site = work / "site"
        site.mkdir()
        (site / "page.html").write_text("<html><body><h1>Compatibility</h1><p>A page for the fetch servers.</p>")
        (work / "kubeconfig").write_text(KUBECONFIG)
        repo = work / "repo"
        repo.mkdir()
        (repo / "README.md").write_text("compat\n")
        git = ["git", "-c", "user.name=compat", "-c", "user.email=compat@example.invalid", "-C", str(repo)]
        for step in (["init", "-q"], ["add", "README.md"], ["commit", "-q", "-m", "first"]):
            subprocess.run([*git, *step], check=True, capture_output=True, timeout=30)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(site)))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield Context(work, repo, f"http://127.0.0.1:{server.server_address[1]}")
        finally:
            server.shutdown()
            server.server_close()
            if keep_logs is not None:
                shutil.copytree(work / "logs", keep_logs, dirs_exist_ok=True)


@dataclass
class Listing:
    """What one server offers, as seen by a client (directly, or its slice of the gateway's)."""

    tools: list[types.Tool] = field(default_factory=list)
    prompts: list[types.Prompt] = field(default_factory=list)
    resources: list[types.Resource] = field(default_factory=list)
    templates: list[types.ResourceTemplate] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    """Optional methods the server answered with -32601 "Method not found"."""

    def counts(self) -> tuple[int, int, int, int]:
        return len(self.tools), len(self.prompts), len(self.resources), len(self.templates)


@dataclass
class Direct:
    """A server reached without the gateway: its listing, its call's outcome, or why it failed."""

    listing: Listing | None = None
    call_error: str = ""
    error: str = ""


@dataclass
class Row:
    """One server through the gateway over one downstream transport."""

    server: CompatServer
    transport: str
    direct_tools: int | None = None
    tools: int | None = None
    exercised: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    step: str = ""
    """The request being made (named in a failure)."""
    server_fault: bool = False
    """The server fails the same way without the gateway: the cause is the server's."""

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def cause(self) -> str:
        return "the server's own (it fails the same way without the gateway)" if self.server_fault else "the gateway's"


async def _pages(fetch: Any, attribute: str) -> list[Any]:
    items: list[Any] = []
    cursor: str | None = None
    while True:
        page = await fetch(cursor=cursor)
        items.extend(getattr(page, attribute))
        cursor = page.next_cursor
        if not cursor:
            return items


async def _optional_pages(fetch: Any, attribute: str, listing: Listing, method: str) -> list[Any]:
    """An optional list: "method not found" means none (noted in `listing.not_found`)."""
    try:
        return await _pages(fetch, attribute)
    except MCPError as exc:
        if exc.code == types.METHOD_NOT_FOUND:
            listing.not_found.append(method)
            return []
        raise


async def _list_all(client: Client, caps: types.ServerCapabilities | None) -> Listing:
    """Everything `client`'s server offers, asking only for what it declares."""
    listing = Listing(tools=await _pages(client.list_tools, "tools"))
    if caps is None or caps.prompts is not None:
        listing.prompts = await _optional_pages(client.list_prompts, "prompts", listing, "prompts/list")
    if caps is None or caps.resources is not None:
        listing.resources = await _optional_pages(client.list_resources, "resources", listing, "resources/list")
        templates = client.list_resource_templates
        listing.templates = await _optional_pages(templates, "resource_templates", listing, "resources/templates/list")
    return listing


async def _decline(context: Any, params: Any = None) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_REQUEST, message="the compatibility run answers no server requests")


RELAY_CAPABILITIES: dict[str, Any] = {
    "sampling_callback": _decline,
    "elicitation_callback": _decline,
    "list_roots_callback": _decline,
}
"""The client capabilities the gateway declares upstream (it relays these requests), so that a
server that offers some tools only to such clients lists the same tools to the reference."""


def _text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))[:300]


def _short(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_short(e) for e in error.exceptions)
    return f"{type(error).__name__}: {error}"[:400]


def _server_params(server: CompatServer, cache: Path, ctx: Context) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | render(server.env, ctx)
    return StdioServerParameters(
        command=server_command(server, cache), args=render(server.args, ctx), env=env, cwd=str(ctx.work)
    )


async def probe_direct(server: CompatServer, cache: Path, ctx: Context) -> Direct:
    """The reference: `server` alone, listed and called with the SDK 2 client over stdio."""
    result = Direct()
    with open(ctx.logs / f"{server.id}.direct.log", "w") as errlog:
        try:
            with anyio.fail_after(DIRECT_TIMEOUT):
                transport = stdio_client(_server_params(server, cache, ctx), errlog=errlog)
                async with Client(transport, **RELAY_CAPABILITIES) as client:
                    result.listing = await _list_all(client, client.server_capabilities)
                    if server.call is not None:
                        called = await client.call_tool(server.call.name, render(server.call.arguments, ctx))
                        if called.is_error:
                            result.call_error = _text(called)
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party server is a finding to report
            result.error = _short(exc)
    return result


def gateway_env(ctx: Context) -> dict[str, str]:
    """The environment of a gateway child: its own data dir, no plugins, no model, records off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    (ctx.work / "no-plugins").mkdir(exist_ok=True)
    env.update(
        {
            "GATEWAY_DATA_DIR": str(ctx.work / "gateway-data"),
            "GATEWAY_PLUGINS__DIRECTORY": str(ctx.work / "no-plugins"),
            "GATEWAY_PLUGINS__ENTRY_POINTS": "false",  # nor the installed built-ins
            "GATEWAY_EMBEDDING__ENABLED": "false",
            "GATEWAY_RECORDS__ENABLED": "false",
            "GATEWAY_ROUTING__MODE": "all",  # the matrix checks listings in full (auto: dynamic past 40 tools)
            "GATEWAY_LIST_WAIT": "120",
            "GATEWAY_STARTUP_TIMEOUT": "90",
            "GATEWAY_LOG_LEVEL": "INFO",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
    )
    return env


def write_config(servers: Sequence[CompatServer], cache: Path, ctx: Context) -> Path:
    """The gateway's config: every server as a stdio child (JSON is YAML)."""
    mcps = {}
    for server in servers:
        params = _server_params(server, cache, ctx)
        mcps[server.id] = {
            "description": f"{server.package} {server.version}",
            "command": params.command,
            "args": params.args,
            "env": render(server.env, ctx),
            "cwd": str(ctx.work),
            "timeout": CALL_TIMEOUT,
        }
    path = ctx.work / "gateway.yaml"
    path.write_text(json.dumps({"mcps": mcps}, indent=2))
    return path


def gateway_command(config: Path, transport: str) -> list[str]:
    return [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", transport]


@asynccontextmanager
async def start_gateway_http(config: Path, ctx: Context) -> AsyncIterator[str]:
    """The gateway serving streamable HTTP on a free port of 127.0.0.1; yields its URL, then stops it."""
    args = [*gateway_command(config, "http"), "--port", "0"]
    with open(ctx.logs / "gateway-http.log", "w") as log:
        async with await anyio.open_process(args, stderr=subprocess.PIPE, env=gateway_env(ctx), cwd=ctx.work) as proc:
            try:
                assert proc.stderr is not None
                buffer = b""
                prefix = b"mcp-gateway: serving on "
                with anyio.fail_after(60):
                    while prefix not in buffer:
                        chunk = await proc.stderr.receive()
                        log.write(chunk.decode(errors="replace"))
                        buffer += chunk
                url = buffer.split(prefix, 1)[1].split(b"\n", 1)[0].decode().strip()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_drain, proc.stderr, log)
                    try:
                        yield url
                    finally:
                        tg.cancel_scope.cancel()
            finally:
                proc.terminate()
                with anyio.move_on_after(10):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


async def _drain(stream: Any, log: TextIO) -> None:
    async for chunk in stream:
        log.write(chunk.decode(errors="replace"))


def _readyz(url: str) -> dict[str, dict[str, Any]]:
    """Each server's state and reason, from the HTTP gateway's `/readyz`."""
    ready_url = url.rsplit("/", 1)[0] + "/readyz"
    try:
        with urllib.request.urlopen(ready_url, timeout=10) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:  # 503 while a server is down still carries the body
        body = exc.read()
    return {s["server"]: s for s in json.loads(body).get("servers", [])}


def _slice(listing: Listing, server_id: str) -> Listing:
    def mine(item: Any) -> bool:
        return (item.meta or {}).get(SERVER_META_KEY) == server_id

    return Listing(
        tools=[t for t in listing.tools if mine(t)],
        prompts=[p for p in listing.prompts if mine(p)],
        resources=[r for r in listing.resources if mine(r)],
        templates=[t for t in listing.templates if mine(t)],
    )


def _pick_prompt(server: CompatServer, mine: Listing) -> tuple[str, dict[str, str]] | None:
    if server.prompt is not None:
        return expose_name(server.id, server.prompt.name), dict(server.prompt.arguments)
    for prompt in mine.prompts:
        if not any(a.required for a in prompt.arguments or []):
            return prompt.name, {}
    return None


async def _exercise(client: Client, row: Row, mine: Listing, direct: Direct, ctx: Context) -> None:
    """The safe call, a resource read and a prompt, each through the gateway."""
    server = row.server
    if server.call is None:
        row.skipped.append(f"call: {server.skip_call}")
    else:
        name = expose_name(server.id, server.call.name)
        row.step = f"calling {name}"
        result = await client.call_tool(name, render(server.call.arguments, ctx))
        if result.is_error:
            same = " (the same directly)" if direct.call_error else ""
            row.server_fault = row.server_fault or bool(direct.call_error)
            row.failures.append(f"`{server.call.name}` returned an error{same}: {_text(result)}")
        else:
            row.exercised.append(f"call `{server.call.name}`")
    if mine.resources:
        uri = min(r.uri for r in mine.resources)  # the same one every run, whatever order it lists them in
        row.step = f"reading resource {uri}"
        read = await client.read_resource(uri)
        if read.contents:
            row.exercised.append("resource read")
        else:
            row.failures.append(f"resource {uri} read as empty")
    prompt = _pick_prompt(server, mine)
    if prompt is not None:
        row.step = f"getting prompt {prompt[0]}"
        got = await client.get_prompt(prompt[0], render(prompt[1], ctx))
        if got.messages:
            row.exercised.append("prompt got")
        else:
            row.failures.append(f"prompt {prompt[0]} had no messages")


async def _check_server(
    client: Client, transport: str, server: CompatServer, everything: Listing, direct: Direct, ctx: Context
) -> Row:
    row = Row(server, transport)
    if direct.listing is None:
        row.failures.append(f"fails without the gateway too: {direct.error}")
        row.server_fault = True
        return row
    mine = _slice(everything, server.id)
    # A tool that requires MCP tasks is hidden from a client that does not declare them (the
    # SDK 2 client here does not), so such tools are not expected through the gateway.
    task_only = sum(1 for tool in direct.listing.tools if task_support(tool) == "required")
    row.direct_tools, row.tools = len(direct.listing.tools) - task_only, len(mine.tools)
    expected, got = (row.direct_tools, *direct.listing.counts()[1:]), mine.counts()
    if expected != got:
        row.failures.append(f"listed (tools, prompts, resources, templates) {got}, directly {expected}")
        for method in direct.listing.not_found:
            row.failures.append(
                f"the server answers `{method}` with -32601 Method not found (allowed for a method it does not "
                "implement; the SDK client reads it as none)"
            )
        if not mine.tools:
            return row
    row.exercised.append(f"{row.tools}/{row.direct_tools} tools")
    if task_only:
        row.exercised.append(f"{task_only} task-only tool hidden from a client without tasks, as it should be")
    try:
        with anyio.fail_after(CALL_TIMEOUT * 3):
            await _exercise(client, row, mine, direct, ctx)
    except Exception as exc:  # noqa: BLE001 - a failed request (or one past its time) is this row's finding
        row.failures.append(f"{row.step}: {_short(exc)}")
    return row


async def _through(
    client: Client, transport: str, servers: Sequence[CompatServer], directs: dict[str, Direct], ctx: Context
) -> list[Row]:
    everything = await _list_all(client, None)
    return [await _check_server(client, transport, s, everything, directs[s.id], ctx) for s in servers]


def _explain(rows: list[Row], states: dict[str, dict[str, Any]]) -> None:
    """Add the gateway's own word (state, reason) to each failed row."""
    for row in rows:
        state = states.get(row.server.id)
        if not row.ok and state is not None and state.get("state") != "ready":
            row.failures.append(f"gateway: {state.get('state')}: {state.get('reason')}")


async def run_matrix(servers: Sequence[CompatServer], cache: Path, ctx: Context) -> list[Row]:
    """Every server directly, then through one gateway over stdio and over HTTP; one row per pair."""
    directs: dict[str, Direct] = {}
    limiter = anyio.CapacityLimiter(4)

    async def direct(server: CompatServer) -> None:
        async with limiter:
            directs[server.id] = await probe_direct(server, cache, ctx)

    async with anyio.create_task_group() as tg:
        for server in servers:
            tg.start_soon(direct, server)
    config = write_config(servers, cache, ctx)
    rows: list[Row] = []
    params = StdioServerParameters(
        command=sys.executable, args=gateway_command(config, "stdio")[1:], env=gateway_env(ctx), cwd=str(ctx.work)
    )
    with open(ctx.logs / "gateway-stdio.log", "w") as errlog, anyio.fail_after(GATEWAY_TIMEOUT):
        async with Client(stdio_client(params, errlog=errlog)) as client:
            stdio_rows = await _through(client, "stdio", servers, directs, ctx)
    with anyio.fail_after(GATEWAY_TIMEOUT):
        async with start_gateway_http(config, ctx) as url, Client(url, mode=HTTP_MODE) as client:
            http_rows = await _through(client, "http", servers, directs, ctx)
            states = await anyio.to_thread.run_sync(_readyz, url)
    _explain(stdio_rows, states)
    _explain(http_rows, states)
    for pair in zip(stdio_rows, http_rows, strict=True):
        rows.extend(pair)
    return rows
