"""Plugin discovery: `plugins/<name>/` directories and installed `mcp_gateway` entry points.

The plugin manager is built by a factory, never at import time, so tests and the CLI
can build one per settings. A plugin that fails to import is recorded with its
traceback (shown by `mcp-gateway plugins`) and skipped: it never stops the gateway.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import pluggy

from gateway import hookspecs
from gateway.settings import Settings

__all__ = ["PluginInfo", "PluginManager", "get_plugin_manager", "plugin_directory"]

logger = logging.getLogger(__name__)

PluginManager = pluggy.PluginManager

_PACKAGE = "mcp_gateway_plugins"
"""Directory plugins are imported as `mcp_gateway_plugins.<name>`, so relative imports work."""


@dataclass(frozen=True)
class PluginInfo:
    """What `mcp-gateway plugins` shows for one discovered plugin."""

    name: str
    source: str
    """`directory <path>` or `entry point <module>`."""
    status: str
    """`loaded`, `failed`, or `denied`."""
    error: str | None = None
    """The full traceback when `status == "failed"`."""


def plugin_directory(settings: Settings) -> Path:
    """Where plugin directories are searched: the setting, else `./plugins`."""
    return settings.plugins.directory or Path("plugins")


def _allowed(name: str, settings: Settings) -> bool:
    allow, deny = settings.plugins.allow, settings.plugins.deny
    return name not in deny and (not allow or name in allow)


def _load_directory_plugin(path: Path) -> ModuleType:
    """Import `plugins/<name>/__init__.py` (or `plugin.py`) as module `mcp_gateway_plugins.<name>`."""
    entry = path / "__init__.py"
    if not entry.is_file():
        entry = path / "plugin.py"
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


def get_plugin_manager(settings: Settings) -> tuple[PluginManager, list[PluginInfo]]:
    """Build a plugin manager with every allowed plugin registered, and a report on each."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    infos: list[PluginInfo] = []

    for path in _discover_directories(plugin_directory(settings)):
        name = path.name
        source = f"directory {path}"
        if not _allowed(name, settings):
            infos.append(PluginInfo(name, source, "denied"))
            continue
        try:
            module = _load_directory_plugin(path)
            pm.register(module, name=name)
        except Exception:  # noqa: BLE001 - boundary: a broken plugin is reported, never fatal
            error = traceback.format_exc()
            logger.error("plugin %r failed to load:\n%s", name, error)
            infos.append(PluginInfo(name, source, "failed", error))
            continue
        infos.append(PluginInfo(name, source, "loaded"))

    for ep in sorted(entry_points(group=hookspecs.PROJECT_NAME), key=lambda e: e.name):
        source = f"entry point {ep.value}"
        if pm.get_plugin(ep.name) is not None or any(i.name == ep.name for i in infos):
            infos.append(PluginInfo(ep.name, source, "failed", f"a plugin named {ep.name!r} is already loaded"))
            continue
        if not _allowed(ep.name, settings):
            infos.append(PluginInfo(ep.name, source, "denied"))
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception:  # noqa: BLE001 - boundary: a broken plugin is reported, never fatal
            error = traceback.format_exc()
            logger.error("plugin %r failed to load:\n%s", ep.name, error)
            infos.append(PluginInfo(ep.name, source, "failed", error))
            continue
        infos.append(PluginInfo(ep.name, source, "loaded"))

    pm.check_pending()
    return pm, infos
