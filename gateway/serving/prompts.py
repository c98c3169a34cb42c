"""Prompts as clients see them: `prompts/list` from the catalog, `prompts/get` from the owning server."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError

from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.relay import Interactions
from gateway.security.http_guard import forwardable_token, principal_in
from gateway.security.scopes import server_visible, visible
from gateway.serving.connect import caller_account
from gateway.serving.pagination import page
from gateway.serving.passthrough import as_protocol_error, expose_block, forwarded_meta
from gateway.serving.startup import StartupWait
from gateway.upstreams import lean_calls

__all__ = ["PromptHandlers"]


class PromptHandlers:
    """`prompts/list` and `prompts/get` for one `GatewayServer`."""

    def __init__(
        self, registry: Registry, settings: Settings, interactions: Interactions, startup: StartupWait
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.interactions = interactions
        self.startup = startup

    async def list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        await self.startup.all_servers()
        principal = principal_in(ctx.request)
        items = [e.item for e in self.registry.catalog.prompts.values() if visible(principal, e)]
        prompts, cursor = page(items, params, self.settings.page_size)
        return types.ListPromptsResult(prompts=prompts, next_cursor=cursor)

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        await self.startup.owner_of(params.name)
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
                lambda c: lean_calls.get_prompt(c, original, params.arguments, meta=forwarded_meta(ctx)),
                account=caller_account(principal_in(ctx.request)),
            )
            messages = [
                m.model_copy(update={"content": expose_block(m.content, upstream.spec.prefix)}) for m in result.messages
            ]
            return result.model_copy(update={"messages": messages})

        return await as_protocol_error(self.interactions.run(ctx, params, upstream.id, send))
