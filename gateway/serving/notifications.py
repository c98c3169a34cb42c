"""What the gateway tells its clients without being asked: list changes, resource updates, log lines.

Each goes on the channels of both protocol eras: a `subscriptions/listen` stream (the
`bus`) for 2026-07-28 clients, and the connection itself for handshake-era clients,
which are remembered when they make a request. An upstream's log line goes only to
the client it concerns (see `upstream_log`); a resource update only to the clients
that subscribed to that resource.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.relay import Relay, connection_of

__all__ = ["Notifications"]

logger = logging.getLogger(__name__)

_LEVELS: list[types.LoggingLevel] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


class Notifications:
    """The clients to notify, and how."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.bus = InMemorySubscriptionBus()
        self.connections: weakref.WeakSet[Any] = weakref.WeakSet()
        """Handshake-era client connections: they get notifications on their own channel."""
        self.subscribers: dict[str, weakref.WeakSet[Any]] = {}
        """Exposed resource URI -> the handshake-era connections subscribed to it."""

    def remember(self, ctx: ServerRequestContext[Any, Any]) -> None:
        """Note the connection of a handshake-era request (on every request: one dropped after a failed
        notification comes back with its next request). Looked up before it is added: a lookup makes
        no new weak reference, an addition one with a callback."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            connection = connection_of(ctx)
            if connection is not None and connection not in self.connections:
                self.connections.add(connection)

    async def lists_changed(self, kinds: set[str]) -> None:
        """`tools`, `prompts` and/or `resources` changed."""
        events: dict[str, ServerEvent] = {
            "tools": ToolsListChanged(),
            "prompts": PromptsListChanged(),
            "resources": ResourcesListChanged(),
        }
        for kind in sorted(kinds):
            await self.bus.publish(events[kind])
            for connection in list(self.connections):
                await self.notify(connection, f"notifications/{kind}/list_changed", None)

    async def resource_updated(self, uri: str) -> None:
        await self.bus.publish(ResourceUpdated(uri=uri))
        for connection in list(self.subscribers.get(uri, ())):
            await self.notify(connection, "notifications/resources/updated", {"uri": uri})

    def subscribe(self, uri: str, connection: Any) -> None:
        self.subscribers.setdefault(uri, weakref.WeakSet()).add(connection)

    def unsubscribe(self, uri: str, connection: Any) -> bool:
        """Forget one subscriber; True when none is left (the upstream subscription can go)."""
        subscribers = self.subscribers.get(uri)
        if subscribers is not None and connection is not None:
            subscribers.discard(connection)
        if subscribers:
            return False
        self.subscribers.pop(uri, None)
        return True

    async def upstream_log(self, server_id: str, params: types.LoggingMessageNotificationParams) -> None:
        """Forward a log message to the client it concerns, and never to another one.

        Inside a request it goes to that request. Outside of any request it goes to the
        client only when exactly one handshake-era client is connected (the desktop
        case); with several, an upstream's log lines stay in the gateway's own log.
        """
        logger_name = f"{server_id}/{params.logger}" if params.logger else server_id
        scope = self.relay.find(server_id)
        if scope is not None:
            ctx = scope.exchange.ctx if scope.exchange is not None and scope.exchange.ctx else scope.ctx
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    await ctx.session.send_log_message(params.level, params.data, logger_name, ctx.request_id)
            except Exception:  # noqa: BLE001 - boundary: a log line must never fail the request it belongs to
                logger.debug("could not forward a log message from %r", server_id, exc_info=True)
            return
        connections = list(self.connections)
        if self.relay.busy(server_id) or len(connections) != 1:
            logger.debug("log message from %r kept local (no single client to send it to): %s", server_id, params.data)
            return
        connection = connections[0]
        minimum = connection.state.get("log_level", "debug")
        if _LEVELS.index(params.level) >= _LEVELS.index(minimum):
            message = {"level": params.level, "data": params.data, "logger": logger_name}
            await self.notify(connection, "notifications/message", message)

    async def notify(self, connection: Any, method: str, params: dict[str, Any] | None) -> None:
        """Send one notification to one client connection."""
        try:
            await connection.notify(method, params)
        except Exception:  # boundary: a gone client must not stop notifications to the others
            logger.debug("dropping a connection that could not take %s", method, exc_info=True)
            self.connections.discard(connection)
