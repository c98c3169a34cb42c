"""`mcp-gateway plugins` and `new-plugin`: the plugins found, and a new one to start from."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

from gateway.cli.check_report import print_table
from gateway.cli.common import EXIT_FAILED, EXIT_OK, Usage
from gateway.config.loader import load_config
from gateway.config.settings import Settings
from gateway.hookspecs import PROJECT_NAME
from gateway.plugins import PluginInfo, get_plugin_manager, plugin_directory
from gateway.server_specs import check_plugin_sections, specs_from_plugins

__all__ = ["add_parsers", "run_new_plugin", "run_plugins"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plugins = commands.add_parser(
        "plugins", help="validate the config, load every plugin, list them with why any failed; exit 1 if any failed"
    )
    plugins.add_argument("--json", action="store_true", help="print JSON for scripts")
    plugins.set_defaults(run=run_plugins)

    scaffold = commands.add_parser("new-plugin", help="write a minimal plugin and its test, to start from")
    scaffold.add_argument("name", help="plugin name: lowercase letters, digits, '_' (also the tool prefix)")
    scaffold.add_argument(
        "--tests", type=Path, help="where its test goes (default: `tests` beside the plugin directory)"
    )
    scaffold.add_argument(
        "--replace",
        action="store_true",
        help="write it even though an installed plugin has this name (the new directory replaces it)",
    )
    scaffold.set_defaults(run=run_new_plugin)


def run_plugins(args: argparse.Namespace, settings: Settings) -> int:
    """Validate the config (when there is one), load every plugin and run its registration, as `serve` would."""
    config = load_config(settings.config) if settings.config.exists() else None
    pm, infos = get_plugin_manager(settings, config.plugin_directories if config is not None else ())
    if config is not None:
        check_plugin_sections(config, [info.name for info in infos])
    specs_from_plugins(pm, settings, config)  # a registration that raises fails its plugin here too
    return _plugins(pm.infos, args.json)


def run_new_plugin(args: argparse.Namespace, settings: Settings) -> int:
    _check_installed_name(args.name, args.replace)
    return _new_plugin(settings, args.name, args.tests)


def _check_installed_name(name: str, replace: bool) -> None:
    """A plugin directory named like an installed plugin replaces it: ask first (or take `--replace`)."""
    installed = [ep for ep in entry_points(group=PROJECT_NAME) if ep.name == name]
    if not installed or replace:
        return
    dist = installed[0].dist
    owner = f"package {dist.name} {dist.version}" if dist is not None else f"entry point {installed[0].value}"
    question = f"an installed plugin is named {name!r} ({owner}); a plugin directory {name!r} would replace it"
    if sys.stdin.isatty():
        if input(f"{question}. Write it anyway? [y/N] ").strip().lower() in ("y", "yes"):
            return
        raise Usage("nothing written; choose another name")
    raise Usage(f"{question}: choose another name, or pass --replace")


def _plugins(infos: list[PluginInfo], as_json: bool) -> int:
    """The table, then each failure's one line and traceback; exit 1 when a plugin failed, as `check` does."""
    failed = [info for info in infos if info.status == "failed"]
    if as_json:
        print(json.dumps([i.__dict__ for i in infos], indent=2))
        return EXIT_FAILED if failed else EXIT_OK
    if not infos:
        print("No plugins found.")
    print_table([[i.name, i.status, i.source] for i in infos], ["PLUGIN", "STATUS", "SOURCE"])
    for info in infos:
        if info.note:
            print(f"  {info.name} ({info.source}): {info.note}")
    for info in failed:
        print(f"\n{info.describe()}")
        if info.error and info.error != info.reason:
            print(info.error.rstrip())
    return EXIT_FAILED if failed else EXIT_OK


def _new_plugin(settings: Settings, name: str, tests: Path | None) -> int:
    """Write the plugin into the directory the gateway searches (beside the config), its test next to it."""
    from gateway.cli.scaffold import ScaffoldError, new_plugin, write_config

    plugins = plugin_directory(settings)
    try:
        written = new_plugin(name, plugins, tests or plugins.parent / "tests")
    except ScaffoldError as exc:
        raise Usage(str(exc)) from None
    if write_config(settings.config):
        written.append(settings.config)
    for path in written:
        print(f"wrote {path}")
    print(f"next: `mcp-gateway --config {settings.config} tools --server {name}` lists its tool")
    pytest_command = f"{sys.executable} -m pytest {written[1]}"
    if importlib.util.find_spec("pytest") is None:
        print(f"      pytest is not installed: `{sys.executable} -m pip install pytest`, then")
    print(f"      `{pytest_command}`, run in {plugins.parent}, runs its tests")
    return EXIT_OK
