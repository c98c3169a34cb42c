"""Third-party MCP clients against the gateway, over stdio and streamable HTTP.

The gateway serves two third-party servers (`mcp-server-time` on the Python SDK 2.x and
`@modelcontextprotocol/server-everything`). Each client lists the tools, which must be as
many as the SDK 2 client lists, and calls `time2__get_current_time`:

- the Python SDK 2.x `Client` (the gateway's own SDK, in process);
- the Python SDK 1.x `ClientSession` and FastMCP's `Client`, each in its own venv, driven by
  `client_script.py`;
- the MCP Inspector CLI (`mcp-inspector --cli`).

Over stdio each client starts its own gateway through a small shell script in the scratch
directory (it sets the gateway's environment, which a client may not pass on); over HTTP
they share one gateway. Every run is bounded in time.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.compat.harness import Context, gateway_command, gateway_env, start_gateway_http, write_config
from bench.compat.install import client_python, npm_bin
from bench.compat.servers import CLIENTS, CompatClient, by_id

__all__ = ["ClientRow", "run_clients"]

SERVERS = ("time2", "everything")
TOOL = "time2__get_current_time"
ARGUMENTS = {"timezone": "UTC"}
RUN_TIMEOUT = 120.0
SCRIPT = Path(__file__).with_name("client_script.py")


@dataclass
class ClientRow:
    client: CompatClient
    transport: str
    exercised: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _wrapper(config: Path, ctx: Context) -> Path:
    """A shell script that starts the gateway over stdio with its environment set."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in gateway_env(ctx).items())
    path = ctx.work / "gateway-stdio.sh"
    path.write_text(f"#!/bin/sh\n{exports}exec {shlex.join(gateway_command(config, 'stdio'))}\n")
    path.chmod(0o755)
    return path


def _run(args: Sequence[str], ctx: Context) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ctx.work)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
    return done.stdout


def _last_json(output: str) -> Any:
    """The JSON document a CLI printed (the whole output, or its last line that parses)."""
    try:
        return json.loads(output)
    except json.JSONDecodeError:
        for line in reversed(output.splitlines()):
            if line.strip().startswith("{"):
                return json.loads(line)
    raise ValueError(f"no JSON in {output[-300:]!r}")


def _script(client: CompatClient, target: list[str], cache: Path, ctx: Context) -> dict[str, Any]:
    python = client_python(cache, client.id)
    output = _run([str(python), str(SCRIPT), client.id, TOOL, json.dumps(ARGUMENTS), *target], ctx)
    return _last_json(output)


def _inspector(target: list[str], cache: Path, ctx: Context) -> dict[str, Any]:
    cli = [str(npm_bin(cache, "mcp-inspector")), "--cli"]
    if target[0] == "--":
        target = target[1:]
    else:
        target = [target[0], "--transport", "http"]
    listed = _last_json(_run([*cli, *target, "--method", "tools/list"], ctx))
    tool_args = [f"{k}={v}" for k, v in ARGUMENTS.items()]
    call = [*cli, *target, "--method", "tools/call", "--tool-name", TOOL, "--tool-arg", *tool_args]
    called = _last_json(_run(call, ctx))
    text = " ".join(b.get("text", "") for b in called.get("content", []))
    return {"tools": [t["name"] for t in listed["tools"]], "is_error": bool(called.get("isError")), "text": text}


async def _sdk2(target: list[str], ctx: Context) -> dict[str, Any]:
    with open(ctx.logs / "client-sdk2.log", "a") as errlog:
        if target[0] == "--":
            params = StdioServerParameters(command=target[1], args=target[2:], cwd=str(ctx.work))
            connection = Client(stdio_client(params, errlog=errlog))
        else:
            connection = Client(target[0])
        async with connection as client:
            tools = (await client.list_tools()).tools
            result = await client.call_tool(TOOL, ARGUMENTS)
    text = " ".join(getattr(b, "text", "") for b in result.content)
    return {"tools": [t.name for t in tools], "is_error": result.is_error, "text": text}


async def _drive(client: CompatClient, target: list[str], cache: Path, ctx: Context) -> dict[str, Any]:
    if client.id == "sdk2":
        return await _sdk2(target, ctx)
    if client.id == "inspector":
        return await anyio.to_thread.run_sync(_inspector, target, cache, ctx)
    return await anyio.to_thread.run_sync(_script, client, target, cache, ctx)


async def _row(client: CompatClient, transport: str, target: list[str], cache: Path, ctx: Context) -> ClientRow:
    row = ClientRow(client, transport)
    try:
        with anyio.fail_after(RUN_TIMEOUT * 2):
            seen = await _drive(client, target, cache, ctx)
    except Exception as exc:  # noqa: BLE001 - a client that fails is this row's finding
        row.failures.append(f"{type(exc).__name__}: {exc}"[:500])
        return row
    listed = sorted(seen["tools"])
    row.exercised.append(f"{len(listed)} tools listed")
    if TOOL not in listed:
        row.failures.append(f"{TOOL} is not among the listed tools")
    if seen["is_error"] or "UTC" not in seen["text"]:
        row.failures.append(f"{TOOL} answered {seen['text'][:200]!r}")
    else:
        row.exercised.append(f"`{TOOL}` called")
    return row


def _compare(rows: list[ClientRow], counts: dict[tuple[str, str], int]) -> None:
    """Every client must list as many tools as the SDK 2 client did over the same transport."""
    for row in rows:
        expected = counts.get(("sdk2", row.transport))
        got = counts.get((row.client.id, row.transport))
        if got is not None and expected is not None and got != expected:
            row.failures.append(f"listed {got} tools, the SDK 2 client {expected}")


async def run_clients(cache: Path, ctx: Context, clients: Sequence[CompatClient] = CLIENTS) -> list[ClientRow]:
    """Each client over stdio (its own gateway) and over HTTP (one shared gateway)."""
    config = write_config([by_id(s) for s in SERVERS], cache, ctx)
    stdio_target = ["--", "/bin/sh", str(_wrapper(config, ctx))]
    rows = [await _row(c, "stdio", stdio_target, cache, ctx) for c in clients]
    async with start_gateway_http(config, ctx) as url:
        rows += [await _row(c, "http", [url], cache, ctx) for c in clients]
    counts = {}
    for row in rows:
        listed = next((e for e in row.exercised if e.endswith("tools listed")), None)
        if listed is not None:
            counts[(row.client.id, row.transport)] = int(listed.split()[0])
    _compare(rows, counts)
    return sorted(rows, key=lambda r: ([c.id for c in clients].index(r.client.id), r.transport))
