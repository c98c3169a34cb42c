"""Every pluggy hook the gateway calls. Plugins implement them with `@hookimpl`.

Hooks are prefixed `gateway_`, typed, and say how the results of several plugins
combine. Contribution hooks take a `register` callback rather than returning values
(the `llm` convention): a plugin may register zero, one or many things.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server import MCPServer, Server
    from pydantic import BaseModel

    from gateway.calls.chain import ToolCall
    from gateway.config.settings import Settings
    from gateway.errors import GatewayError
    from gateway.router.base import Embedder

__all__ = [
    "PROJECT_NAME",
    "RegisterServer",
    "gateway_after_call",
    "gateway_before_call",
    "gateway_embedder",
    "gateway_enrich_tool",
    "gateway_register_servers",
    "gateway_translate_error",
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
        timeout: float | None = None,
    ) -> None:
        """Register an in-process MCP server under `name` (also its default tool prefix).

        `description` and `capabilities` (free tags) describe the server to people and
        to the router; `timeout` is the plugin's default seconds per call, which the YAML's
        `plugins.<plugin>.gateway.timeout` overrides. Registering a name already taken is an
        error that names both plugins and fails the plugin that registered second.
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
    out any argument it does not use. An exception here fails this plugin alone (none of
    its servers are served; it is reported with the line that raised); the others serve.
    """


@hookspec(firstresult=True)
def gateway_embedder(settings: Settings) -> Embedder | None:
    """Provide the router's embedding model instead of the built-in fastembed one.

    The first plugin in plugin order (directories by name, then entry points by name, the
    order `gateway_before_call` runs in) that returns an object wins. Return None to leave
    the choice to others. The object must satisfy `gateway.router.base.Embedder`: `model_id`, `dim`,
    `embed_documents(texts)` and `embed_query(text)`, returning L2-normalized float32
    numpy arrays. It is called from a worker thread.
    """


@hookspec
def gateway_enrich_tool(tool: types.Tool, server_id: str) -> str | Sequence[str] | None:
    """Add text the router indexes for one tool: synonyms, the tasks it serves, a translation.

    Called for every tool whenever the router (re)indexes the catalog; `tool` is the tool
    as exposed (`prefix__name`), `server_id` its server. Every plugin's text is appended to
    the tool's documents, in plugin order (a budget caps it: about 300 characters for
    keyword search, 20 word pieces for the embedding). Return None to add nothing. It runs
    in the router's indexing, so keep it fast and free of I/O; an exception is logged and
    ignored.
    """


@hookspec
def gateway_before_call(call: ToolCall) -> types.CallToolResult | Awaitable[types.CallToolResult | None] | None:
    """Look at (or change) a proxied tool call before anything else runs; may answer it instead.

    Called for every `tools/call` routed to a server, before argument validation, in
    plugin order (directories by name, then entry points). A hook may replace
    `call.arguments` (validation then checks the new ones), and may return a
    `CallToolResult` to answer the call itself: the remaining before-hooks and the
    upstream are then skipped (the after-hooks still run). Return None to go on. May be
    a coroutine function. An exception becomes an `execution_error` result naming the plugin.
    """


@hookspec
def gateway_after_call(
    call: ToolCall, result: types.CallToolResult
) -> types.CallToolResult | Awaitable[types.CallToolResult | None] | None:
    """Look at (or replace) the result of a tool call before the client gets it.

    Called for every result — from the upstream, including its own error results, or from
    a before-hook — in reverse plugin order, so the first plugin's hooks wrap all others.
    Return a `CallToolResult` to replace the result for the hooks after it and the
    client, or None to keep it. May be a coroutine function. Gateway-made errors do not
    come here: see `gateway_translate_error`.
    """


@hookspec(firstresult=True)
def gateway_translate_error(
    call: ToolCall, error: GatewayError
) -> types.CallToolResult | Awaitable[types.CallToolResult | None] | None:
    """Turn a gateway-made error (`error.code`, `error.message`, `error.server`) into the result the client gets.

    Called when the call chain ends in a `GatewayError` (invalid arguments, upstream
    unavailable, timeout, open breaker, exceeded retries ...). When no plugin returns a
    result, the standard error
    result of docs/errors.md is sent. Plugins are asked in plugin order (as
    `gateway_before_call`): the first that returns a result wins. May be a coroutine function.
    """
