"""Tools as clients see them: `tools/list` by exposure mode, `tools/call` through the registry's
call chain, and the gateway's own tools (`search_tools`, `call_tool`, `submit_feedback`, and code
mode's `describe_tools` and `execute`, run by `gateway.codemode`).

What a caller may call is checked by the call chain's admission layers (`gateway.calls.access`,
`gateway.calls.limits`, `gateway.calls.runnable`), which this installs in the registry's chain;
task-augmented calls go to `gateway.serving.tasks`, which passes the same layers first.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.calls.chain import Caller
from gateway.catalog import Entry
from gateway.codemode import CodeArgumentError, CodeMode, parse_names, parse_program
from gateway.config.security import SecurityConfig
from gateway.config.settings import Settings
from gateway.errors import GatewayError, InvalidArguments, error_result
from gateway.observability import tracing
from gateway.observability.metrics import SearchStatus
from gateway.records.callers import CallerIds, client_label
from gateway.records.feedback import FEEDBACK_TOOL, feedback_tool_result
from gateway.records.model import EXECUTION_ID_NOTE, FEEDBACK_TOKEN_META_KEY, PARENT_NOTE
from gateway.records.recorder import CLIENT_LABEL_NOTE, CLIENT_NOTE, SESSION_NOTE
from gateway.registry import Registry
from gateway.relay import Interactions, connection_of
from gateway.router.base import SearchHit
from gateway.router.query import cut_query
from gateway.router.second_stage import Routing, SecondStage
from gateway.router.service import RouterService
from gateway.security.http_guard import current_principal, forwardable_token, principal_in
from gateway.security.limits import cap_result
from gateway.security.scopes import visible, visible_names
from gateway.serving.exposure import (
    CALL_TOOL,
    CODE_SEARCH_TOOL,
    DESCRIBE_TOOLS,
    EXECUTE,
    GATEWAY_TOOL_NAMES,
    NO_TOOL_FITS,
    SEARCH_TOOL,
    ArgumentError,
    SessionTools,
    Shown,
    mode_for,
    parse_call_arguments,
    parse_search_arguments,
    resolve_mode,
    tool_payload,
)
from gateway.serving.notifications import Notifications
from gateway.serving.pagination import page
from gateway.serving.passthrough import expose_result_uris, forwarded_meta, relayed_error
from gateway.serving.sampling_judge import sampling_ask
from gateway.serving.startup import StartupWait
from gateway.serving.tasks import TaskProxy
from gateway.serving.write_confirm import write_confirmation

if TYPE_CHECKING:
    from gateway.records.service import Records
    from gateway.security.auth import Principal
    from gateway.serving.connect import Connector

__all__ = ["ToolHandlers"]

logger = logging.getLogger("gateway.serving.server")


class ToolHandlers:
    """`tools/list`, `tools/call` and tool search for one `GatewayServer`."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        router: RouterService | None,
        *,
        records: Records | None,
        security: SecurityConfig,
        interactions: Interactions,
        notifications: Notifications,
        startup: StartupWait,
        stateless: Callable[[], bool],
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.router = router
        self.records = records
        self.security = security
        self.interactions = interactions
        self.notifications = notifications
        self.startup = startup
        self.stateless = stateless
        """Whether every request is its own connection (stateless HTTP): then nothing is kept per session."""
        self.callers = CallerIds()
        self.tasks = TaskProxy(registry, self.prepare_call, stateless)
        self.second_stage = SecondStage(settings.second_stage, settings.routing.no_fit_threshold)
        registry.check_calls(security.limits)
        """Task-augmented calls (`gateway.serving.tasks`), checked as other calls are (`prepare_call`)."""
        self._session_tools: weakref.WeakKeyDictionary[Any, SessionTools] = weakref.WeakKeyDictionary()
        self.links: Connector | None = None
        """Per-user OAuth links (`gateway.serving.connect`), over HTTP only: set by the HTTP app."""
        self.code = CodeMode(settings.codemode, lambda: registry.task_group)
        """Code mode's sandbox pool (started on the first program) and write gate."""

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await self.startup.all_servers()
        tools, cursor = page(self.visible_tools(ctx), params, self.settings.page_size)
        return types.ListToolsResult(tools=tools, next_cursor=cursor)

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The inputSchema a `tools/call`'s `Mcp-Param-*` headers are checked against (2026-07-28 HTTP).

        Without it the SDK finds the schema by running `tools/list` on every call with arguments,
        serializing the whole catalog each time (most of a proxied call's CPU); this looks the
        name up instead, among the tools this caller may see (None: not checked, and the call
        itself meets the usual refusal)."""
        entry = self.registry.catalog.tools.get(name)
        if entry is not None:
            return entry.item.input_schema if visible(current_principal(), entry) else None
        own = {tool.name: tool for tool in (SEARCH_TOOL, CALL_TOOL, FEEDBACK_TOOL, DESCRIBE_TOOLS, EXECUTE)}.get(name)
        return own.input_schema if own is not None else None

    def visible_tools(self, ctx: ServerRequestContext[Any, Any]) -> list[types.Tool]:
        """What `tools/list` shows this client, by exposure mode (see `gateway.serving.exposure`)."""
        catalog = self.offered(ctx)
        mode = self.mode(ctx, len(catalog))
        own = [FEEDBACK_TOOL] if self.records is not None and FEEDBACK_TOOL.name not in catalog else []
        if mode == "all":
            return [e.item for e in catalog.values()] + own
        if mode == "code":
            return [CODE_SEARCH_TOOL, DESCRIBE_TOOLS, EXECUTE, *own]
        names = list(dict.fromkeys(self.settings.routing.pinned))
        if mode == "dynamic":
            found = self._session_tools.get(connection_of(ctx))
            names += [n for n in (found.names() if found else ()) if n not in names]
        return [SEARCH_TOOL, CALL_TOOL, *own] + [catalog[n].item for n in names if n in catalog]

    def mode(self, ctx: ServerRequestContext[Any, Any], visible_tools: int | None = None) -> Shown:
        """This request's exposure mode, `auto` resolved by the number of tools the client may see."""
        mode = mode_for(ctx.request, self.settings.routing.mode)
        if mode == "auto" and visible_tools is None:
            visible_tools = len(self.offered(ctx))
        return resolve_mode(mode, visible_tools or 0, self.settings.routing.auto_max_tools)

    def offered(self, ctx: ServerRequestContext[Any, Any]) -> dict[str, Entry[types.Tool]]:
        """The catalog's tools this client may see and can run (those needing tasks it cannot run are
        hidden, which is logged once per session)."""
        principal, usable = principal_in(ctx.request), self.tasks.usable(ctx)
        seen = {n: e for n, e in self.registry.catalog.tools.items() if visible(principal, e)}
        self.tasks.note_hidden(ctx, [n for n, e in seen.items() if not usable(e.item)])
        return {n: e for n, e in seen.items() if usable(e.item)}

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        notes: dict[str, Any] = {}
        if params.name in GATEWAY_TOOL_NAMES and params.name not in self.registry.catalog.tools:
            try:
                return await self.gateway_tool(ctx, params)
            except GatewayError as exc:
                return error_result(exc)
        try:
            if self.records is not None:
                notes[SESSION_NOTE], notes[CLIENT_NOTE] = self.callers.of(ctx, stateless=self.stateless())
                notes[CLIENT_LABEL_NOTE] = client_label(ctx)
            await self.startup.owner_of(params.name)
            upstream = self.registry.server_of(params.name)
            token = forwardable_token(ctx.request)

            async def send(progress: Any) -> Any:
                result = await self.registry.call_tool(
                    params.name,
                    params.arguments,
                    progress=progress,
                    meta=forwarded_meta(ctx),
                    caller_token=token,
                    notes=notes,
                    caller=self.caller(ctx),
                )
                prefix = upstream.spec.prefix if upstream is not None else ""
                capped = cap_result(expose_result_uris(result, prefix), self.security.limits)
                return _with_feedback_token(capped, notes)

            # A refused call (scope, limits, a server that is down...) is refused by the call chain's
            # admission layers, and recorded there as every other call is.
            return await self.interactions.run(ctx, params, upstream.id if upstream is not None else "", send)
        except MCPError as exc:  # a protocol error the upstream sent stays one
            raise relayed_error(exc) from None
        except GatewayError as exc:
            if self.links is not None:  # a per-user OAuth server the caller has not linked: the link
                answer = await self.links.for_error(exc, ctx.request, ctx.session.client_capabilities)
                if isinstance(answer, MCPError):
                    raise answer from None
                exc = answer if isinstance(answer, GatewayError) else exc
            return _with_feedback_token(error_result(exc), notes)

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """Who makes this request, for the call chain's admission layers (scope, limits, tasks)."""
        connection = None if self.stateless() else connection_of(ctx)
        return Caller(principal=principal_in(ctx.request), connection=connection, can_run=self.tasks.usable(ctx))

    async def prepare_call(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> None:
        """Before a task-augmented call goes upstream: wait for its server at start-up, then pass the
        call chain's admission layers (the rest of the chain does not run for a task)."""
        await self.startup.owner_of(params.name)
        await self.registry.admit(params.name, params.arguments, self.caller(ctx))

    async def gateway_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """`search_tools` and `call_tool`, the gateway's own tools in search and dynamic modes, and
        `describe_tools` and `execute` in code mode."""
        try:
            if params.name in (DESCRIBE_TOOLS.name, EXECUTE.name):
                return await self.code_tool(ctx, params)
            if params.name == CALL_TOOL.name:
                name, arguments = parse_call_arguments(params.arguments)
                return await self.call_tool(ctx, params.model_copy(update={"name": name, "arguments": arguments}))
            if params.name == FEEDBACK_TOOL.name:
                return await feedback_tool_result(self.records, params.arguments, ctx.request)
            query, limit = parse_search_arguments(params.arguments, self.settings.routing.k)
        except (ArgumentError, CodeArgumentError) as exc:
            return error_result(InvalidArguments(str(exc)))
        query = cut_query(query, self.settings.routing.max_query_chars)
        session_id, _ = self.callers.of(ctx, stateless=self.stateless())
        principal, usable = principal_in(ctx.request), self.tasks.usable(ctx)
        routing = await self.route(query, limit, principal, ctx, session_id=session_id, usable=usable)
        hits = routing.hits
        code = self.mode(ctx) == "code"
        payload = [tool_payload(hit, code=code) for hit in hits]
        if hits and not routing.fits:
            text = f"{NO_TOOL_FITS} The closest tools, as hints only: {json.dumps(payload, ensure_ascii=False)}"
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)],
                structured_content={"tools": [], "no_tool_fits": True, "hints": payload},
            )
        if self.mode(ctx) == "dynamic" and not self.stateless():
            await self.grow_session(ctx, [h.name for h in hits])
        text = json.dumps(payload, ensure_ascii=False) if payload else f"No tool matches {query!r}."
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content={"tools": payload}
        )

    async def code_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """`describe_tools` and `execute`, for a client in code mode (`gateway.codemode`)."""
        if self.mode(ctx) != "code":
            raise ArgumentError(
                f"{params.name} is a code-mode tool: connect in code mode (?mode=code on the HTTP URL, "
                "or GATEWAY_ROUTING__MODE=code) to use it."
            )
        await self.startup.all_servers()  # at start-up, a program sees the servers still connecting too
        offered = {name: entry.item for name, entry in self.offered(ctx).items()}
        if params.name == DESCRIBE_TOOLS.name:
            return self.code.describe(parse_names(params.arguments), offered)
        program = parse_program(params.arguments)
        run_id = self.code.new_run_id()
        caller, token = self.caller(ctx), forwardable_token(ctx.request)
        session_id, client_id = (
            self.callers.of(ctx, stateless=self.stateless()) if self.records is not None else (None, None)
        )

        async def call(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
            """One inner call: the same chain as a client's call, made by the caller of `execute`."""
            notes: dict[str, Any] = {PARENT_NOTE: run_id, SESSION_NOTE: session_id, CLIENT_NOTE: client_id}
            await self.startup.owner_of(name)
            # Its own span, a child of the execute request's: the call chain annotates the current span.
            with tracing.child_span(f"tools/call {name}", {"mcp_gateway.codemode.run_id": run_id}):
                result = await self.registry.call_tool(name, arguments, caller_token=token, notes=notes, caller=caller)
            upstream = self.registry.server_of(name)
            prefix = upstream.spec.prefix if upstream is not None else ""
            capped: types.CallToolResult = cap_result(expose_result_uris(result, prefix), self.security.limits)
            return capped

        at, started = time.time(), time.perf_counter()
        confirm = write_confirmation(ctx, self.settings.codemode.confirm_seconds)
        result, _ = await self.code.execute(program, offered, call, confirm=confirm)
        if self.records is None:
            return result
        latency_ms = (time.perf_counter() - started) * 1000
        self.records.record_run(run_id, at, program, result, latency_ms, session_id=session_id, client_id=client_id)
        with_token: types.CallToolResult = _with_feedback_token(result, {EXECUTION_ID_NOTE: run_id})
        return with_token

    async def route(
        self,
        query: str,
        limit: int,
        principal: Principal | None = None,
        ctx: ServerRequestContext[Any, Any] | None = None,
        *,
        session_id: str | None = None,
        usable: Callable[[types.Tool], bool] | None = None,
    ) -> Routing:
        """`search`, then the second stage (`GATEWAY_SECOND_STAGE__*`, judged by the client's own model
        through sampling when `ctx`'s client offers it): the tools and whether any fits."""
        hits = await self.search(
            query, self.second_stage.wanted(limit), principal, session_id=session_id, usable=usable
        )
        return await self.second_stage.refine(query, hits, limit, sampling_ask(ctx))

    def fits(self, hits: list[SearchHit]) -> bool:
        """False when the best result scores under `routing.no_fit_threshold`: no tool fits the request."""
        return bool(hits) and hits[0].score >= self.settings.routing.no_fit_threshold

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
        query = cut_query(query, self.settings.routing.max_query_chars)  # before any work proportional to it
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

    async def grow_session(self, ctx: ServerRequestContext[Any, Any], names: list[str]) -> None:
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


def _with_feedback_token(result: Any, notes: dict[str, Any]) -> Any:
    """A recorded call's result carries its execution id, the token to rate it with."""
    execution_id = notes.get(EXECUTION_ID_NOTE)
    if execution_id is None or not isinstance(result, types.CallToolResult):
        return result
    return result.model_copy(update={"meta": {**(result.meta or {}), FEEDBACK_TOKEN_META_KEY: execution_id}})
