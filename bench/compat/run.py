"""The compatibility matrix: install the third-party servers and clients, run them, write the table.

    python -m bench.compat.run                       # everything; writes docs/compatibility.md
    python -m bench.compat.run --fast                # the test suite's part only
    python -m bench.compat.run --only sqlite,memory  # some servers, print the rows only

Installs go to `$MCP_GATEWAY_COMPAT_CACHE` (default `~/.cache/mcp-gateway-compat`).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio

from bench.compat.clients import ClientRow, run_clients
from bench.compat.harness import REPO, Row, run_matrix, scratch
from bench.compat.install import install_clients, install_servers
from bench.compat.servers import SERVERS, CompatServer

DOC = REPO / "docs" / "compatibility.md"

INTRO = """\
# Compatibility

The gateway is run against MCP servers and clients that nobody here wrote: real packages
from PyPI and npm, at pinned versions, installed and run by `python -m bench.compat.run`
(which wrote this page) and, for the quick part (marked *suite*), by `tests/test_compat.py`
on every test run.

Every server is started as a stdio child of one gateway, and the gateway is reached with the
Python SDK 2.x client over both of its downstream transports: stdio (the client negotiates
the 2026 protocol) and streamable HTTP (the 2025 `initialize` handshake, which released
clients speak). For each server and transport the run checks that:

- its tools are **listed in full**: the same number of tools, prompts, resources and
  templates through the gateway as the SDK 2 client lists from the server directly;
- a **safe tool is called** (one that only reads, or writes inside the run's scratch
  directory), with arguments picked per server in `bench/compat/servers.py`;
- a **resource is read** and a **prompt is got** where the server offers them.

The direct listing is made by a client that declares what the gateway declares upstream
(sampling, elicitation and roots, which it relays): some servers, such as
`server-everything`, offer more tools to such clients.

A call that needs the network beyond 127.0.0.1 or a service not run here is skipped, and
the reason is in the table: nothing is faked. A server that needs a credential is given a
dummy one; it must still list its tools. A failure names its cause: *the server's own*
when the server fails the same way without the gateway, else *the gateway's*.

Upstreams over HTTP: `tests/test_compat.py` also runs `server-everything` as an HTTP server,
once over streamable HTTP and once over the legacy HTTP+SSE transport, as an upstream of the
gateway (`url:`, `transport: http` or `sse`): its tools are listed and its `echo` is called
through the gateway's HTTP client, and the HTTP statuses reach the gateway's supervisor.
"""


ROOT_CAUSES = (
    (
        "with -32601 Method not found",
        '**A server answers an optional list method with -32601 "Method not found"** '
        "(`mcp-server-sqlite`, `mcp-server-duckdb`: Python SDK 1.x low-level `Server`s that declare "
        "`resources` but register no template handler, so `resources/templates/list` is not found). "
        "The MCP spec allows that answer for a method a server does not implement, and the SDK client "
        "reads it as an empty list; the gateway takes it as a failed connection, marks the server failed "
        "and retries it without end. Cause: the gateway (issue 14, part 2).",
    ),
    (
        "exceeded the 1048576 byte limit",
        "**A result over 1 MiB over HTTP with the 2025 protocol** (`mcp-grafana`'s 1.28 MB "
        "`ui://grafana/metrics.html`). In that protocol the gateway's streamable HTTP endpoint answers "
        "each request as one server-sent event, and the Python SDK 2.x client refuses an event over "
        "1 MiB (`DEFAULT_MAX_SSE_EVENT_SIZE`). The same read passes over stdio, and over HTTP in the "
        "2026 protocol, whose answers are plain JSON. Cause: the gateway's choice of SSE answers "
        "(a JSON answer, `json_response`, has no such cap) meeting the SDK client's limit.",
    ),
)
"""Explanations of failures seen in this matrix, each shown when a failed row mentions its text."""


def causes(rows: Sequence[Row]) -> list[str]:
    failures = " ".join(f for row in rows for f in row.failures)
    return [f"- {text}" for needle, text in ROOT_CAUSES if needle in failures]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def server_table(rows: Sequence[Row]) -> str:
    lines = [
        "| server | package | version | SDK / language | transport | exercised | result |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        s = row.server
        name = f"{s.id} (*suite*)" if s.fast else s.id
        done = ", ".join(row.exercised + [f"skipped {x}" for x in row.skipped]) or "-"
        if s.note:
            done += f"; {s.note}"
        result = "pass" if row.ok else f"**fail**, cause {row.cause}: " + "; ".join(row.failures)
        registry = "PyPI" if s.registry == "pypi" else "npm"
        lines.append(
            f"| {name} | `{s.package}` ({registry}) | {s.version} | {s.sdk} | {row.transport} "
            f"| {_cell(done)} | {_cell(result)} |"
        )
    return "\n".join(lines)


def client_table(rows: Sequence[ClientRow]) -> str:
    lines = ["| client | installed | transport | exercised | result |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        result = "pass" if row.ok else "**fail**: " + "; ".join(row.failures)
        lines.append(
            f"| {row.client.name} | `{row.client.requirement}` | {row.transport} "
            f"| {_cell(', '.join(row.exercised) or '-')} | {_cell(result)} |"
        )
    return "\n".join(lines)


def document(rows: Sequence[Row], client_rows: Sequence[ClientRow], seconds: float, private: dict[str, str]) -> str:
    """The page; `private` maps this machine's paths (scratch dir, cache) to placeholders."""
    text = _page(rows, client_rows, seconds)
    for path, placeholder in private.items():
        text = text.replace(path, placeholder)
    return text


def _page(rows: Sequence[Row], client_rows: Sequence[ClientRow], seconds: float) -> str:
    servers = {r.server.id for r in rows}
    passed = {r.server.id for r in rows} - {r.server.id for r in rows if not r.ok}
    return "\n".join(
        [
            INTRO,
            "## Servers",
            "",
            f"{len(passed)} of {len(servers)} servers pass over both transports. "
            f"Run on {platform.system()} {platform.machine()}, Python {platform.python_version()}, "
            f"in {seconds:.0f} s (installs cached).",
            "",
            server_table(rows),
            "",
            *(["### Root causes of the failures", "", *causes(rows), ""] if causes(rows) else []),
            "## Clients",
            "",
            "Each client is pointed at the gateway (serving `mcp-server-time` and "
            "`@modelcontextprotocol/server-everything`) over stdio and over streamable HTTP. It lists the tools "
            "(the same count as the SDK 2 client sees) and calls one.",
            "",
            client_table(client_rows),
            "",
            "Regenerate with `python -m bench.compat.run` (about ten minutes on two cores the first time, "
            "for the installs).",
            "",
        ]
    )


KEPT_HEADING = "## Conformance"
"""The page's sections from this heading on are written by hand (tests/test_conformance.py's results)."""


def kept_sections(page: Path) -> str:
    """What a regeneration keeps of the page: its hand-written sections, from `KEPT_HEADING` on."""
    text = page.read_text() if page.exists() else ""
    start = text.find("\n" + KEPT_HEADING + "\n")
    return "\n" + text[start + 1 :] if start >= 0 else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", action="store_true", help="only the servers the test suite uses")
    parser.add_argument("--only", help="comma-separated server ids; prints rows, writes nothing")
    parser.add_argument("--logs", type=Path, help="copy the servers' and gateways' logs into this directory")
    parser.add_argument("--output", type=Path, default=DOC, help="where the page goes (default docs/compatibility.md)")
    args = parser.parse_args(argv)
    servers: list[CompatServer] = [s for s in SERVERS if s.fast or not args.fast]
    if args.only:
        wanted = set(args.only.split(","))
        servers = [s for s in servers if s.id in wanted]
    cache = install_servers(servers)
    install_clients(cache)
    start = time.monotonic()
    with scratch(args.logs) as ctx:
        rows = anyio.run(run_matrix, servers, cache, ctx)
        client_rows = [] if args.only else anyio.run(run_clients, cache, ctx)
        private = {str(ctx.work): "<scratch>", str(cache): "<cache>", str(Path.home()): "~"}
    seconds = time.monotonic() - start
    print(server_table(rows))
    if client_rows:
        print(client_table(client_rows))
    if not args.only:
        args.output.write_text(document(rows, client_rows, seconds, private) + kept_sections(args.output))
        print(f"wrote {args.output} in {seconds:.0f} s")
    return 0 if all(r.ok for r in rows) and all(r.ok for r in client_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
