"""Test a plugin behind a real gateway: `plugin_client` serves a folder of plugins in process and hands
back the SDK's real client connected to it (in memory: no process, no port).

It is what `mcp-gateway new-plugin` writes its test with, and what docs/plugins.md shows: the
tool names the model sees (`prefix__tool`), the plugin's `plugins.<name>` settings from a YAML
file, its `gateway_before_call`/`after_call`/`translate_error` hooks and the gateway's
validation, timeouts and error results all apply, as they do under `mcp-gateway serve`.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from mcp import Client

from gateway.config.loader import GatewayConfig, load_config
from gateway.config.runtime_settings import PluginSettings
from gateway.config.settings import Settings
from gateway.plugins import get_plugin_manager
from gateway.registry import Registry
from gateway.server_specs import check_plugin_sections, specs_from_plugins
from gateway.serving.server import GatewayServer

__all__ = ["PluginLoadError", "plugin_client"]


class PluginLoadError(Exception):
    """A plugin under test failed to load or register: the message has each one's file, line and reason."""


@asynccontextmanager
async def plugin_client(
    plugins: Path | str,
    *,
    config: Path | str | None = None,
    data_dir: Path | str | None = None,
    startup_timeout: float = 30.0,
) -> AsyncIterator[Client]:
    """A real MCP client of a gateway that serves the plugins in folder `plugins` (and no installed ones).

    `config`: a YAML file whose `plugins:` sections configure them (default: none). `data_dir`: where
    the gateway and the plugins keep files (default: a temporary folder, removed afterwards). Relative
    paths are relative to the current directory. Raises `PluginLoadError` when a plugin failed, so a
    test never passes against a gateway that quietly left the plugin out.
    """
    folder = Path(plugins).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"no plugin folder at {folder}")
    loaded: GatewayConfig | None = load_config(Path(config)) if config is not None else None
    with tempfile.TemporaryDirectory(prefix="mcp-gateway-test-") as scratch:
        settings = Settings(
            config=Path(config).resolve() if config is not None else folder.parent / "external-mcps.yaml",
            data_dir=Path(data_dir).resolve() if data_dir is not None else Path(scratch),
            plugins=PluginSettings(directory=folder, entry_points=False),
        )
        pm, infos = get_plugin_manager(settings)
        if loaded is not None:
            check_plugin_sections(loaded, [info.name for info in infos])
        specs = specs_from_plugins(pm, settings, loaded)
        if pm.failed():
            raise PluginLoadError("\n".join(info.describe() for info in pm.failed()))
        registry = Registry(specs, settings, plugins=pm)
        async with registry.running():
            with anyio.fail_after(startup_timeout):
                await registry.wait_settled()
            broken = [f"server {u.id!r}: {u.reason}" for u in registry.upstreams.values() if u.state == "failed"]
            if broken:
                raise PluginLoadError("\n".join(broken))
            gateway = GatewayServer(registry, settings)
            async with Client(gateway.server) as client:
                yield client
