"""`@modelcontextprotocol/server-everything` from npm, at a pinned version, as a real third-party upstream.

It is the MCP reference server written with the TypeScript SDK: its errors carry the
TypeScript SDK's own wording, and its `simulate-research-query` tool requires MCP tasks
(`execution.taskSupport: required`). It is installed once into a cache directory
(about 10 s); it needs Node and the npm registry (`scripts/test` installs Node), and a
failed install fails the test that needed it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

VERSION = "2026.1.26"
SDK_VERSION = "1.32.2"
"""Its TypeScript SDK, pinned too: the package asks only for `^1.25.2`."""


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "mcp-gateway-tests" / f"server-everything-{VERSION}-sdk-{SDK_VERSION}"


def everything_command() -> str:
    """The path of the installed `mcp-server-everything` (install it first if needed), or fail the test."""
    target = _cache_dir()
    binary = target / "node_modules" / ".bin" / "mcp-server-everything"
    if binary.exists():
        return str(binary)
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail("node and npm are needed to install @modelcontextprotocol/server-everything")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="install-", dir=target.parent))
    packages = [f"@modelcontextprotocol/server-everything@{VERSION}", f"@modelcontextprotocol/sdk@{SDK_VERSION}"]
    try:
        done = subprocess.run(
            [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--no-save", *packages],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.fail(f"npm could not install server-everything: {done.stderr[-500:]}")
        try:
            staging.rename(target)  # atomic: a parallel run either wins or finds it installed
        except OSError:
            if not binary.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(binary)
