"""A large tool result does not raise the serving gateway's memory for good (`gateway.malloc`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client

from gateway.malloc import fix_mmap_threshold
from tests.conftest import NO_EMBEDDINGS, start_gateway_http, stop_process, write_config

BIG_PLUGIN = '''
"""A plugin server whose tool answers with `mb` megabytes of text."""
from mcp.server.mcpserver import MCPServer

from gateway.hookspecs import hookimpl


@hookimpl
def gateway_register_servers(register, settings):
    server = MCPServer("big")

    @server.tool()
    def text(mb: int) -> str:
        """Return `mb` MB of text."""
        return "z" * (mb * 1024 * 1024)

    register("big", server)
'''


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.anyio
async def test_four_10_mb_results_leave_the_gateways_memory_where_it_was(tmp_path: Path) -> None:
    """glibc raises its mmap threshold after each large free, and a heap fragmented by 10 MB blocks
    is never returned: without the fixed threshold, four such results kept about 32 MB for good."""
    (tmp_path / "plugins" / "big").mkdir(parents=True)
    (tmp_path / "plugins" / "big" / "__init__.py").write_text(BIG_PLUGIN)
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\nsecurity:\n  limits:\n    max_result_bytes: 30000000\n")
    env = NO_EMBEDDINGS | {"GATEWAY_PLUGINS__DIRECTORY": str(tmp_path / "plugins")}
    env = {k: v for k, v in env.items() if not k.startswith("MALLOC_")}
    process, url = start_gateway_http(config, tmp_path, env)
    try:
        with anyio.fail_after(60):
            async with Client(url) as client:
                for _ in range(20):
                    await client.call_tool("big__text", {"mb": 0})
                before = _rss_mb(process.pid)
                for _ in range(4):
                    result = await client.call_tool("big__text", {"mb": 10})
                    assert not result.is_error and len(str(result.content[0])) > 10_000_000
                    for _ in range(20):
                        await client.call_tool("big__text", {"mb": 0})
                after = _rss_mb(process.pid)
    finally:
        stop_process(process)
    assert after - before < 12, f"RSS {before:.0f} -> {after:.0f} MB"


def test_a_process_whose_environment_tunes_malloc_is_left_alone(tmp_path: Path) -> None:
    code = "from gateway.malloc import fix_mmap_threshold; print(fix_mmap_threshold())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    tuned = subprocess.run(
        [sys.executable, "-c", code], env=env | {"MALLOC_ARENA_MAX": "2"}, capture_output=True, text=True, timeout=30
    )
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert tuned.stdout.strip() == "False"
    assert plain.stdout.strip() == ("True" if sys.platform.startswith("linux") else "False")
    assert isinstance(fix_mmap_threshold(), bool)
