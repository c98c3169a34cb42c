"""Plugin discovery: installed `mcp_gateway` entry points and `plugins/<name>/` directories.

The built-in plugins (clock, notes, openapi, sql) are installed with the gateway as the
package `mcp_gateway_plugins` and registered as entry points, so they are served
wherever the gateway is started. Plugin directories are looked up next to the config
file (or in the directories the YAML's `plugins.directories` names), never in the
current directory: a desktop client starts the gateway from anywhere. A directory
plugin named like an installed one replaces it (reported as `overridden`); when both
are the same files (the repository's own `plugins/` under an editable install), the
plugin is loaded once.

A plugin fails alone. Whatever breaks — its import, a hook pluggy refuses, a hook named
like no gateway hook, two packages claiming one name, or later its registration hook
(`PluginManager.fail`, called by `gateway.server_specs`) — the plugin is unregistered
and reported `failed` with its package or file, line and a one-line reason; the others
load and serve. The plugin manager is built by a factory, never at import time.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from gateway import hookspecs
from gateway.config.settings import Settings

__all__ = [
    "PluginInfo",
    "PluginManager",
    "get_plugin_manager",
    "plugin_of_module",
    "plugin_directories",
    "plugin_directory",
    "plugin_failure",
]

logger = logging.getLogger(__name__)

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
    """The full traceback (or the whole explanation) when `status == "failed"`."""
    note: str | None = None
    """What replaced it, when `status == "overridden"`."""
    package: str | None = None
    """The installed distribution and its version (`mcp-gateway-units 1.0`), for an entry point."""
    file: str | None = None
    """Where it failed: the plugin's own file and line when the failure is in its code."""
    line: int | None = None
    reason: str | None = None
    """One line saying why it failed (`KeyError: 'units'`)."""

    def describe(self) -> str:
        """`plugin 'units' (package mcp-gateway-units 1.0, units/__init__.py:12): KeyError: 'units'`."""
        where = [f"package {self.package}"] if self.package else []
        if self.file:
            where.append(f"{self.file}:{self.line}" if self.line else self.file)
        elif not self.package:
            where.append(self.source)
        return f"plugin {self.name!r} ({', '.join(where)}): {self.reason or self.status}"


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, with the report on every plugin discovered (`infos`)."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.infos: list[PluginInfo] = []

    def failed(self) -> list[PluginInfo]:
        return [info for info in self.infos if info.status == "failed"]

    def fail(self, name: str, exc: BaseException, what: str | None) -> PluginInfo:
        """Unregister plugin `name` after `exc` in `what` (e.g. `gateway_register_servers`; None: the
        exception's message says it all); report it."""
        plugin = self.get_plugin(name)
        roots = _roots(plugin) if isinstance(plugin, ModuleType) else []
        if plugin is not None:
            self.unregister(plugin, name=name)
        index = next((i for i, info in enumerate(self.infos) if info.name == name and info.status == "loaded"), None)
        base = self.infos[index] if index is not None else PluginInfo(name, "?", "loaded")
        info = _failure(base, exc, roots, what)
        if index is None:
            self.infos.append(info)
        else:
            self.infos[index] = info
        logger.error("%s", info.describe())
        return info


def plugin_of_module(pm: pluggy.PluginManager) -> Callable[[str], str | None]:
    """A function naming the plugin a module belongs to (`mcp_gateway_local_plugins.x.tools` -> `x`)."""
    roots = {plugin.__name__: name for name, plugin in pm.list_name_plugin() if isinstance(plugin, ModuleType)}

    def plugin_of(module: str) -> str | None:
        while module:
            if module in roots:
                return roots[module]
            module = module.rpartition(".")[0]
        return None

    return plugin_of


def plugin_directories(settings: Settings, extra: Iterable[Path] = ()) -> list[Path]:
    """Where plugin directories are searched, relative to the config file's folder: the YAML's
    `plugins.directories` (`extra`) and `GATEWAY_PLUGINS__DIRECTORY`, else `plugins`."""
    folder = Path(os.path.abspath(settings.config.expanduser())).parent
    named = [*extra, *([settings.plugins.directory] if settings.plugins.directory else [])]
    return list(dict.fromkeys(folder / path.expanduser() for path in (named or [Path("plugins")])))


def plugin_directory(settings: Settings) -> Path:
    """Where `new-plugin` writes: `GATEWAY_PLUGINS__DIRECTORY`, else `plugins`, relative to the config file."""
    return plugin_directories(settings)[0]


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


def _package_of(ep: EntryPoint) -> str | None:
    dist = ep.dist
    return f"{dist.name} {dist.version}" if dist is not None else None


def _roots(plugin: ModuleType) -> list[str]:
    """The folders holding a plugin module's code: where its own frames are."""
    paths = list(getattr(plugin, "__path__", None) or [])
    if not paths and getattr(plugin, "__file__", None):
        paths = [os.path.dirname(str(plugin.__file__))]
    return paths


def _entry_point_roots(ep: EntryPoint) -> list[str]:
    """The folders of an entry point's module, found without importing it (it may not import)."""
    try:
        spec = importlib.util.find_spec(ep.module.split(".")[0])
    except Exception:  # noqa: BLE001 - a parent package that fails to import: no folder to name
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    return [os.path.dirname(spec.origin)] if spec.origin else []


def _frame_in(exc: BaseException, roots: Iterable[str]) -> tuple[str, int] | None:
    """The innermost traceback frame in the plugin's own files (else the innermost of all)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return exc.filename, exc.lineno or 0
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    prefixes = tuple(os.path.join(os.path.abspath(root), "") for root in roots)
    own = [f for f in frames if prefixes and os.path.abspath(f.filename).startswith(prefixes)]
    chosen = (own or frames)[-1:] if (own or frames) else []
    return (chosen[0].filename, chosen[0].lineno or 0) if chosen else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _failure(base: PluginInfo, exc: BaseException, roots: Iterable[str], what: str | None) -> PluginInfo:
    where = _frame_in(exc, roots)
    trace = "".join(traceback.format_exception(exc))
    return replace(
        base,
        status="failed",
        error=trace,
        file=where[0] if where else None,
        line=where[1] if where else None,
        reason=f"{what} raised {_one_line(exc)}" if what else str(exc),
    )


def plugin_failure(info: PluginInfo, reason: str, *, file: str | None = None, line: int | None = None) -> PluginInfo:
    """`info` marked failed for `reason`, a failure that is no exception of the plugin's (a name clash)."""
    return replace(info, status="failed", reason=reason, error=reason, file=file, line=line)


def _unknown_hooks(pm: PluginManager, plugin: object) -> list[tuple[str, Callable[..., object]]]:
    """The plugin's `@hookimpl` functions named like no gateway hook (pluggy's `check_pending`, per plugin)."""
    found: list[tuple[str, Callable[..., object]]] = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.spec is not None:
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and not impl.optionalhook:
                found.append((caller.name, impl.function))
    return found


def _hook_problem(pm: PluginManager, plugin: object) -> tuple[str, str | None, int | None] | None:
    """Why pluggy would refuse the plugin's hooks once all are registered: a misspelt hook name."""
    for name, function in _unknown_hooks(pm, plugin):
        known = [hook for hook in dir(hookspecs) if hook.startswith("gateway_")]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"the hooks are {', '.join(known)}"
        code = getattr(inspect.unwrap(function), "__code__", None)
        file, line = (code.co_filename, code.co_firstlineno) if code is not None else (None, None)
        return f"@hookimpl {name!r} is not a gateway hook ({hint})", file, line
    return None


def _validation_reason(
    pm: PluginManager, plugin: object, exc: pluggy.PluginValidationError
) -> tuple[str, Callable[..., object] | None]:
    """pluggy's refusal in one line, with the arguments the hook offers, and the function refused."""
    lines = str(exc).splitlines()
    hook = lines[0].rsplit("for hook ", 1)[-1].strip("'") if lines else ""
    caller = getattr(pm.hook, hook, None)
    spec = caller.spec if caller is not None else None
    offered = f"; {hook} takes ({', '.join(spec.argnames)})" if spec is not None else ""
    detail = "; ".join(line.removeprefix("hookimpl definition: ") for line in lines[1:])
    function = getattr(plugin, hook, None)
    return f"@hookimpl {detail or lines[0]}{offered}", function if callable(function) else None


def _register(pm: PluginManager, info: PluginInfo, load: Callable[[], object], roots: list[str]) -> PluginInfo:
    """Load and register one plugin; a failure is reported, never raised. `roots`: the plugin's folders."""
    try:
        plugin = load()
    except Exception as exc:  # noqa: BLE001 - boundary: a broken plugin is reported, never fatal
        return _failure(info, exc, roots, "importing it")
    try:
        pm.register(plugin, name=info.name)
    except pluggy.PluginValidationError as exc:  # a hook whose arguments are not the hook's
        reason, function = _validation_reason(pm, plugin, exc)
        code = getattr(inspect.unwrap(function), "__code__", None) if function is not None else None
        if code is None:
            return plugin_failure(info, reason)
        return plugin_failure(info, reason, file=code.co_filename, line=code.co_firstlineno)
    except Exception as exc:  # noqa: BLE001 - boundary: a broken plugin is reported, never fatal
        return _failure(info, exc, _roots(plugin) if isinstance(plugin, ModuleType) else [], "registering it")
    problem = _hook_problem(pm, plugin)
    if problem is not None:
        pm.unregister(plugin, name=info.name)
        reason, file, line = problem
        return plugin_failure(info, reason, file=file, line=line)
    return info


def _logged(info: PluginInfo) -> PluginInfo:
    if info.status == "failed":
        logger.error("%s", info.describe())
    return info


def skip_sdk_logging_setup() -> None:
    """Make the MCP SDK's `MCPServer(...)` skip its logging set-up where it would change nothing.

    Each `MCPServer` (every plugin builds one) calls the SDK's `configure_logging`, which builds a
    rich `RichHandler` (importing rich: 1.5 MB of an idle gateway) for `logging.basicConfig`, which
    does nothing once the root logger has a handler, as a serving gateway's has. Without one the
    SDK's own set-up runs as before."""
    from mcp.server.mcpserver import server as sdk_server

    original = getattr(sdk_server.configure_logging, "__wrapped__", sdk_server.configure_logging)

    @functools.wraps(original)
    def configure_logging(*args: Any, **kwargs: Any) -> None:
        if not logging.getLogger().handlers:
            original(*args, **kwargs)

    sdk_server.configure_logging = configure_logging


def get_plugin_manager(settings: Settings, directories: Iterable[Path] = ()) -> tuple[PluginManager, list[PluginInfo]]:
    """Build a plugin manager with every allowed plugin registered, and a report on each (also `pm.infos`).

    `directories`: the YAML's `plugins.directories`, relative to the config file's folder.
    Directory plugins come first (by directory, then name), then entry points (by name); hooks run in that order.
    """
    skip_sdk_logging_setup()
    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    eps = (
        sorted(entry_points(group=hookspecs.PROJECT_NAME), key=lambda e: e.name)
        if settings.plugins.entry_points
        else []
    )
    installed = {ep.name: ep for ep in reversed(eps)}  # the first of a name, as the loop below keeps it
    infos = pm.infos
    replaced: dict[str, Path] = {}
    for folder in plugin_directories(settings, directories):
        for path in _discover_directories(folder):
            if path.name in installed and _is_same_plugin(installed[path.name], path):
                continue
            info = PluginInfo(path.name, f"directory {path}", "loaded", file=str(_entry_file(path)))
            if not _allowed(path.name, settings):
                infos.append(replace(info, status="denied"))
            elif path.name in replaced:
                reason = f"a plugin named {path.name!r} is already loaded from {replaced[path.name]}"
                infos.append(_logged(plugin_failure(info, reason)))
            else:
                replaced[path.name] = path
                infos.append(_logged(_register(pm, info, functools.partial(_load_directory_plugin, path), [str(path)])))

    loaded_from: dict[str, str] = {}
    for ep in eps:
        package = _package_of(ep)
        info = PluginInfo(ep.name, f"entry point {ep.value}", "loaded", package=package)
        if not _allowed(ep.name, settings):
            infos.append(replace(info, status="denied"))
        elif ep.name in replaced:
            note = f"the plugin directory {replaced[ep.name]} replaces it"
            infos.append(replace(info, status="overridden", note=note))
        elif ep.name in loaded_from:
            reason = (
                f"the entry point name {ep.name!r} is also used by {loaded_from[ep.name]}, loaded first; "
                "uninstall one, or deny one with GATEWAY_PLUGINS__DENY"
            )
            infos.append(_logged(plugin_failure(info, reason)))
        else:
            loaded_from[ep.name] = f"package {package}" if package else f"entry point {ep.value}"
            infos.append(_logged(_register(pm, info, ep.load, _entry_point_roots(ep))))

    pm.check_pending()  # every plugin with an unknown hook was failed above, so this only guards the invariant
    return pm, infos
