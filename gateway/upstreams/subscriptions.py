"""One upstream's resource subscriptions, in whichever protocol era the server speaks.

Before 2026-07-28 a client subscribes with `resources/subscribe`, and only to a server
that declares `resources.subscribe`. From 2026-07-28 on, changes come only on a
`subscriptions/listen` stream, which the gateway holds open (re-opened with the current
subscriptions whenever they change). A server without either has no updates to give:
subscribing to it is not an error, no update comes.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.upstreams.listing import Unsupported

__all__ = ["SubscribedServer", "Subscriptions", "cancel_when", "legacy_call"]

logger = logging.getLogger("gateway.upstreams.upstream")


class SubscribedServer(Protocol):
    """What the subscriptions use of their server (an `Upstream` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def protocol_version(self) -> str | None: ...

    @property
    def call_timeout(self) -> float: ...

    @property
    def unsupported(self) -> Unsupported: ...

    def refresh(self) -> None: ...

    async def request(
        self, operation: str, send: Callable[[Client], Awaitable[Any]], *, timeout: float | None = None
    ) -> Any: ...


class Subscriptions:
    """The resources subscribed to on one upstream, and its listen stream."""

    def __init__(self, upstream: SubscribedServer) -> None:
        self.upstream = upstream
        self.uris: set[str] = set()
        self.listening = False
        """Whether this session holds a `subscriptions/listen` stream (2026-07-28 servers that serve it)."""
        self._resubscribe = anyio.Event()
        self._acknowledged = anyio.Event()

    async def listen(self, client: Client) -> None:
        """Hold a `subscriptions/listen` stream open (2026-07-28 servers send changes only there)."""
        caps = client.server_capabilities
        while True:
            self._resubscribe = anyio.Event()
            acknowledged = self._acknowledged
            try:
                async with client.listen(
                    tools_list_changed=bool(caps.tools and caps.tools.list_changed),
                    prompts_list_changed=bool(caps.prompts and caps.prompts.list_changed),
                    resources_list_changed=bool(caps.resources and caps.resources.list_changed),
                    resource_subscriptions=sorted(self.uris),
                ) as subscription:
                    acknowledged.set()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(cancel_when, self._resubscribe, tg.cancel_scope)
                        async for _event in subscription:
                            pass  # events also reach `_on_message`, which handles them
                        tg.cancel_scope.cancel()
            except (ListenNotSupportedError, MCPError) as exc:
                logger.debug("server %r does not serve subscriptions/listen: %s", self.upstream.id, exc)
                self.listening = False
                self._acknowledged.set()  # nobody waits for an answer that will not come
                return
            except SubscriptionLost:
                logger.info("server %r dropped its subscription stream; re-listening", self.upstream.id)
                self.upstream.refresh()
                await anyio.sleep(1)

    async def subscribe(self, uri: str) -> None:
        """Subscribe to updates of one resource, on whichever protocol era the server speaks."""
        if uri in self.uris:
            return
        self.uris.add(uri)
        if self.upstream.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await self._relisten()
            return
        try:
            await self._legacy_subscription("resources/subscribe", uri)
        except BaseException:
            self.uris.discard(uri)
            raise

    async def _relisten(self) -> None:
        """Re-open the listen stream with the current subscriptions; wait (bounded) for its ack,
        so that an update published right after `resources/subscribe` returns is not missed.
        A server that serves no listen stream has no updates to give: nothing to wait for."""
        if not self.listening:
            return
        acknowledged = self._acknowledged = anyio.Event()
        self._resubscribe.set()
        with anyio.move_on_after(self.upstream.call_timeout):
            await acknowledged.wait()

    async def unsubscribe(self, uri: str) -> None:
        if uri not in self.uris:
            return
        self.uris.discard(uri)
        if self.upstream.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await self._relisten()
        else:
            await self._legacy_subscription("resources/unsubscribe", uri)

    async def _legacy_subscription(
        self, method: Literal["resources/subscribe", "resources/unsubscribe"], uri: str
    ) -> None:
        """(Un)subscribe before 2026-07-28: only with a server that declares subscriptions, and a
        "method not found" means it has none to give (no update will come)."""

        async def send(client: Client) -> None:
            declared = client.server_capabilities.resources
            if declared is None or not declared.subscribe:
                self.upstream.unsupported.note(method)
                return
            session = client.session
            call = session.subscribe_resource if method == "resources/subscribe" else session.unsubscribe_resource
            await self.upstream.unsupported.ask(method, lambda: legacy_call(call, uri), lambda: None)

        await self.upstream.request(method, send)


async def cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    """Cancel `scope` once `event` is set (start it as a task beside the work to bound)."""
    await event.wait()
    scope.cancel()


async def legacy_call(method: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Call an SDK method that 2026-07-28 deprecates but handshake-era servers still need."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        return await method(*args)
