"""Resources as clients see them: lists and templates from the catalog, reads from the owning server,
and subscriptions (`resources/subscribe`, or a 2026-07-28 `subscriptions/listen` stream) taken upstream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.subscriptions import ListenHandler
from mcp.shared.exceptions import MCPError

from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.relay import Interactions, connection_of
from gateway.security.http_guard import forwardable_token, principal_in
from gateway.security.scopes import server_visible, visible
from gateway.serving.connect import caller_account
from gateway.serving.notifications import Notifications
from gateway.serving.pagination import page
from gateway.serving.passthrough import as_protocol_error, forwarded_meta, rename_contents
from gateway.serving.startup import StartupWait
from gateway.upstreams import lean_calls
from gateway.upstreams.upstream import Upstream

__all__ = ["RESOURCE_NOT_FOUND", "ResourceHandlers"]

RESOURCE_NOT_FOUND = -32002
"""The MCP specification's error code for an unknown resource URI."""


class ResourceHandlers:
    """`resources/*` and `subscriptions/listen` for one `GatewayServer`."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        interactions: Interactions,
        notifications: Notifications,
        startup: StartupWait,
        stateless: Callable[[], bool],
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.interactions = interactions
        self.notifications = notifications
        self.startup = startup
        self.stateless = stateless
        self.listen = ListenHandler(notifications.bus)

    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        await self.startup.all_servers()
        principal = principal_in(ctx.request)
        items = [e.item for e in self.registry.catalog.resources.values() if visible(principal, e)]
        resources, cursor = page(items, params, self.settings.page_size)
        return types.ListResourcesResult(resources=resources, next_cursor=cursor)

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        await self.startup.all_servers()
        principal = principal_in(ctx.request)
        items = [e.item for e in self.registry.catalog.templates.values() if visible(principal, e)]
        templates, cursor = page(items, params, self.settings.page_size)
        return types.ListResourceTemplatesResult(resource_templates=templates, next_cursor=cursor)

    def resource(self, uri: str, ctx: ServerRequestContext[Any, Any]) -> tuple[Upstream, str]:
        found = self.registry.resource(uri)
        if found is None or not server_visible(principal_in(ctx.request), found[0].id):
            raise MCPError(RESOURCE_NOT_FOUND, f"Unknown resource {uri!r}.", {"uri": uri})
        return found

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        await self.startup.all_servers()
        upstream, original = self.resource(params.uri, ctx)
        token = forwardable_token(ctx.request)

        async def send(progress: Any) -> Any:
            result = await self.registry.request_as(
                token,
                upstream,
                f"resources/read {params.uri!r}",
                lambda c: lean_calls.read_resource(c, original, meta=forwarded_meta(ctx)),
                account=caller_account(principal_in(ctx.request)),
            )
            return rename_contents(result, original, params.uri, upstream.spec.prefix)

        return await as_protocol_error(self.interactions.run(ctx, params, upstream.id, send), (original, params.uri))

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        await self.startup.all_servers()
        if self.stateless():
            raise MCPError(
                types.INVALID_REQUEST,
                "Resource subscriptions need a session, and this gateway serves stateless HTTP: read the "
                "resource again when you need it, or listen with subscriptions/listen (2026-07-28 clients).",
            )
        upstream, original = self.resource(params.uri, ctx)
        await as_protocol_error(upstream.subscriptions.subscribe(original), (original, params.uri))
        connection = connection_of(ctx)
        if connection is not None:
            self.notifications.subscribe(params.uri, connection)
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        upstream, original = self.resource(params.uri, ctx)
        if self.notifications.unsubscribe(params.uri, connection_of(ctx)):
            await as_protocol_error(upstream.subscriptions.unsubscribe(original))
        return types.EmptyResult()

    async def subscriptions_listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """Serve a 2026-07-28 listen stream; its resource subscriptions are taken upstream too."""
        await self.startup.all_servers()
        principal = principal_in(ctx.request)
        wanted = [(uri, self.registry.resource(uri)) for uri in params.notifications.resource_subscriptions or ()]
        wanted = [(uri, found) for uri, found in wanted if found is None or server_visible(principal, found[0].id)]
        for _uri, found in wanted:
            if found is not None:
                await as_protocol_error(found[0].subscriptions.subscribe(found[1]))
        return await self.listen(ctx, params)
