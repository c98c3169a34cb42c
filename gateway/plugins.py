"""Plugin discovery: installed `mcp_gateway` entry points and `plugins/<name>/` directories.

The built-in plugins (clock, notes, openapi, sql) are installed with the gateway as the
package `mcp_gateway_plugins` and registered as entry points, so they are served
wherever the gateway is started. Plugin directories are looked up next to the config
file, never in the current directory: a desktop client starts the gateway from anywhere.
A directory plugin named like an installed one replaces it (reported as `overridden`);
when both are the same files (the repository's own `plugins/` under an editable
install), the plugin is loaded once.

The plugin manager is built by a factory, never at import time, so tests and the CLI
can build one per settings. A plugin that fails to import is recorded with its
traceback (shown by `mcp-gateway plugins`) and skipped: it never stops the gateway.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType

import pluggy

from gateway import hookspecs
from gateway.config.settings import Settings

__all__ = ["PluginInfo", "PluginManager", "get_plugin_manager", "plugin_directory"]

logger = logging.getLogger(__name__)

PluginManager = pluggy.PluginManager

_PACKAGE = "mcp_gateway_local_plugins"
"""Directory plugins are imported as `mcp_gateway_local_plugins.<name>`, so relative imports work.

Not `mcp_gateway_plugins`: that is the installed package of the built-ins, which a
made-up namespace of the same name would hide."""


@dataclass(frozen=True)
class PluginInfo:
    """What `mcp-gateway plugins` shows for one discovered plugin."""

    name: str
    source: str
    """`directory <path>` or `entry point <module>`."""
    status: str
    """`loaded`, `failed`, `denied`, or `overridden` (a directory plugin of the same name replaces it)."""
    error: str | None = None
    """The full traceback when `status == "failed"`."""
    note: str | None = None
    """What replaced it, when `status == "overridden"`."""


def plugin_directory(settings: Settings) -> Path:
    """Where plugin directories are searched: `plugins.directory`, else `plugins`, relative to the config file."""
    directory = (settings.plugins.directory or Path("plugins")).expanduser()
    return Path(os.path.abspath(settings.config.expanduser())).parent / directory


def _allowed(name: str, settings: Settings) -> bool:
    allow, deny = settings.plugins.allow, settings.plugins.deny
    return name not in deny and (not allow or name in allow)


def _entry_file(path: Path) -> Path:
    """The file that makes directory `path` a plugin: `__init__.py`, else `plugin.py`."""
    entry = path / "__init__.py"
    return entry if entry.is_file() else path / "plugin.py"


def _load_directory_plugin(path: Path) -> ModuleType:
    """Import `plugins/<name>/__init__.py` (or `plugin.py`) as module `mcp_gateway_local_plugins.<name>`."""
    entry = _entry_file(path)
    if _PACKAGE not in sys.modules:
        package = ModuleType(_PACKAGE)
        package.__path__ = []
        sys.modules[_PACKAGE] = package
    module_name = f"{_PACKAGE}.{path.name}"
    spec = importlib.util.spec_from_file_location(
        module_name, entry, submodule_search_locations=[str(path)] if entry.name == "__init__.py" else None
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import plugin from {entry}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _discover_directories(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_dir()
        and not p.name.startswith((".", "_"))
        and ((p / "__init__.py").is_file() or (p / "plugin.py").is_file())
    )


def _is_same_plugin(ep: EntryPoint, path: Path) -> bool:
    """Whether entry point `ep` is the module in directory `path`, found without running the module itself."""
    try:
        spec = importlib.util.find_spec(ep.module)
    except Exception:  # noqa: BLE001 - a parent package that fails to import: loading the entry point reports it
        return False
    if spec is None or spec.origin is None:
        return False
    return Path(spec.origin).resolve() == _entry_file(path).resolve()


def _register(pm: PluginManager, name: str, source: str, load: Callable[[], object], settings: Settings) -> PluginInfo:
    """Load and register one plugin unless the settings deny it; a failure is reported, never raised."""
    if not _allowed(name, settings):
        return PluginInfo(name, source, "denied")
    try:
        pm.register(load(), name=name)
    except Exception:  # noqa: BLE001 - boundary: a broken plugin is reported, never fatal
        error = traceback.format_exc()
        logger.error("plugin %r failed to load:\n%s", name, error)
        return PluginInfo(name, source, "failed", error)
    return PluginInfo(name, source, "loaded")


def get_plugin_manager(settings: Settings) -> tuple[PluginManager, list[PluginInfo]]:
    """Build a plugin manager with every allowed plugin registered, and a report on each.

    Directory plugins come first (by name), then entry points (by name); hooks run in that order.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    eps = (
        sorted(entry_points(group=hookspecs.PROJECT_NAME), key=lambda e: e.name)
        if settings.plugins.entry_points
        else []
    )
    installed = {ep.name: ep for ep in reversed(eps)}  # the first of a name, as the loop below keeps it
    directories = [
        path
        for path in _discover_directories(plugin_directory(settings))
        if path.name not in installed or not _is_same_plugin(installed[path.name], path)
    ]
    infos = [
        _register(pm, path.name, f"directory {path}", functools.partial(_load_directory_plugin, path), settings)
        for path in directories
    ]

    replaced = {path.name: path for path in directories}
    for ep in eps:
        source = f"entry point {ep.value}"
        if not _allowed(ep.name, settings):
            infos.append(PluginInfo(ep.name, source, "denied"))
        elif ep.name in replaced:
            note = f"the plugin directory {replaced[ep.name]} replaces it"
            infos.append(PluginInfo(ep.name, source, "overridden", note=note))
        elif any(i.name == ep.name for i in infos):
            infos.append(PluginInfo(ep.name, source, "failed", f"a plugin named {ep.name!r} is already loaded"))
        else:
            infos.append(_register(pm, ep.name, source, ep.load, settings))

    pm.check_pending()
    return pm, infos
