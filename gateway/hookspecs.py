"""Every pluggy hook the gateway calls. Plugins implement them with `@hookimpl`.

Hooks are prefixed `gateway_`, typed, and say how the results of several plugins
combine. Contribution hooks take a `register` callback rather than returning values
(the `llm` convention): a plugin may register zero, one or many things.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from mcp.server import MCPServer, Server
    from pydantic import BaseModel

    from gateway.router.base import Embedder
    from gateway.settings import Settings

__all__ = [
    "PROJECT_NAME",
    "RegisterServer",
    "gateway_embedder",
    "gateway_register_servers",
    "hookimpl",
    "hookspec",
]

PROJECT_NAME = "mcp_gateway"
"""The pluggy project name, and the entry-point group installed plugins use."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class RegisterServer(Protocol):
    """The callback handed to `gateway_register_servers`."""

    def __call__(
        self,
        name: str,
        server: MCPServer | Server[Any],
        *,
        description: str = "",
        capabilities: Sequence[str] = (),
    ) -> None:
        """Register an in-process MCP server under `name` (also its default tool prefix).

        `description` and `capabilities` (free tags) describe the server to people and
        to the router. Registering the same name twice is an error that names both plugins.
        """


@hookspec
def gateway_register_servers(register: RegisterServer, settings: Settings, config: BaseModel | None) -> None:
    """Register internal MCP servers by calling `register(name, server, ...)`.

    Every plugin's implementation is called; the servers of all of them are served.
    The gateway reaches each one through the SDK's in-memory transport, exactly as it
    reaches an external server over stdio or HTTP. `settings` gives the data directory
    and other gateway-wide settings. `config` is this plugin's own `plugins.<name>:`
    section of the YAML file, validated against the pydantic model the plugin module
    declares as `Config` (None when it declares none). An implementation may leave
    out any argument it does not use.
    """


@hookspec(firstresult=True)
def gateway_embedder(settings: Settings) -> Embedder | None:
    """Provide the router's embedding model instead of the built-in fastembed one.

    The first plugin that returns an object (not None) wins; plugins are asked in
    reverse registration order, as pluggy does. Return None to leave the choice to
    others. The object must satisfy `gateway.router.base.Embedder`: `model_id`, `dim`,
    `embed_documents(texts)` and `embed_query(text)`, returning L2-normalized float32
    numpy arrays. It is called from a worker thread.
    """
