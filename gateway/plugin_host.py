"""`python -m gateway.plugin_host`: one plugin's server, alone in a child process, over stdio.

A plugin with `plugins.<name>.gateway.isolation: process` is served this way: the gateway starts
this module as a stdio server (`gateway.server_specs`), which loads only that plugin, runs its
`gateway_register_servers` with its settings as the gateway would, and serves the server named
on the command line. A tool that blocks then holds this process's event loop, not the
gateway's: the gateway's timeout fires and every other call keeps being served.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
from mcp.server import MCPServer, Server
from mcp.server.stdio import stdio_server

from gateway.config.loader import ConfigError, load_config
from gateway.config.settings import Settings
from gateway.plugins import get_plugin_manager
from gateway.server_specs import specs_from_plugins

__all__ = ["main", "serve_stdio"]


async def serve_stdio(server: MCPServer | Server) -> None:  # type: ignore[type-arg]
    """Serve `server` on this process's stdin and stdout until stdin ends."""
    lowlevel = server._lowlevel_server if isinstance(server, MCPServer) else server
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.plugin_host", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the gateway's YAML file")
    parser.add_argument("--plugin", required=True, help="the plugin to load")
    parser.add_argument("--server", required=True, help="the server it registers, to serve")
    args = parser.parse_args(argv)
    settings = Settings(config=args.config)
    settings = settings.model_copy(
        update={"plugins": settings.plugins.model_copy(update={"allow": [args.plugin], "deny": []})}
    )
    try:
        config = load_config(args.config) if args.config.exists() else None
    except ConfigError as exc:
        print(f"plugin host: config error: {exc}", file=sys.stderr)
        return 2
    pm, _ = get_plugin_manager(settings, config.plugin_directories if config is not None else ())
    specs = specs_from_plugins(pm, settings, config, hosting=True)
    for failed in pm.failed():
        print(f"plugin host: {failed.describe()}", file=sys.stderr)
    target = next((s.target for s in specs if s.id == args.server and s.failure is None), None)
    if not isinstance(target, MCPServer | Server):
        print(f"plugin host: plugin {args.plugin!r} registered no server {args.server!r}", file=sys.stderr)
        return 1
    anyio.run(serve_stdio, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
