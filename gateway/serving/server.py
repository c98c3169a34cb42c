"""The downstream MCP server: the one endpoint clients connect to, over stdio or HTTP.

Built on the SDK's low-level `Server`, which speaks both protocol eras: the
handshake era (`initialize`, up to 2025-11-25) and the 2026-07-28 era
(`server/discover`, per-request envelopes). This module wires the handlers, one module per
kind of request: `gateway.serving.tools` (with `gateway.serving.tasks`), `prompts`,
`resources`, `completion`. Change notifications (`gateway.serving.notifications`), requests an
upstream interrupts with questions (`gateway.relay.Interactions`) and the wait for servers
still connecting (`gateway.serving.startup`) have modules of their own.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_dual_era_loop
from mcp.shared.exceptions import MCPDeprecationWarning

from gateway.config.security import AuthConfig, SecurityConfig
from gateway.config.settings import Settings
from gateway.observability.tracing import skip_idle_request_spans
from gateway.registry import ChangeKind, Registry
from gateway.relay import Interactions, connection_of
from gateway.router.service import RouterService
from gateway.serving.completion import Completion
from gateway.serving.exposure import GATEWAY_TOOL_NAMES
from gateway.serving.notifications import Notifications
from gateway.serving.prompts import PromptHandlers
from gateway.serving.resources import ResourceHandlers
from gateway.serving.startup import StartupWait
from gateway.serving.stdio import stdio_streams
from gateway.serving.stdio_lean import StdioLean
from gateway.serving.tools import ToolHandlers
from gateway.upstreams.upstream import cancel_when
from gateway.version import gateway_version

if TYPE_CHECKING:
    from gateway.config.loader import GatewayConfig
    from gateway.records.service import Records
    from gateway.security.vetting import ToolVetter
    from gateway.serving.reload import Reloader
    from gateway.state.deployment import SharedState

__all__ = ["GatewayServer", "serve_stdio"]

logger = logging.getLogger(__name__)

_INSTRUCTIONS = (
    "This endpoint aggregates several MCP servers. Tool and prompt names are "
    "'<server>__<name>'; resource URIs are '<server>+<uri>'."
)


class _GatewayLowLevelServer(Server[Any]):
    """A low-level server whose handshake advertises list_changed for everything we proxy, and
    tasks as far as the gateway can honour them at the time of the handshake (`gateway.serving.tasks`)."""

    tasks_capability: Callable[[], types.ServerTasksCapability | None] = staticmethod(lambda: None)

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        options = super().create_initialization_options(
            notification_options
            or NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True),
            experimental_capabilities,
            extensions,
        )
        options.capabilities.tasks = self.tasks_capability()
        return options


class GatewayServer:
    """The gateway's MCP server, wired to a running `Registry`."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        router: RouterService | None = None,
        *,
        auth: AuthConfig | None = None,
        security: SecurityConfig | None = None,
        records: Records | None = None,
    ) -> None:
        """`records`: record calls and searches, and take feedback (its recorder must be in the
        registry's call chain, `Registry.record_calls`)."""
        self.registry = registry
        self.records = records
        self.settings = settings
        self.router = router
        self.stateless = False
        """True under stateless HTTP (`GATEWAY_HTTP__STATELESS`): every request is its own connection,
        so nothing is kept per session (dynamic lists, call counts, subscriptions)."""
        self.reloader: Reloader | None = None
        """Re-reads the config while serving (`gateway.serving.reload`); set by `mcp-gateway serve`."""
        self.auth = auth or AuthConfig()
        self.security = security or SecurityConfig()
        self.config: GatewayConfig | None = None
        """The loaded config file, for the console (`serve` sets it; masked there before it is shown)."""
        self.vetter: ToolVetter | None = None
        """The tool vetter whose listing filter the registry runs, for the console's approvals (`serve` sets it)."""
        self.shared: SharedState | None = None
        """The deployment's shared state (a database is configured; `serve` sets it): disables, console
        sessions, rate limits, shared with the other replicas (`gateway.serving.replication`)."""
        self.notifications = Notifications(registry.relay)
        self.interactions = Interactions(registry.relay, lambda: registry.task_group, lambda: self.stateless)
        self.startup = StartupWait(registry, settings)
        self.tools = ToolHandlers(
            registry,
            settings,
            router,
            records=records,
            security=self.security,
            interactions=self.interactions,
            notifications=self.notifications,
            startup=self.startup,
            stateless=lambda: self.stateless,
        )
        self.prompts = PromptHandlers(registry, settings, self.interactions, self.startup)
        self.resources = ResourceHandlers(
            registry, settings, self.interactions, self.notifications, self.startup, lambda: self.stateless
        )
        self.completion = Completion(registry, self.startup)
        with warnings.catch_warnings():
            # The handshake era's logging/setLevel is deprecated at 2026-07-28 but still
            # what every 2025-era client sends; the gateway serves both eras.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server = _GatewayLowLevelServer(
                "mcp-gateway",
                version=gateway_version(),
                instructions=_INSTRUCTIONS,
                on_list_tools=self.tools.list_tools,
                on_call_tool=self.tools.call_tool,
                on_list_prompts=self.prompts.list_prompts,
                on_get_prompt=self.prompts.get_prompt,
                on_list_resources=self.resources.list_resources,
                on_list_resource_templates=self.resources.list_resource_templates,
                on_read_resource=self.resources.read_resource,
                on_subscribe_resource=self.resources.subscribe,
                on_unsubscribe_resource=self.resources.unsubscribe,
                on_subscriptions_listen=self.resources.subscriptions_listen,
                on_completion=self.completion.complete,
                on_set_logging_level=self._set_logging_level,
                get_tool_input_schema=self.tools.input_schema,
            )
        skip_idle_request_spans(self.server.middleware)  # the SDK's request spans, only when they can matter
        self.tasks = self.tools.tasks
        self.tasks.install(self.server, self.notifications.notify)
        self.server.tasks_capability = self.tasks.capability
        registry.task_status_listeners.append(self.tasks.on_status)
        if router is not None:
            registry.metrics.watch_router(router.figures)
        # Typed as returning a coroutine; the SDK and the lean paths only await what a layer returns.
        self.server.middleware.append(cast("ServerMiddleware[Any]", self._track_connection))
        self.server.instructions = self._instructions()
        registry.change_listeners.append(self._on_catalog_change)
        registry.resource_listeners.append(self.notifications.resource_updated)
        registry.log_listeners.append(self.notifications.upstream_log)

    # ---- connections and notifications -----------------------------------------

    def _track_connection(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Awaitable[HandlerResult]:
        """Remember handshake-era connections: they get change notifications on their own channel.

        The handshake itself waits (bounded, `startup.HANDSHAKE_WAIT_SECONDS`) for servers still
        connecting, so that the instructions it carries include theirs. Any other request is handed
        on as the rest's own awaitable: no coroutine of this layer's own on every call.
        """
        if ctx.method in ("initialize", "server/discover"):
            return self._handshake(ctx, call_next)
        self.notifications.remember(ctx)
        return call_next(ctx)

    async def _handshake(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        await self.startup.handshake()
        self.notifications.remember(ctx)
        return await call_next(ctx)

    def _instructions(self) -> str:
        """The gateway's own instructions, then each connected server's, under its name."""
        parts = [_INSTRUCTIONS]
        for upstream in self.registry.upstreams.values():
            if upstream.connected and upstream.instructions:
                prefix = f" (tools '{upstream.spec.prefix}__*')" if upstream.spec.prefix else ""
                parts.append(f"## {upstream.id}{prefix}\n{upstream.instructions.strip()}")
        return "\n\n".join(parts)

    async def _on_catalog_change(self, kinds: set[ChangeKind]) -> None:
        self.server.instructions = self._instructions()
        await self.notifications.lists_changed(kinds)

    async def _set_logging_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        connection = connection_of(ctx)
        if connection is not None:
            connection.state["log_level"] = params.level
        return types.EmptyResult()

    # ---- transports ----------------------------------------------------------------

    async def run_stdio(self) -> None:
        # No fixed initialization options: the handshake reads them when it happens, so the
        # instructions include the servers that have connected by then.
        lean = None
        if self.settings.lean_path:  # the hot requests on the gateway's own path (`stdio_lean`)
            lean = StdioLean(self.server, own_tools=GATEWAY_TOOL_NAMES, catalog=self.registry.catalog)
        async with stdio_streams(lean) as (read_stream, write_stream), self.server.lifespan(self.server) as state:
            await serve_dual_era_loop(self.server, read_stream, write_stream, lifespan_state=state)


async def serve_stdio(gateway: GatewayServer, *, stop: anyio.Event) -> None:
    """Serve over stdio until the client closes stdin or `stop` is set."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_when, stop, tg.cancel_scope)
        await gateway.run_stdio()
        tg.cancel_scope.cancel()
