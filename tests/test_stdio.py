"""The downstream stdio transport (`gateway.serving.stdio`): the event loop reads and writes the pipes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.conftest import NO_EMBEDDINGS, REPO, gateway_env, write_config

PRINTING_PLUGIN = '''
"""A plugin server whose tool prints to stdout, as careless code does."""
from mcp.server.mcpserver import MCPServer

from gateway.hookspecs import hookimpl


@hookimpl
def gateway_register_servers(register, settings):
    server = MCPServer("chatty")

    @server.tool()
    def shout(text: str) -> str:
        """Print the text, then return it."""
        print("stray line from a plugin:", text, flush=True)
        return text

    register("chatty", server)
'''


def modern_call(request_id: int, name: str, arguments: dict[str, object]) -> str:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    }
    params = {"name": name, "arguments": arguments, "_meta": meta}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}) + "\n"


@pytest.mark.anyio
async def test_a_plugins_print_does_not_corrupt_the_wire_and_long_messages_arrive_whole(tmp_path: Path) -> None:
    """Stray output goes to stderr while the gateway serves, and every stdout line is JSON-RPC; a
    message longer than one read of the pipe (64 KiB) is put together before it is parsed."""
    (tmp_path / "plugins" / "chatty").mkdir(parents=True)
    (tmp_path / "plugins" / "chatty" / "__init__.py").write_text(PRINTING_PLUGIN)
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    long_text = "é" * 150_000 + "end"  # 300 kB of UTF-8, split across reads mid-character
    env = gateway_env(tmp_path, plugins_dir=tmp_path / "plugins") | NO_EMBEDDINGS
    command = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"]
    answers: dict[int, dict[str, object]] = {}
    with anyio.fail_after(60):
        log = (tmp_path / "stderr.log").open("w")  # a file: the long print would fill a pipe nobody reads yet
        async with await anyio.open_process(command, env=env, cwd=REPO, stderr=log) as process:
            assert process.stdin is not None and process.stdout is not None
            await process.stdin.send(modern_call(1, "chatty__shout", {"text": "hello"}).encode())
            await process.stdin.send(modern_call(2, "chatty__shout", {"text": long_text}).encode())
            received = b""
            async for chunk in process.stdout:
                received += chunk
                lines = received.split(b"\n")[:-1]
                answers = {int(a["id"]): a for a in map(json.loads, lines)}  # every line must be JSON
                if len(answers) == 2:
                    break
            await process.stdin.aclose()
        log.close()
    stderr = (tmp_path / "stderr.log").read_text()
    assert answers[1]["result"]["structuredContent"] == {"result": "hello"}  # type: ignore[index]
    assert answers[2]["result"]["structuredContent"] == {"result": long_text}  # type: ignore[index]
    assert "stray line from a plugin: hello" in stderr


def test_a_line_that_is_not_json_rpc_is_answered_and_the_session_goes_on(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    lines = "not json at all\n" + json.dumps(initialize) + "\n"
    process = subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"],
        input=lines,
        capture_output=True,
        text=True,
        env=gateway_env(tmp_path) | NO_EMBEDDINGS,
        cwd=REPO,
        timeout=60,
    )
    answers = [json.loads(line) for line in process.stdout.splitlines()]
    assert any(a.get("id") == 1 and a["result"]["serverInfo"]["name"] == "mcp-gateway" for a in answers), answers
    assert process.returncode == 0, process.stderr[-2000:]
