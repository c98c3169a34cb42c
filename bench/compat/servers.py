"""The third-party MCP servers and clients of the compatibility matrix, at pinned versions.

One list for `python -m bench.compat.run` (every server, writes docs/compatibility.md) and
for `tests/test_compat.py` (the `fast` ones). Each server says how to start it, which SDK
it is built on, and one safe call: a tool that only reads, or writes inside the run's own
scratch directory. Strings in `args`, `env` and the call's arguments may hold
`{work}` (the run's scratch directory), `{repo}` (a git repository made there) and
`{http}` (a static web page served on 127.0.0.1 for the run).

Servers built on the Python SDK 1.x are installed with a pinned `mcp` 1.x, the SDK they were
written against: left unpinned, pip would give them today's 2.x, which some of them predate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CLIENTS", "SERVERS", "Call", "CompatClient", "CompatServer", "by_id"]

MCP_1X = "mcp==1.30.0"
"""The Python SDK 1.x that the servers written against it are installed with."""


@dataclass(frozen=True)
class Call:
    """A request that is safe to send: `tool` with `arguments`, or a prompt's arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompatServer:
    """One third-party server: where it comes from, how it starts, what is safe to call."""

    id: str
    registry: Literal["pypi", "npm"]
    package: str
    version: str
    sdk: str
    command: str
    """The console script (PyPI, in the server's venv) or the `node_modules/.bin` name (npm)."""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    pins: tuple[str, ...] = ()
    """Further requirements installed with it (PyPI): the SDK it was written for."""
    call: Call | None = None
    skip_call: str = ""
    """Why no tool is called (it needs the network beyond 127.0.0.1, or a service not run here)."""
    prompt: Call | None = None
    """The prompt to get and its arguments; unset: the first prompt without required arguments."""
    fast: bool = False
    """Part of the test suite (small, quick to install and to start)."""
    note: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}" if self.registry == "pypi" else f"{self.package}@{self.version}"


def _pypi(server_id: str, package: str, version: str, sdk: str, command: str, **kw: Any) -> CompatServer:
    return CompatServer(server_id, "pypi", package, version, sdk, command, fast=kw.pop("fast", True), **kw)


def _npm(server_id: str, package: str, version: str, command: str, **kw: Any) -> CompatServer:
    sdk = kw.pop("sdk", "TypeScript SDK")
    return CompatServer(server_id, "npm", package, version, sdk, command, **kw)


LOW_1X = "Python SDK 1.x, low-level Server"
FASTMCP_1X = "Python SDK 1.x, FastMCP 1.x"
SDK_2X = "Python SDK 2.x"
NETWORK = "needs the network beyond 127.0.0.1"

SERVERS: tuple[CompatServer, ...] = (
    _pypi(
        "sqlite",
        "mcp-server-sqlite",
        "2025.4.25",
        LOW_1X,
        "mcp-server-sqlite",
        args=("--db-path", "{work}/sqlite.db"),
        pins=(MCP_1X,),
        call=Call("list_tables"),
        prompt=Call("mcp-demo", {"topic": "books"}),
    ),
    _pypi(
        "fetch",
        "mcp-server-fetch",
        "2025.4.7",
        LOW_1X,
        "mcp-server-fetch",
        pins=(MCP_1X,),
        call=Call("fetch", {"url": "{http}/page.html"}),
        prompt=Call("fetch", {"url": "{http}/page.html"}),
    ),
    _pypi(
        "git",
        "mcp-server-git",
        "2026.1.14",
        LOW_1X,
        "mcp-server-git",
        args=("--repository", "{repo}"),
        pins=(MCP_1X,),
        call=Call("git_status", {"repo_path": "{repo}"}),
    ),
    _pypi(
        "time1",
        "mcp-server-time",
        "2025.9.25",
        LOW_1X,
        "mcp-server-time",
        args=("--local-timezone", "UTC"),
        pins=(MCP_1X,),
        call=Call("get_current_time", {"timezone": "UTC"}),
    ),
    _pypi(
        "duckdb",
        "mcp-server-duckdb",
        "1.1.0",
        LOW_1X,
        "mcp-server-duckdb",
        args=("--db-path", "{work}/duck.db"),
        pins=(MCP_1X,),
        call=Call("query", {"query": "SELECT 40 + 2 AS answer"}),
    ),
    _pypi(
        "shell",
        "mcp-shell-server",
        "1.1.14",
        LOW_1X,
        "mcp-shell-server",
        env={"ALLOW_COMMANDS": "echo"},
        pins=(MCP_1X,),
        call=Call("shell_execute", {"command": ["echo", "hello"], "directory": "{work}"}),
    ),
    _pypi(
        "calculator",
        "mcp-server-calculator",
        "0.2.1",
        FASTMCP_1X,
        "mcp-server-calculator",
        pins=(MCP_1X,),
        call=Call("calculate", {"expression": "2 + 3 * 4"}),
    ),
    _pypi(
        "excel1",
        "excel-mcp-server-fastmcp",
        "1.16.0",
        FASTMCP_1X,
        "excel-mcp-server-fastmcp",
        pins=(MCP_1X,),
        call=Call("excel_create_file", {"file_path": "{work}/book.xlsx"}),
    ),
    _pypi(
        "motherduck2",
        "mcp-server-motherduck",
        "1.0.0",
        "FastMCP 2.x",
        "mcp-server-motherduck",
        args=("--db-path", ":memory:", "--read-write"),
        call=Call("execute_query", {"sql": "SELECT 40 + 2 AS answer"}),
    ),
    _pypi(
        "motherduck4",
        "mcp-server-motherduck",
        "1.1.0",
        "FastMCP 4.x (on Python SDK 2.x)",
        "mcp-server-motherduck",
        args=("--db-path", ":memory:", "--read-write"),
        call=Call("execute_query", {"sql": "SELECT 40 + 2 AS answer"}),
    ),
    _pypi(
        "time2",
        "mcp-server-time",
        "2026.10.19",
        SDK_2X + ", low-level Server",
        "mcp-server-time",
        args=("--local-timezone", "UTC"),
        call=Call("get_current_time", {"timezone": "UTC"}),
    ),
    _pypi(
        "fetch2",
        "mcp-server-fetch",
        "2026.10.24",
        SDK_2X + ", low-level Server",
        "mcp-server-fetch",
        args=("--allow-private-ips",),
        call=Call("fetch", {"url": "{http}/page.html"}),
        prompt=Call("fetch", {"url": "{http}/page.html"}),
    ),
    _pypi(
        "excel2",
        "excel-mcp-server",
        "2.2.2",
        SDK_2X + ", MCPServer",
        "excel-mcp-server",
        args=("stdio",),
        call=Call("create_workbook", {"path": "{work}/book2.xlsx", "overwrite": True}),
    ),
    _pypi(
        "duckduckgo",
        "duckduckgo-mcp-server",
        "0.7.0",
        SDK_2X + ", MCPServer",
        "duckduckgo-mcp-server",
        skip_call=NETWORK + " (DuckDuckGo search)",
    ),
    _pypi(
        "grafana",
        "mcp-grafana",
        "2.1.1",
        "Go (mcp-go), binary inside a PyPI wheel",
        "mcp-grafana",
        env={"GRAFANA_URL": "http://127.0.0.1:9"},
        skip_call="every tool needs a Grafana server and its credentials; none is run here",
        fast=False,
    ),
    _npm(
        "everything",
        "@modelcontextprotocol/server-everything",
        "2026.8.31",
        "mcp-server-everything",
        args=("stdio",),
        call=Call("echo", {"message": "hello"}),
        fast=True,
    ),
    _npm(
        "filesystem",
        "@modelcontextprotocol/server-filesystem",
        "2026.8.31",
        "mcp-server-filesystem",
        args=("{work}",),
        call=Call("list_allowed_directories"),
        fast=True,
    ),
    _npm(
        "memory",
        "@modelcontextprotocol/server-memory",
        "2026.8.31",
        "mcp-server-memory",
        env={"MEMORY_FILE_PATH": "{work}/memory.jsonl"},
        call=Call("read_graph"),
        fast=True,
    ),
    _npm(
        "thinking",
        "@modelcontextprotocol/server-sequential-thinking",
        "2026.8.31",
        "mcp-server-sequential-thinking",
        call=Call(
            "sequentialthinking",
            {"thought": "One step is enough.", "nextThoughtNeeded": False, "thoughtNumber": 1, "totalThoughts": 1},
        ),
        fast=True,
    ),
    _npm(
        "github",
        "@modelcontextprotocol/server-github",
        "2025.4.8",
        "mcp-server-github",
        env={"GITHUB_PERSONAL_ACCESS_TOKEN": "not-a-real-token"},
        skip_call=NETWORK + " (api.github.com) and a GitHub token",
    ),
    _npm(
        "context7",
        "@upstash/context7-mcp",
        "4.1.1",
        "context7-mcp",
        skip_call=NETWORK + " (context7.com)",
    ),
    _npm(
        "notion",
        "@notionhq/notion-mcp-server",
        "2.5.2",
        "notion-mcp-server",
        env={"NOTION_TOKEN": "not-a-real-token"},
        skip_call=NETWORK + " (api.notion.com) and a Notion token",
    ),
    _npm(
        "playwright",
        "@playwright/mcp",
        "0.0.83",
        "playwright-mcp",
        args=("--headless", "--isolated"),
        skip_call="every tool drives a browser build that Playwright downloads on its own, outside the registries",
    ),
    _npm(
        "kubernetes",
        "kubernetes-mcp-server",
        "0.0.67",
        "kubernetes-mcp-server",
        sdk="Go (mcp-go), binary inside an npm package",
        env={"KUBECONFIG": "{work}/kubeconfig"},
        call=Call("configuration_view", {"minified": True}),
        note="a kubeconfig naming a cluster at 127.0.0.1 that is never contacted",
    ),
)


@dataclass(frozen=True)
class CompatClient:
    """One third-party MCP client driven against the gateway."""

    id: str
    name: str
    registry: Literal["pypi", "npm", "repo"]
    requirement: str
    """What is installed for it: `pkg==x` (its own venv), `pkg@x` (the npm prefix), or the repo's SDK."""


CLIENTS: tuple[CompatClient, ...] = (
    CompatClient("sdk2", "Python SDK 2.x `Client`", "repo", "mcp (the gateway's own)"),
    CompatClient("sdk1", "Python SDK 1.x `ClientSession`", "pypi", MCP_1X),
    CompatClient("fastmcp", "FastMCP `Client`", "pypi", "fastmcp==4.1.2"),
    CompatClient("inspector", "MCP Inspector CLI", "npm", "@modelcontextprotocol/inspector@2.12.0"),
)


def by_id(server_id: str) -> CompatServer:
    for server in SERVERS:
        if server.id == server_id:
            return server
    raise KeyError(server_id)
