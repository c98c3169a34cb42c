"""The upstream servers a gateway is told about: each YAML entry's connection spec, and the
servers plugins register through `gateway_register_servers`, each with its validated
`plugins.<name>` settings. The registry (`gateway.registry`) runs what these declare.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from mcp import StdioServerParameters
from mcp.server import MCPServer, Server
from pydantic import BaseModel

from gateway.config.loader import (
    PLUGIN_OPTIONS_KEY,
    ConfigError,
    GatewayConfig,
    ServerConfig,
    UnusableServer,
    validate_plugin_options,
    validate_plugin_settings,
)
from gateway.config.plugin_options import PluginOptions
from gateway.config.settings import Settings
from gateway.plugins import PluginManager
from gateway.upstreams.oauth import OAuthBinding, Vault, vault_from_settings
from gateway.upstreams.upstream import UpstreamSpec

__all__ = [
    "RegistrationError",
    "check_plugin_sections",
    "failed_plugin_specs",
    "plugin_options",
    "plugin_settings",
    "spec_from_config",
    "specs_from_config",
    "specs_from_plugins",
]


SERVER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A failed plugin's name is shown as a server only when it could be one."""
_NO_SERVER = Server("failed plugin")
"""The target of a failed plugin's server, never connected (`UpstreamSpec.failure`)."""


class RegistrationError(Exception):
    """A plugin registered a server badly (for example, a name already taken)."""


def spec_from_config(
    server: ServerConfig, settings: Settings | None = None, vault: Vault | None = None
) -> UpstreamSpec:
    """The connection spec of one YAML-declared server (`settings`: for `auth: oauth`, where its tokens are)."""
    target: StdioServerParameters | str
    headers: dict[str, str] = {}
    if server.transport == "stdio":
        assert server.command is not None
        target = StdioServerParameters(
            command=server.command,
            args=list(server.args),
            env={**server.env, **server.secret_env} or None,
            cwd=server.cwd,
        )
    else:
        assert server.url is not None
        target = server.url
        headers = {**server.headers, **server.secret_headers}
    return UpstreamSpec(
        id=server.id,
        prefix=server.prefix,
        transport=server.transport,
        target=target,
        name=server.name,
        description=server.description,
        capabilities=tuple(server.capabilities),
        headers=headers,
        timeout=server.timeout,
        enabled=server.enabled,
        origin="config",
        tool_filter=server.tools.permits,
        protocol=server.protocol,
        secrets=_secrets_of(server),
        tool_timeouts=dict(server.tool_timeouts),
        retry_tools=tuple(server.retry_tools),
        max_concurrent_calls=server.max_concurrent_calls,
        health_interval=server.health_interval,
        start=server.start,
        idle_timeout=server.idle_timeout,
        forward_caller_token=server.forward_caller_token,
        oauth=_oauth_binding(server, settings, vault),
        stderr_level=logging.getLevelName(server.stderr_log_level.upper()),
    )


_SECRET_NAME = re.compile(r"key|token|secret|passw|auth|cookie|credential", re.IGNORECASE)


def _secrets_of(server: ServerConfig) -> tuple[str, ...]:
    """Values never to repeat: credentials, every header value, and env values with secret-like names."""
    values = [*server.secret_env.values(), *server.secret_headers.values(), *server.headers.values()]
    values += [value for name, value in server.env.items() if _SECRET_NAME.search(name)]
    # A bearer header's token is masked on its own too, wherever it shows up without "Bearer".
    values += [value.split(" ", 1)[1] for value in list(values) if value.lower().startswith("bearer ")]
    return tuple(sorted(set(values), key=len, reverse=True))


def _oauth_binding(server: ServerConfig, settings: Settings | None, vault: Vault | None) -> OAuthBinding | None:
    if server.auth is None:
        return None
    assert server.url is not None
    settings = settings or Settings()
    vault = vault or vault_from_settings(settings)
    return OAuthBinding(server.id, server.url, server.auth, vault, poll_interval=settings.oauth.poll_interval)


def specs_from_config(config: GatewayConfig, settings: Settings | None = None) -> list[UpstreamSpec]:
    """The specs of the YAML's servers; `settings` say where OAuth servers' tokens are (default: the environment's)."""
    vault = None
    if any(server.auth is not None for server in config.servers.values()):
        vault = vault_from_settings(settings or Settings())
    specs = [spec_from_config(server, settings, vault) for server in config.servers.values()]
    return specs + [_unusable_spec(server) for server in config.unusable.values()]


def _unusable_spec(server: UnusableServer) -> UpstreamSpec:
    """A server whose entry cannot be used (`GatewayConfig.unusable`): reported failed with the reason."""
    return UpstreamSpec(
        id=server.id,
        prefix=server.prefix,
        transport=server.transport,
        target="",
        enabled=server.enabled,
        origin="config",
        failure=server.reason,
    )


def plugin_settings(pm: PluginManager, name: str, config: GatewayConfig | None) -> BaseModel | None:
    """Plugin `name`'s validated `plugins.<name>` section, or None when it declares no `Config` model."""
    model = getattr(pm.get_plugin(name), "Config", None)
    raw = config.plugins.get(name) if config is not None else None
    own = {key: value for key, value in (raw or {}).items() if key != PLUGIN_OPTIONS_KEY}
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        if own and config is not None:
            raise ConfigError(
                config.path,
                "this plugin takes no settings (its module declares no `Config` model)",
                config.line_of(("plugins", name)),
                f"plugins.{name}",
            )
        return None
    if config is None:
        return model.model_validate({})
    return validate_plugin_settings(config, name, model)


def plugin_options(name: str, config: GatewayConfig | None) -> PluginOptions:
    """`plugins.<name>.gateway`: the gateway's options for the plugin's servers, validated."""
    return validate_plugin_options(config, name, PluginOptions) if config is not None else PluginOptions()


def check_plugin_sections(config: GatewayConfig, known: Sequence[str]) -> None:
    """A `plugins.<name>` section for a plugin that does not exist is a mistake worth naming."""
    for name in config.plugins:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (plugins found: {', '.join(known) or 'none'})"
            raise ConfigError(config.path, f"no plugin named {name!r}{hint}", config.line_of(("plugins", name)))


def specs_from_plugins(
    pm: PluginManager, settings: Settings, config: GatewayConfig | None = None, *, hosting: bool = False
) -> list[UpstreamSpec]:
    """Ask every plugin for its servers, through `gateway_register_servers`, with its own settings.

    A plugin whose hook raises, or that registers badly (a name taken, not a server), fails
    alone: none of its servers are kept, it is reported in `pm.infos`, and it gets a `failed`
    server of its name, so that `check`, `servers`, the console and `/readyz` show it. So does
    a plugin that failed to load. Bad `plugins.<name>` settings are the config's fault and raise
    `ConfigError` (naming file, line and key), as every other config mistake does.

    A plugin with `isolation: process` gets stdio specs that run its servers in a child
    (`gateway.plugin_host`); `hosting` is that child's own call, which serves them in process.
    """
    specs: list[UpstreamSpec] = []
    owners: dict[str, str] = {}

    for impl in pm.hook.gateway_register_servers.get_hookimpls():
        plugin_name = pm.get_name(impl.plugin) or "?"
        options = plugin_options(plugin_name, config)
        own: list[UpstreamSpec] = []

        def register(
            name: str,
            server: MCPServer | Server[Any],
            *,
            description: str = "",
            capabilities: Sequence[str] = (),
            timeout: float | None = None,
            _plugin: str = plugin_name,
            _own: list[UpstreamSpec] = own,
            _options: PluginOptions = options,
        ) -> None:
            taken = owners.get(name) or next((_plugin for spec in _own if spec.id == name), None)
            if taken is not None:
                raise RegistrationError(
                    f"plugin {_plugin!r} registers server {name!r}, already registered by plugin {taken!r}"
                )
            if not isinstance(server, MCPServer | Server):
                raise RegistrationError(
                    f"plugin {_plugin!r} registered {name!r} with a {type(server).__name__}; "
                    "expected an mcp.server.MCPServer or mcp.server.Server"
                )
            if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
                raise RegistrationError(
                    f"plugin {_plugin!r} registered {name!r} with timeout={timeout!r}; expected seconds > 0"
                )
            _own.append(
                UpstreamSpec(
                    id=name,
                    prefix=name,
                    transport="memory",
                    target=server,
                    name=name,
                    description=description,
                    capabilities=tuple(capabilities),
                    origin=f"plugin:{_plugin}",
                    timeout=_options.timeout if _options.timeout is not None else timeout,
                    tool_timeouts=dict(_options.tool_timeouts),
                    max_concurrent_calls=_options.max_concurrent_calls,
                )
            )

        offered = {"register": register, "settings": settings, "config": plugin_settings(pm, plugin_name, config)}
        try:
            impl.function(**{name: offered[name] for name in impl.argnames})
        except Exception as exc:  # noqa: BLE001 - boundary: one plugin's registration must not stop the others
            pm.fail(plugin_name, exc, None if isinstance(exc, RegistrationError) else "gateway_register_servers")
            continue
        for spec in own:
            owners[spec.id] = plugin_name
        isolated = options.isolation == "process" and not hosting
        specs.extend(_in_child_process(spec, plugin_name, settings) if isolated else spec for spec in own)
    return specs + failed_plugin_specs(pm, {*owners, *(config.servers if config is not None else ())})


def _in_child_process(spec: UpstreamSpec, plugin: str, settings: Settings) -> UpstreamSpec:
    """`spec` served by `python -m gateway.plugin_host` over stdio: the same plugin, settings and server."""
    env = dict(os.environ) | {
        "GATEWAY_DATA_DIR": str(settings.data_dir),
        "GATEWAY_PLUGINS__ENTRY_POINTS": "true" if settings.plugins.entry_points else "false",
    }
    if settings.plugins.directory is not None:
        env["GATEWAY_PLUGINS__DIRECTORY"] = str(settings.plugins.directory)
    config = os.path.abspath(settings.config.expanduser())
    target = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway.plugin_host", "--config", config, "--plugin", plugin, "--server", spec.id],
        env=env,
        cwd=os.path.dirname(config),
    )
    return replace(spec, transport="stdio", target=target, stderr_level=logging.WARNING)


def failed_plugin_specs(pm: PluginManager, taken: Collection[str]) -> list[UpstreamSpec]:
    """A `failed` server named after each failed plugin (whose name no server has), carrying its reason."""
    return [
        UpstreamSpec(
            id=info.name,
            prefix=info.name,
            transport="memory",
            target=_NO_SERVER,
            name=info.name,
            origin=f"plugin:{info.name}",
            failure=info.describe(),
        )
        for info in pm.failed()
        if info.name not in taken and SERVER_ID.match(info.name)
    ]
