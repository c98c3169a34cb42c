"""What `mcp-gateway check` and `servers` print for a person: a row per server, the table, the
failures with their last stderr lines, and the tool findings of the security policies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.registry import Registry
from gateway.security.vetting import ToolReport
from gateway.upstreams.upstream import Upstream

__all__ = ["NOT_FAILED", "print_check", "print_table", "server_row"]

NOT_FAILED = ("ok", "disabled", "needs login")
"""Statuses `check` does not count as failures: `needs login` is told with the command to run."""
STDERR_SHOWN = 10
"""Last stderr lines printed under a failed server (`--json` has all that are kept)."""


def print_table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> None:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def server_row(u: Upstream, registry: Registry) -> dict[str, Any]:
    """What `/readyz` says of the server, plus what a person checking a config wants to see."""
    return {
        **registry.server_health(u, stderr=True),
        "origin": u.spec.origin,
        "transport": u.spec.transport,
        "status": "ok" if u.state == "ready" else "needs login" if u.state == "needs_login" else u.state,
        "prompts": len(u.listing.prompts),
        "resources": len(u.listing.resources) + len(u.listing.templates),
        "latency_ms": round(u.connect_ms, 1) if u.connect_ms is not None else None,
        "protocol": u.protocol_version,
    }


def print_check(rows: list[dict[str, Any]], reports: Sequence[ToolReport], detailed: bool) -> None:
    """The `check` report: `rows` from `server_row`, `reports` the vetter's findings."""
    if not rows:
        print("No servers configured.")
        return
    headers = ["SERVER", "TRANSPORT", "STATUS", "TOOLS", "LATENCY"]
    if detailed:
        headers += ["PROMPTS", "RESOURCES", "PROTOCOL", "ORIGIN"]
    table = []
    for r in rows:
        line = [
            r["server"],
            r["transport"],
            r["status"],
            str(r["tools"]),
            f"{r['latency_ms']} ms" if r["latency_ms"] is not None else "-",
        ]
        if detailed:
            line += [str(r["prompts"]), str(r["resources"]), r["protocol"] or "-", r["origin"]]
        table.append(line)
    print_table(table, headers)
    for r in rows:
        if r["status"] not in ("ok",) and r["reason"]:
            print(f"  {r['server']}: {r['reason']}")
            for line in r["stderr"][-STDERR_SHOWN:]:
                print(f"    stderr: {line}")
    if reports:
        print("\nTool findings (security.tool_changes / security.injection):")
    for report in reports:
        print(f"  {report.exposed} ({report.action}):")
        for finding in report.lines():
            print(f"    - {finding}")
