"""`completion/complete`: argument completions for a prompt or resource template, asked of the server that owns it."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError

from gateway.registry import Registry
from gateway.security.http_guard import forwardable_token, principal_in
from gateway.security.scopes import server_visible
from gateway.serving.connect import caller_account
from gateway.serving.passthrough import as_protocol_error
from gateway.serving.startup import StartupWait

__all__ = ["Completion"]


class Completion:
    """`completion/complete` for one `GatewayServer`."""

    def __init__(self, registry: Registry, startup: StartupWait) -> None:
        self.registry = registry
        self.startup = startup

    async def complete(
        self, ctx: ServerRequestContext[Any, Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        await self.startup.all_servers()
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
        return await as_protocol_error(
            self.registry.request_as(
                forwardable_token(ctx.request),
                upstream,
                "completion/complete",
                lambda c: c.session.complete(upstream_ref, argument, context),
                account=caller_account(principal_in(ctx.request)),
            )
        )
