"""`mcp-gateway`: the command line. One module per command group (`serve`, `servers` for check and
servers, `tools` for tools, call and search, `keys`, `login` for login and logout, `plugins` for
plugins and new-plugin, `evaluate` for eval, `stats`, `calls` for the call log, `remote` for reload); this one
assembles the parser and runs a command.

Output is for people by default and for scripts with `--json`. A broken config is
one clear message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.cli import calls, evaluate, keys, login, plugins, remote, serve, servers, stats, tools
from gateway.cli.common import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    Usage,
    configure_logging,
    global_options,
    settings_from,
)
from gateway.config.loader import ConfigError
from gateway.server_specs import RegistrationError
from gateway.version import installed_version

__all__ = ["main", "run"]

COMMAND_GROUPS = (serve, servers, tools, keys, login, plugins, evaluate, stats, calls, remote)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="One MCP endpoint in front of many MCP servers.")
    shown = installed_version() or "unknown (not installed)"  # run from a source tree never installed
    parser.add_argument("--version", action="version", version=f"mcp-gateway {shown}")
    global_options(parser, default=None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_parsers(commands)
    for command in commands.choices.values():  # unset after the command: keep what was given before it
        global_options(command, default=argparse.SUPPRESS)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run one command, return its exit code."""
    args = _parser().parse_args(argv)
    try:
        settings = settings_from(args)
        configure_logging(settings)
        code: int = args.run(args, settings)
        return code
    except ConfigError as exc:
        print(f"mcp-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as exc:  # a JWKS file that cannot be read
        print(f"mcp-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (RegistrationError, Usage) as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"mcp-gateway: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def main() -> None:
    sys.exit(run())
