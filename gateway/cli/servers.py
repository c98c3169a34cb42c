"""`mcp-gateway check` and `servers`: connect to every server and report each one's state;
`servers restart|disable|enable NAME` acts on the running gateway through its admin API (`gateway.cli.remote`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from gateway.cli.check_report import NOT_FAILED, print_check, server_row
from gateway.cli.common import EXIT_FAILED, EXIT_OK, Usage, load, with_registry
from gateway.cli.remote import RemoteError, add_key_option, admin_call, running_gateway
from gateway.config.settings import Settings
from gateway.plugins import PluginInfo
from gateway.registry import Registry
from gateway.security.vetting import ToolVetter

__all__ = ["SERVER_ACTIONS", "add_parsers", "run_check"]

SERVER_ACTIONS = ("restart", "disable", "enable")


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, text in [
        ("check", "validate the config, connect to every server, print a status table; exit 1 if any failed"),
        ("servers", "connect and show every server with its state"),
    ]:
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--json", action="store_true", help="print JSON for scripts")
        sub.set_defaults(run=run_check)
        if name == "servers":
            sub.add_argument("action", nargs="?", choices=SERVER_ACTIONS, help="act on the running gateway's server")
            sub.add_argument("name", nargs="?", help="the server id (with an action)")
            add_key_option(sub)


def run_check(args: argparse.Namespace, settings: Settings) -> int:
    if getattr(args, "action", None) is not None:
        return _act(args, settings)
    _, registry, pm, vetter = load(settings, serving=False)
    return anyio.run(_check, registry, args.json, args.command == "servers", vetter, pm.failed())


async def _check(
    registry: Registry, as_json: bool, detailed: bool, vetter: ToolVetter, plugins_failed: list[PluginInfo]
) -> int:
    async def body(reg: Registry) -> list[dict[str, Any]]:
        return [server_row(u, reg) for u in reg.upstreams.values()]

    rows = await with_registry(registry, body)
    failed = [r for r in rows if r["status"] not in NOT_FAILED]
    reports = sorted(vetter.reports.values(), key=lambda r: r.exposed)
    if as_json:
        findings = [{"tool": r.exposed, "server": r.server, "action": r.action, "findings": r.lines()} for r in reports]
        ok = not failed and not plugins_failed
        plugins = [info.__dict__ for info in plugins_failed]
        print(json.dumps({"servers": rows, "ok": ok, "tool_findings": findings, "plugins_failed": plugins}, indent=2))
    else:
        print_check(rows, reports, detailed)
        shown = {r["server"] for r in failed}
        for info in plugins_failed:  # those without a server row of their name (a name clash)
            if info.name not in shown:
                print(f"  {info.describe()}")
    return EXIT_FAILED if failed or plugins_failed else EXIT_OK


def _act(args: argparse.Namespace, settings: Settings) -> int:
    """`servers restart|disable|enable NAME`: only a running gateway has servers to act on."""
    if not args.name:
        raise Usage(f"servers {args.action} needs a server id")
    runtime = running_gateway(settings)
    if runtime is None:
        raise Usage(
            f"no running gateway uses the data dir {settings.data_dir}: `servers {args.action}` acts on one "
            "started with `mcp-gateway serve --transport http`"
        )
    try:
        answer = admin_call(runtime, "POST", f"/servers/{args.name}/{args.action}", args.key)
    except RemoteError as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        done = {"restart": "restarted", "disable": "disabled", "enable": "enabled"}[args.action]
        print(f"{done} {args.name} on the gateway at {runtime.url}")
    return EXIT_OK
