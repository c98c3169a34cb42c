"""The requests a server sends the gateway (sampling, elicitation, roots), as SDK client callbacks.

The gateway has no model, user or roots of its own: each request goes to `ask`, which carries
it to the downstream request that caused it (`gateway.relay`), and its answer goes back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext

__all__ = ["Ask", "relay_callbacks"]

Ask = Callable[[types.InputRequest], Awaitable[types.InputResponse | types.ErrorData]]
"""Carries one server-to-client request to whoever can answer it."""


def relay_callbacks(ask: Ask) -> dict[str, Any]:
    """The SDK `Client`'s sampling, elicitation and roots callbacks, each answered through `ask`."""

    async def sampling(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        response = await ask(types.CreateMessageRequest(params=params))
        assert isinstance(response, types.CreateMessageResult | types.ErrorData)
        return response

    async def elicitation(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        response = await ask(types.ElicitRequest(params=params))
        assert isinstance(response, types.ElicitResult | types.ErrorData)
        return response

    async def list_roots(context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        response = await ask(types.ListRootsRequest())
        assert isinstance(response, types.ListRootsResult | types.ErrorData)
        return response

    return {"sampling_callback": sampling, "elicitation_callback": elicitation, "list_roots_callback": list_roots}
