"""The downstream MCP server: the one endpoint clients connect to, over stdio or HTTP.

Built on the SDK's low-level `Server`, which speaks both protocol eras: the
handshake era (`initialize`, up to 2025-11-25) and the 2026-07-28 era
(`server/discover`, per-request envelopes). Handlers look names up in the
registry's catalog and forward the request to the owning upstream. Change
notifications (`gateway.serving.notifications`), requests an upstream interrupts with questions
(`gateway.relay.Interactions`) and MCP tasks (`gateway.serving.tasks`) have modules of their own.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_dual_era_loop
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    ListenHandler,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.config.security import AuthConfig, SecurityConfig
from gateway.config.settings import Settings
from gateway.errors import GatewayError, InvalidArguments, error_result
from gateway.observability.metrics import SearchStatus
from gateway.records.callers import CallerIds
from gateway.records.feedback import FEEDBACK_TOOL, feedback_tool_result
from gateway.records.model import EXECUTION_ID_NOTE, FEEDBACK_TOKEN_META_KEY
from gateway.records.recorder import CLIENT_NOTE, SESSION_NOTE
from gateway.registry import ChangeKind, Registry
from gateway.relay import Interactions, connection_of
from gateway.router.base import SearchHit
from gateway.router.service import RouterService
from gateway.security.http_guard import forwardable_token, principal_in
from gateway.security.limits import cap_result, check_arguments, check_session_calls
from gateway.security.scopes import server_visible, tool_not_found, tool_visible, visible, visible_names
from gateway.serving.exposure import (
    CALL_TOOL,
    GATEWAY_TOOL_NAMES,
    SEARCH_TOOL,
    ArgumentError,
    SessionTools,
    mode_for,
    parse_call_arguments,
    parse_search_arguments,
    tool_payload,
)
from gateway.serving.notifications import Notifications
from gateway.serving.pagination import page
from gateway.serving.passthrough import (
    expose_block,
    expose_result_uris,
    forwarded_meta,
    relayed_error,
    rename_contents,
)
from gateway.serving.tasks import TaskProxy
from gateway.upstreams.upstream import Upstream, cancel_when, gateway_version

if TYPE_CHECKING:
    from gateway.records.service import Records
    from gateway.security.auth import Principal

__all__ = ["GatewayServer", "serve_stdio"]

logger = logging.getLogger(__name__)

_INSTRUCTIONS = (
    "This endpoint aggregates several MCP servers. Tool and prompt names are "
    "'<server>__<name>'; resource URIs are '<server>+<uri>'."
)
RESOURCE_NOT_FOUND = -32002
"""The MCP specification's error code for an unknown resource URI."""


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
        self.callers = CallerIds()
        self.settings = settings
        self.router = router
        self.stateless = False
        """True under stateless HTTP (`GATEWAY_HTTP__STATELESS`): every request is its own connection,
        so nothing is kept per session (dynamic lists, call counts, subscriptions)."""
        self.auth = auth or AuthConfig()
        self.security = security or SecurityConfig()
        self._session_calls: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._session_tools: weakref.WeakKeyDictionary[Any, SessionTools] = weakref.WeakKeyDictionary()
        self.notifications = Notifications(registry.relay)
        self.interactions = Interactions(registry.relay, lambda: registry.task_group, lambda: self.stateless)
        self._listen = ListenHandler(self.notifications.bus)
        self._all_settled = False
        with warnings.catch_warnings():
            # The handshake era's logging/setLevel is deprecated at 2026-07-28 but still
            # what every 2025-era client sends; the gateway serves both eras.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server = _GatewayLowLevelServer(
                "mcp-gateway",
                version=gateway_version(),
                instructions=_INSTRUCTIONS,
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_list_prompts=self._list_prompts,
                on_get_prompt=self._get_prompt,
                on_list_resources=self._list_resources,
                on_list_resource_templates=self._list_resource_templates,
                on_read_resource=self._read_resource,
                on_subscribe_resource=self._subscribe,
                on_unsubscribe_resource=self._unsubscribe,
                on_subscriptions_listen=self._subscriptions_listen,
                on_completion=self._complete,
                on_set_logging_level=self._set_logging_level,
            )
        self.tasks = TaskProxy(registry, self._prepare_call, lambda: self.stateless)
        self.tasks.install(self.server, self.notifications.notify)
        self.server.tasks_capability = self.tasks.capability
        registry.task_status_listeners.append(self.tasks.on_status)
        if router is not None:
            registry.metrics.watch_router(router.figures)
        self.server.middleware.append(self._track_connection)
        self.server.instructions = self._instructions()
        registry.change_listeners.append(self._on_catalog_change)
        registry.resource_listeners.append(self.notifications.resource_updated)
        registry.log_listeners.append(self.notifications.upstream_log)

    # ---- connections and notifications -----------------------------------------

    async def _track_connection(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Remember handshake-era connections: they get change notifications on their own channel.

        The handshake itself waits (bounded) for servers still connecting, so that the
        instructions it carries include theirs.
        """
        if ctx.method in ("initialize", "server/discover"):
            await self._settled()
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

    async def _settled(self) -> None:
        """Let a list request made right after start-up wait (bounded) for servers still connecting.

        The gateway serves at once; a server that connects later is announced with
        list_changed. The short wait spares clients that list once and never listen.
        """
        if not self._all_settled:
            await self.registry.wait_settled(self.settings.list_wait)
            self._all_settled = all(u.settled for u in self.registry.upstreams.values())

    async def _owner_settled(self, name: str) -> None:
        """Before resolving a name at start-up, wait for the server it belongs to to connect.

        A client may call a tool it knows from an earlier session before listing; that
        call should reach the server once it is up, not fail because it is still starting.
        """
        if self._all_settled or name in self.registry.catalog.tools or name in self.registry.catalog.prompts:
            return
        owner = self.registry.owner_of(name)
        if owner is None:
            await self._settled()
        elif not owner.settled:
            with anyio.move_on_after(self.settings.startup_timeout):
                await owner.wait_settled()

    # ---- tools ----------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await self._settled()
        tools, cursor = page(self._visible_tools(ctx), params, self.settings.page_size)
        return types.ListToolsResult(tools=tools, next_cursor=cursor)

    def _visible_tools(self, ctx: ServerRequestContext[Any, Any]) -> list[types.Tool]:
        """What `tools/list` shows this client, by exposure mode (see `gateway.serving.exposure`)."""
        principal = principal_in(ctx.request)
        catalog = {n: e for n, e in self.registry.catalog.tools.items() if visible(principal, e)}
        usable = self.tasks.usable(ctx)
        self.tasks.note_hidden(ctx, [n for n, e in catalog.items() if not usable(e.item)])
        catalog = {n: e for n, e in catalog.items() if usable(e.item)}
        mode = mode_for(ctx.request, self.settings.routing.mode)
        own = [FEEDBACK_TOOL] if self.records is not None and FEEDBACK_TOOL.name not in catalog else []
        if mode == "all":
            return [e.item for e in catalog.values()] + own
        names = list(dict.fromkeys(self.settings.routing.pinned))
        if mode == "dynamic":
            found = self._session_tools.get(connection_of(ctx))
            names += [n for n in (found.names() if found else ()) if n not in names]
        return [SEARCH_TOOL, CALL_TOOL, *own] + [catalog[n].item for n in names if n in catalog]

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        notes: dict[str, Any] = {}
        if params.name in GATEWAY_TOOL_NAMES and params.name not in self.registry.catalog.tools:
            try:
                return await self._gateway_tool(ctx, params)
            except GatewayError as exc:
                return error_result(exc)
        try:
            if self.records is not None:
                notes[SESSION_NOTE], notes[CLIENT_NOTE] = self.callers.of(ctx, stateless=self.stateless)
            await self._prepare_call(ctx, params)
            upstream, entry = self.registry.tool(params.name)
            self.tasks.check_callable(ctx, params.name, entry.item)
            token = forwardable_token(ctx.request)

            async def send(progress: Any) -> Any:
                result = await self.registry.call_tool(
                    params.name,
                    params.arguments,
                    progress=progress,
                    meta=forwarded_meta(ctx),
                    caller_token=token,
                    notes=notes,
                )
                capped = cap_result(expose_result_uris(result, upstream.spec.prefix), self.security.limits)
                return _with_feedback_token(capped, notes)

            return await self.interactions.run(ctx, params, upstream.id, send)
        except MCPError as exc:  # a protocol error the upstream sent stays one
            raise relayed_error(exc) from None
        except GatewayError as exc:
            if self.records is not None and EXECUTION_ID_NOTE not in notes:  # refused before the call chain
                owner = self.registry.owner_of(params.name)
                notes[EXECUTION_ID_NOTE] = self.records.record_refused(
                    params.name,
                    owner.id if owner is not None else None,
                    params.arguments,
                    exc,
                    session_id=notes.get(SESSION_NOTE),
                    client_id=notes.get(CLIENT_NOTE),
                )
            return _with_feedback_token(error_result(exc), notes)

    async def _prepare_call(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> None:
        """Before a call goes upstream (as a task too): wait for its server at start-up, then check it."""
        await self._owner_settled(params.name)
        self._check_call(ctx, params)

    def _check_call(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> None:
        """Scope, session call count and argument size, before the call goes upstream (`gateway.security.scopes`,
        `gateway.security.limits`)."""
        principal = principal_in(ctx.request)
        tools = self.registry.catalog.tools
        entry = tools.get(params.name)
        owner = self.registry.owner_of(params.name)
        if entry is not None:
            hidden = not visible(principal, entry)
        elif owner is not None:  # a server that is down, or a withheld tool: may this caller know of it?
            hidden = not tool_visible(principal, owner.id, params.name)
        else:
            hidden = True  # unknown: the same error, with hints from what this caller may see
        if hidden:
            raise tool_not_found(params.name, visible_names(principal, tools))
        connection = connection_of(ctx)
        if connection is not None and not self.stateless:
            made = self._session_calls[connection] = self._session_calls.get(connection, 0) + 1
            check_session_calls(made, self.security.limits)
        check_arguments(params.arguments, self.security.limits)

    async def _gateway_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """`search_tools` and `call_tool`, the gateway's own tools in search and dynamic modes."""
        try:
            if params.name == CALL_TOOL.name:
                name, arguments = parse_call_arguments(params.arguments)
                return await self._call_tool(ctx, params.model_copy(update={"name": name, "arguments": arguments}))
            if params.name == FEEDBACK_TOOL.name:
                return await feedback_tool_result(self.records, params.arguments, ctx.request)
            query, limit = parse_search_arguments(params.arguments, self.settings.routing.k)
        except ArgumentError as exc:
            return error_result(InvalidArguments(str(exc)))
        session_id, _ = self.callers.of(ctx, stateless=self.stateless)
        principal, usable = principal_in(ctx.request), self.tasks.usable(ctx)
        hits = await self.search(query, limit, principal, session_id=session_id, usable=usable)
        if mode_for(ctx.request, self.settings.routing.mode) == "dynamic" and not self.stateless:
            await self._grow_session(ctx, [h.name for h in hits])
        payload = [tool_payload(hit) for hit in hits]
        text = json.dumps(payload, ensure_ascii=False) if payload else f"No tool matches {query!r}."
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content={"tools": payload}
        )

    async def search(
        self,
        query: str,
        limit: int,
        principal: Principal | None = None,
        *,
        session_id: str | None = None,
        usable: Callable[[types.Tool], bool] | None = None,
    ) -> list[SearchHit]:
        """Rank the catalog for a query, and log it as one line (no query text: it may be private).

        Only what `principal` may see, and what `usable` keeps (tools the client can run), is
        ranked: the router is asked for as many more results as there are hidden tools, and
        the hidden ones are dropped. With records on, the search is recorded, and calls of its
        tools by the same session or caller are tied to it.
        """
        if self.router is None:
            raise GatewayError("Tool search is not available on this gateway.")
        started = time.perf_counter()
        tools = self.registry.catalog.tools
        shown = {n for n in visible_names(principal, tools) if usable is None or usable(tools[n].item)}
        hidden = len(tools) - len(shown)
        status: SearchStatus = "error"
        try:
            hits = await self.router.search(query, limit + hidden, self.settings.routing.threshold)
            if hidden:
                hits = [h for h in hits if h.name in shown][:limit]
            status = "success"
        except TimeoutError:
            status = "timeout"
            raise GatewayError(
                f"Tool search took longer than {self.settings.routing.search_timeout:g} s; try again."
            ) from None
        finally:
            self.registry.metrics.observe_search(status, time.perf_counter() - started)
        elapsed_ms = (time.perf_counter() - started) * 1000
        logger.info("search query_chars=%d results=%d ms=%.1f", len(query), len(hits), elapsed_ms)
        if self.records is not None:
            client_id = principal.name if principal is not None else None
            names = [hit.name for hit in hits]
            self.records.record_search(query, names, elapsed_ms, session_id=session_id, client_id=client_id)
        return hits

    async def _grow_session(self, ctx: ServerRequestContext[Any, Any], names: list[str]) -> None:
        """dynamic mode: add found tools to this session's list and tell the client."""
        connection = connection_of(ctx)
        if connection is None:
            return
        found = self._session_tools.get(connection)
        if found is None:
            found = self._session_tools[connection] = SessionTools(self.settings.routing.dynamic_max_tools)
        if found.add(names):
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                await self.notifications.bus.publish(ToolsListChanged())
            else:
                await self.notifications.notify(connection, "notifications/tools/list_changed", None)

    # ---- prompts ----------------------------------------------------------------

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        await self._settled()
        principal = principal_in(ctx.request)
        items = [e.item for e in self.registry.catalog.prompts.values() if visible(principal, e)]
        prompts, cursor = page(items, params, self.settings.page_size)
        return types.ListPromptsResult(prompts=prompts, next_cursor=cursor)

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        await self._owner_settled(params.name)
        found = self.registry.prompt(params.name)
        if found is None or not server_visible(principal_in(ctx.request), found[0].id):
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt {params.name!r}.")
        upstream, original = found
        token = forwardable_token(ctx.request)

        async def send(progress: Any) -> Any:
            result = await self.registry.request_as(
                token,
                upstream,
                f"prompts/get {params.name!r}",
                lambda c: c.get_prompt(original, params.arguments, meta=forwarded_meta(ctx)),
            )
            messages = [
                m.model_copy(update={"content": expose_block(m.content, upstream.spec.prefix)}) for m in result.messages
            ]
            return result.model_copy(update={"messages": messages})

        return await self._as_protocol_error(self.interactions.run(ctx, params, upstream.id, send))

    # ---- resources ----------------------------------------------------------------

    async def _list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        await self._settled()
        principal = principal_in(ctx.request)
        items = [e.item for e in self.registry.catalog.resources.values() if visible(principal, e)]
        resources, cursor = page(items, params, self.settings.page_size)
        return types.ListResourcesResult(resources=resources, next_cursor=cursor)

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        await self._settled()
        principal = principal_in(ctx.request)
        items = [e.item for e in self.registry.catalog.templates.values() if visible(principal, e)]
        templates, cursor = page(items, params, self.settings.page_size)
        return types.ListResourceTemplatesResult(resource_templates=templates, next_cursor=cursor)

    def _resource(self, uri: str, ctx: ServerRequestContext[Any, Any]) -> tuple[Upstream, str]:
        found = self.registry.resource(uri)
        if found is None or not server_visible(principal_in(ctx.request), found[0].id):
            raise MCPError(RESOURCE_NOT_FOUND, f"Unknown resource {uri!r}.", {"uri": uri})
        return found

    async def _read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        await self._settled()
        upstream, original = self._resource(params.uri, ctx)
        token = forwardable_token(ctx.request)

        async def send(progress: Any) -> Any:
            result = await self.registry.request_as(
                token,
                upstream,
                f"resources/read {params.uri!r}",
                lambda c: c.read_resource(original, meta=forwarded_meta(ctx), cache_mode="bypass"),
            )
            return rename_contents(result, original, params.uri, upstream.spec.prefix)

        return await self._as_protocol_error(
            self.interactions.run(ctx, params, upstream.id, send), (original, params.uri)
        )

    async def _subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        await self._settled()
        if self.stateless:
            raise MCPError(
                types.INVALID_REQUEST,
                "Resource subscriptions need a session, and this gateway serves stateless HTTP: read the "
                "resource again when you need it, or listen with subscriptions/listen (2026-07-28 clients).",
            )
        upstream, original = self._resource(params.uri, ctx)
        await self._as_protocol_error(upstream.subscribe(original), (original, params.uri))
        connection = connection_of(ctx)
        if connection is not None:
            self.notifications.subscribe(params.uri, connection)
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        upstream, original = self._resource(params.uri, ctx)
        if self.notifications.unsubscribe(params.uri, connection_of(ctx)):
            await self._as_protocol_error(upstream.unsubscribe(original))
        return types.EmptyResult()

    async def _subscriptions_listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """Serve a 2026-07-28 listen stream; its resource subscriptions are taken upstream too."""
        await self._settled()
        principal = principal_in(ctx.request)
        wanted = [(uri, self.registry.resource(uri)) for uri in params.notifications.resource_subscriptions or ()]
        wanted = [(uri, found) for uri, found in wanted if found is None or server_visible(principal, found[0].id)]
        for _uri, found in wanted:
            if found is not None:
                await self._as_protocol_error(found[0].subscribe(found[1]))
        return await self._listen(ctx, params)

    # ---- completion and logging ---------------------------------------------------

    async def _complete(
        self, ctx: ServerRequestContext[Any, Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        await self._settled()
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            found = self.registry.prompt(ref.name)
            if found is None or not server_visible(principal_in(ctx.request), found[0].id):
                raise MCPError(types.INVALID_PARAMS, f"Unknown prompt {ref.name!r}.")
            upstream, original = found
            upstream_ref: types.PromptReference | types.ResourceTemplateReference = ref.model_copy(
                update={"name": original}
            )
        else:
            found = self.registry.template(ref.uri)
            if found is None or not server_visible(principal_in(ctx.request), found[0].id):
                raise MCPError(types.INVALID_PARAMS, f"Unknown resource template {ref.uri!r}.")
            upstream, original = found
            upstream_ref = ref.model_copy(update={"uri": original})
        context = params.context.arguments if params.context is not None else None
        argument = {"name": params.argument.name, "value": params.argument.value}
        return await self._as_protocol_error(
            self.registry.request_as(
                forwardable_token(ctx.request),
                upstream,
                "completion/complete",
                lambda c: c.session.complete(upstream_ref, argument, context),
            )
        )

    async def _set_logging_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        connection = connection_of(ctx)
        if connection is not None:
            connection.state["log_level"] = params.level
        return types.EmptyResult()

    # ---- shared machinery ---------------------------------------------------------

    async def _as_protocol_error(self, awaitable: Awaitable[Any], renamed: tuple[str, str] | None = None) -> Any:
        """Outside tools/call there is no error result: gateway errors become JSON-RPC errors, and the
        upstream's own pass as `relayed_error`s (`renamed`: its URI and the one the client sent)."""
        try:
            return await awaitable
        except MCPError as exc:
            raise relayed_error(exc, renamed) from None
        except GatewayError as exc:
            raise MCPError(types.INTERNAL_ERROR, exc.message, {"code": exc.code, "server": exc.server}) from None

    # ---- transports ----------------------------------------------------------------

    async def run_stdio(self) -> None:
        # No fixed initialization options: the handshake reads them when it happens, so the
        # instructions include the servers that have connected by then.
        async with stdio_server() as (read_stream, write_stream), self.server.lifespan(self.server) as state:
            await serve_dual_era_loop(self.server, read_stream, write_stream, lifespan_state=state)


def _with_feedback_token(result: Any, notes: dict[str, Any]) -> Any:
    """A recorded call's result carries its execution id, the token to rate it with."""
    execution_id = notes.get(EXECUTION_ID_NOTE)
    if execution_id is None or not isinstance(result, types.CallToolResult):
        return result
    return result.model_copy(update={"meta": {**(result.meta or {}), FEEDBACK_TOKEN_META_KEY: execution_id}})


async def serve_stdio(gateway: GatewayServer, *, stop: anyio.Event) -> None:
    """Serve over stdio until the client closes stdin or `stop` is set."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_when, stop, tg.cancel_scope)
        await gateway.run_stdio()
        tg.cancel_scope.cancel()
