"""`mcp-gateway check` and `servers`: connect to every server and report each one's state."""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio

from gateway.cli.check_report import NOT_FAILED, print_check, server_row
from gateway.cli.common import EXIT_FAILED, EXIT_OK, load, with_registry
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.security.vetting import ToolVetter

__all__ = ["add_parsers", "run_check"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, text in [
        ("check", "validate the config, connect to every server, print a status table; exit 1 if any failed"),
        ("servers", "connect and show every server with its state"),
    ]:
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--json", action="store_true", help="print JSON for scripts")
        sub.set_defaults(run=run_check)


def run_check(args: argparse.Namespace, settings: Settings) -> int:
    _, registry, _, vetter = load(settings, serving=False)
    return anyio.run(_check, registry, args.json, args.command == "servers", vetter)


async def _check(registry: Registry, as_json: bool, detailed: bool, vetter: ToolVetter) -> int:
    async def body(reg: Registry) -> list[dict[str, Any]]:
        return [server_row(u, reg) for u in reg.upstreams.values()]

    rows = await with_registry(registry, body)
    failed = [r for r in rows if r["status"] not in NOT_FAILED]
    reports = sorted(vetter.reports.values(), key=lambda r: r.exposed)
    if as_json:
        findings = [{"tool": r.exposed, "server": r.server, "action": r.action, "findings": r.lines()} for r in reports]
        print(json.dumps({"servers": rows, "ok": not failed, "tool_findings": findings}, indent=2))
    else:
        print_check(rows, reports, detailed)
    return EXIT_FAILED if failed else EXIT_OK
