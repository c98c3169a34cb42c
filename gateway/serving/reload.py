"""Live reload: re-read the YAML file while serving and apply what changed, server by server.

A reload is triggered by a change of the file (`watch_config`), by SIGHUP (`mcp-gateway serve`)
or by the admin API, and always runs through `Reloader.reload`, one at a time. The new file is
read with the loader and plugin settings the CLI uses and validated whole before anything is
touched: an invalid file is refused with its usual file:line:key error, logged, kept in the
report, and the running config keeps serving. A valid one goes to `Registry.apply_specs`
(unchanged servers keep their sessions, changed ones restart, removed ones drain, added
ones start); what cannot change while serving is reported as "needs restart".
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from gateway.config.loader import ConfigError, GatewayConfig, load_config
from gateway.config.settings import Settings
from gateway.plugins import PluginManager
from gateway.registry import Registry
from gateway.security.vetting import ToolVetter
from gateway.server_specs import RegistrationError, check_plugin_sections, specs_from_config, specs_from_plugins
from gateway.upstreams.server_set import duplicate_ids
from gateway.upstreams.upstream import UpstreamSpec

__all__ = ["HISTORY", "ReloadReport", "Reloader", "watch_config"]

logger = logging.getLogger(__name__)

HISTORY = 20
"""Reports kept for the console."""


@dataclass(frozen=True)
class ReloadReport:
    """What one reload did, or why it was refused."""

    ok: bool
    trigger: str
    """What asked for it: `watch`, `sighup`, `api`..."""
    at: float
    """Unix time it started."""
    error: str | None = None
    """Why the new config was refused (file:line:key), when `ok` is false."""
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    needs_restart: tuple[str, ...] = ()
    """Sections and settings that changed but apply only when the gateway restarts."""

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class _Plan:
    config: GatewayConfig
    specs: list[UpstreamSpec]
    needs_restart: tuple[str, ...]


class _Refused(Exception):
    """A new config that validates but cannot be applied (e.g. two servers with one id)."""


class Reloader:
    """Re-reads the config of a serving gateway and applies it (`reload`), one reload at a time."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        pm: PluginManager,
        config: GatewayConfig,
        vetter: ToolVetter | None = None,
        *,
        plugin_names: Sequence[str] = (),
        settings_source: Callable[[], Settings] | None = None,
    ) -> None:
        """`config`: the one the gateway started with. `plugin_names`: every plugin discovery found
        (loaded, denied or failed: a section for one is not a mistake). `settings_source`: reads the
        settings again as the command line did (`.env` may have changed), to say what needs a restart;
        an error it raises refuses the reload."""
        self.registry = registry
        self.settings = settings
        self.pm = pm
        self.vetter = vetter
        self.started = config
        """What the gateway started with: what needs a restart is compared with it."""
        self.config = config
        """The config applied last."""
        self.plugin_names = sorted({*plugin_names, *config.plugins})
        self.settings_source = settings_source
        self.history: deque[ReloadReport] = deque(maxlen=HISTORY)
        """The last reports, oldest first."""
        self._lock = anyio.Lock()
        self._digest = file_digest(settings.config)

    @property
    def path(self) -> Path:
        return self.settings.config

    @property
    def last(self) -> ReloadReport | None:
        return self.history[-1] if self.history else None

    async def reload(self, trigger: str) -> ReloadReport:
        """Re-read the config file and apply it; two reloads at once run one after the other."""
        async with self._lock:
            report = await self._reload(trigger)
        self.history.append(report)
        return report

    async def reload_if_changed(self, trigger: str) -> ReloadReport | None:
        """`reload`, unless the file reads the same as at the last attempt (a touch, a save without edits)."""
        if file_digest(self.path) == self._digest:
            logger.debug("config file %s is unchanged; not reloading", self.path)
            return None
        return await self.reload(trigger)

    async def _reload(self, trigger: str) -> ReloadReport:
        at = time.time()
        self._digest = file_digest(self.path)
        try:
            plan = await self._plan()
        except (ConfigError, RegistrationError, _Refused) as exc:
            return self._refused(trigger, at, str(exc))
        except Exception as exc:  # noqa: BLE001 - boundary: a plugin's own failure must not stop serving
            logger.exception("config reload (%s): reading the new config failed", trigger)
            return self._refused(trigger, at, f"{type(exc).__name__}: {exc}")
        try:
            changes = await self.registry.apply_specs(plan.specs, drain_seconds=self.settings.reload.drain_seconds)
            await self._apply_security(plan.config)
        except Exception as exc:  # noqa: BLE001 - boundary: a trigger's task must not take the gateway down
            logger.exception("config reload (%s): applying the new config failed", trigger)
            return ReloadReport(False, trigger, at, f"applying the new config failed: {type(exc).__name__}: {exc}")
        self.config = plan.config
        report = ReloadReport(
            ok=True,
            trigger=trigger,
            at=at,
            added=changes.added,
            removed=changes.removed,
            changed=changes.changed,
            unchanged=changes.unchanged,
            needs_restart=plan.needs_restart,
        )
        logger.info(
            "config reloaded (%s): added %s, removed %s, changed %s, %d unchanged",
            trigger,
            _names(changes.added),
            _names(changes.removed),
            _names(changes.changed),
            len(changes.unchanged),
        )
        if plan.needs_restart:
            logger.warning(
                "config reload (%s): changed, but applies only after a restart: %s",
                trigger,
                ", ".join(plan.needs_restart),
            )
        return report

    def _refused(self, trigger: str, at: float, error: str) -> ReloadReport:
        logger.error("config reload (%s) refused; the running config keeps serving: %s", trigger, error)
        return ReloadReport(False, trigger, at, error)

    async def _plan(self) -> _Plan:
        """The new config, validated whole, and the specs it declares; nothing is touched yet."""
        settings = self.settings_source() if self.settings_source is not None else None
        config = await anyio.to_thread.run_sync(load_config, self.path)
        check_plugin_sections(config, self.plugin_names)
        specs = self._plugin_specs(config) + specs_from_config(config)
        duplicates = duplicate_ids(specs)
        if duplicates:
            raise _Refused(f"{self.path}: server id(s) used twice (plugin and config?): {', '.join(duplicates)}")
        return _Plan(config, specs, self._needs_restart(config, settings))

    def _plugin_specs(self, config: GatewayConfig) -> list[UpstreamSpec]:
        """The plugins' servers: the running ones, unless the plugin's `plugins.<name>` section
        changed; then the plugin registers them again, with its new settings (validated here)."""
        running = self.registry.specs
        old = self.config.plugins
        changed = {name for name in {*old, *config.plugins} if old.get(name) != config.plugins.get(name)}
        if not changed:
            return [spec for spec in running.values() if spec.origin.startswith("plugin:")]
        fresh = specs_from_plugins(self.pm, self.settings, config)
        return [
            spec if spec.origin.removeprefix("plugin:") in changed or running.get(spec.id) is None else running[spec.id]
            for spec in fresh
        ]

    def _needs_restart(self, config: GatewayConfig, settings: Settings | None) -> tuple[str, ...]:
        """What changed since start-up that only a restart applies."""
        needs: list[str] = []
        if config.auth != self.started.auth:
            needs.append("auth")
        if config.security.limits != self.started.security.limits:
            needs.append("security.limits")
        if settings is not None:
            needs += changed_settings(self.settings, settings)
        return tuple(needs)

    async def _apply_security(self, config: GatewayConfig) -> None:
        """`security.tool_changes` and `security.injection` apply live: the catalog is vetted again."""
        old = self.config.security
        new = config.security
        if self.vetter is None or (old.tool_changes, old.injection) == (new.tool_changes, new.injection):
            return
        self.vetter.config = new
        await self.registry.revet()


def changed_settings(old: BaseModel, new: BaseModel, prefix: str = "GATEWAY_") -> list[str]:
    """The names of the settings (as environment variables) whose values differ."""
    names: list[str] = []
    for field in type(old).model_fields:
        a, b = getattr(old, field), getattr(new, field)
        name = f"{prefix}{field.upper()}"
        if isinstance(a, BaseModel) and isinstance(b, BaseModel):
            names += changed_settings(a, b, f"{name}__")
        elif a != b:
            names.append(name)
    return names


def file_digest(path: Path) -> str | None:
    """A hash of the file's bytes (None when it cannot be read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _names(ids: Sequence[str]) -> str:
    return ", ".join(ids) if ids else "none"


WATCH_WAKEUP_MS = 1000
"""The watch thread looks at its stop event at least this often (a cancelled watch waits for it)."""


async def watch_config(reloader: Reloader, debounce_seconds: float, stop: anyio.Event | None = None) -> None:
    """Reload whenever the config file changes, until `stop` is set. Its folder is watched, not the
    file, so that an editor that saves by writing a new file and renaming it over the old one is
    noticed too. The watch waits in a worker thread, which a cancellation cannot interrupt: set
    `stop` first, and serving ends without waiting for it (the process exits at once on end of stdin)."""
    from watchfiles import awatch  # imported only by a gateway that watches

    path = Path(os.path.abspath(reloader.path))

    def is_config(_change: object, changed: str) -> bool:
        return Path(os.path.abspath(changed)) == path

    logger.info("watching %s for changes (GATEWAY_RELOAD__WATCH)", path)
    debounce = max(1, int(debounce_seconds * 1000))
    try:
        async for _ in awatch(
            path.parent,
            watch_filter=is_config,
            debounce=debounce,
            recursive=False,
            stop_event=stop,
            rust_timeout=WATCH_WAKEUP_MS,
        ):
            await reloader.reload_if_changed("watch")
    except Exception:  # noqa: BLE001 - boundary: serving goes on without the watch (SIGHUP still reloads)
        logger.exception("the watch of %s stopped; send SIGHUP to reload", path)
