"""Sessions to an upstream made with a caller's own token, for servers that opt in.

By default every request to an upstream goes through one shared session that carries
the gateway's own credentials from the configuration; a caller's token never leaves
the gateway. A server configured with `forward_caller_token: true` wants to know who
is asking (its own access control, audit, per-user quota): requests made for a caller
who presented a forwardable token (see `gateway.security.http_guard.forwardable_token`) go
through a session of that caller's, opened with `Authorization: Bearer <token>`.

A server with `auth: {type: oauth, per_user: true}` gets the same kind of session per caller
*account* (`request_linked`): opened with the account's own OAuth grant (`spec.oauth_account`),
never with the gateway's or another caller's. A caller who has not linked an account, or whose
grant ended, is refused with `upstream_unauthorized` and `needs_login` in its details. With
`auth.token_exchange`, a caller holding a JWT gets the grant without a browser step: the JWT is
exchanged (RFC 8693) at the identity provider, again whenever the exchanged token nears expiry.

Such a session is a full supervised `Upstream` with the shared one's settings, keyed by
a hash of the token, opened on the caller's first request, closed after `idle_seconds`
without requests, and at most `max_sessions` are kept (the least recently used idle
one makes room). They share the shared session's concurrency limit, so the server
sees no more requests in flight than its `max_concurrent_calls`. Listing, health
probes, subscriptions and list_changed stay on the shared session: what a server
lists is the same for everyone in the gateway's catalog.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types as types

from gateway.errors import UpstreamUnauthorized, UpstreamUnavailable
from gateway.upstreams.oauth.grant import Grant, RefreshRefused, exchange
from gateway.upstreams.upstream import Upstream, UpstreamEvents, UpstreamSpec, unavailable_error

__all__ = ["CallerSessions", "token_key"]

logger = logging.getLogger(__name__)


def token_key(token: str) -> str:
    """What a session is kept under: never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class _Session:
    upstream: Upstream
    events: _CallerEvents
    last_used: float
    in_flight: int = 0

    async def wait_settled(self) -> None:
        """Wait (up to the startup timeout) until the session is connected, or refused: a server
        that refused the caller's token refuses it again on every reconnection, so waiting on
        would only delay the answer."""
        upstream = self.upstream
        with anyio.move_on_after(upstream.startup_timeout):
            refused = (upstream.state == "failed" and upstream.unauthorized) or upstream.state == "needs_login"
            while not upstream.connected and not refused:
                await self.events.changed.wait()
                refused = (upstream.state == "failed" and upstream.unauthorized) or upstream.state == "needs_login"


class _CallerEvents:
    """A caller's session reports logs and relayed questions like the shared one; its listing
    and state are its own business (the shared session lists for the catalog)."""

    def __init__(self, owner: UpstreamEvents) -> None:
        self.owner = owner
        self.changed = anyio.Event()
        """Set at the session's next change of state (then replaced)."""

    async def listing_changed(self, upstream: Upstream) -> None:
        return None

    async def state_changed(self, upstream: Upstream) -> None:
        logger.debug("caller session to %r is %s (%s)", upstream.id, upstream.state, upstream.reason)
        self.changed.set()
        self.changed = anyio.Event()

    async def resource_updated(self, upstream: Upstream, uri: str) -> None:
        return None

    async def log_message(self, upstream: Upstream, params: types.LoggingMessageNotificationParams) -> None:
        await self.owner.log_message(upstream, params)

    async def relay_request(
        self, upstream: Upstream, request: types.InputRequest
    ) -> types.InputResponse | types.ErrorData:
        return await self.owner.relay_request(upstream, request)


class CallerSessions:
    """Per-caller sessions to the servers with `forward_caller_token: true`."""

    def __init__(
        self,
        owner: UpstreamEvents,
        task_group: Callable[[], anyio.abc.TaskGroup],
        *,
        idle_seconds: float = 300.0,
        max_sessions: int = 64,
    ) -> None:
        self.owner = owner
        self.task_group = task_group
        """Where sessions run: the registry's, so they stop with it."""
        self.idle_seconds = idle_seconds
        self.max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._exchanged: dict[tuple[str, str], Grant] = {}
        """Grants got by token exchange, by session key: exchanged again when about to expire."""
        self._sweeping = False

    def __len__(self) -> int:
        return len(self._sessions)

    async def request(
        self,
        shared: Upstream,
        token: str,
        operation: str,
        send: Callable[[Any], Awaitable[Any]],
        *,
        timeout: float | None = None,
    ) -> Any:
        """Run one request on `shared`'s server in the session of the caller holding `token`."""
        session = await self._session(
            shared, (shared.id, token_key(token)), lambda: self._spec_for_token(shared, token)
        )
        session.in_flight += 1
        try:
            return await session.upstream.request(operation, send, timeout=timeout)
        finally:
            session.in_flight -= 1
            session.last_used = anyio.current_time()

    async def request_linked(
        self,
        shared: Upstream,
        account: str,
        operation: str,
        send: Callable[[Any], Awaitable[Any]],
        *,
        timeout: float | None = None,
        subject_token: str | None = None,
    ) -> Any:
        """Run one request on `shared`'s per-user OAuth server in the session of `account`'s own grant.
        `subject_token`: the caller's own JWT, exchanged for the grant (RFC 8693) when the server's
        `auth.token_exchange` says where."""
        oauth = shared.spec.oauth
        assert oauth is not None and oauth.per_user
        key = (shared.id, "account:" + token_key(account))
        if oauth.config.token_exchange is not None and subject_token is not None:
            try:
                return await self._linked_request(shared, account, key, operation, send, timeout, subject_token)
            except UpstreamUnauthorized as exc:
                if exc.details.get("exchange_refused"):
                    raise
                self._close(key)  # the server refused the exchanged token (revoked): exchange anew, once
        elif key not in self._sessions and await oauth.grant(account) is None:
            raise UpstreamUnauthorized(
                f"Server {shared.id!r} acts as each caller's own account, and this caller has not linked one: "
                f"{oauth.login_hint(account)}.",
                server=shared.id,
                details={"needs_login": True},
            )
        return await self._linked_request(shared, account, key, operation, send, timeout, subject_token)

    async def _linked_request(
        self,
        shared: Upstream,
        account: str,
        key: tuple[str, str],
        operation: str,
        send: Callable[[Any], Awaitable[Any]],
        timeout: float | None,
        subject_token: str | None,
    ) -> Any:
        oauth = shared.spec.oauth
        assert oauth is not None
        if oauth.config.token_exchange is not None and subject_token is not None:
            await self._exchange(shared, account, key, subject_token)
        try:
            session = await self._session(shared, key, lambda: self._spec_for_account(shared, account))
            session.in_flight += 1
            try:
                return await session.upstream.request(operation, send, timeout=timeout)
            finally:
                session.in_flight -= 1
                session.last_used = anyio.current_time()
        except UpstreamUnauthorized:
            self._exchanged.pop(key, None)  # the server refused it: the next attempt exchanges anew
            raise

    async def _exchange(self, shared: Upstream, account: str, key: tuple[str, str], subject_token: str) -> None:
        """Make sure `account` holds a grant exchanged from its token, not about to expire."""
        cached = self._exchanged.get(key)
        if cached is not None and not cached.expiring():
            return
        oauth = shared.spec.oauth
        assert oauth is not None
        try:
            async with httpx2.AsyncClient(timeout=30.0) as client:
                grant = await exchange(oauth.config, oauth.url, subject_token, client)
        except RefreshRefused as exc:
            self._exchanged.pop(key, None)
            raise UpstreamUnauthorized(
                f"Server {shared.id!r}: {exc}; {oauth.login_hint(account)}.",
                server=shared.id,
                details={"needs_login": True, "exchange_refused": True},
            ) from None
        except httpx2.HTTPError as exc:
            raise UpstreamUnavailable(
                f"Server {shared.id!r}: the identity provider could not be asked for a token ({type(exc).__name__}).",
                server=shared.id,
            ) from None
        await oauth.save(account, grant)
        self._exchanged[key] = grant
        logger.info("exchanged a caller's token for one of %r (RFC 8693)", shared.id)

    def close_account(self, server: str, account: str) -> None:
        """Close `account`'s session to `server` (its link was removed)."""
        key = (server, "account:" + token_key(account))
        self._exchanged.pop(key, None)
        self._close(key)

    def _spec_for_account(self, shared: Upstream, account: str) -> UpstreamSpec:
        return replace(shared.spec, oauth_account=account, health_interval=0)

    def _spec_for_token(self, shared: Upstream, token: str) -> UpstreamSpec:
        headers = {name: value for name, value in shared.spec.headers.items() if name.lower() != "authorization"}
        return replace(
            shared.spec,
            headers={**headers, "Authorization": f"Bearer {token}"},
            secrets=(*shared.spec.secrets, token),
            health_interval=0,  # idle sessions are closed instead; a broken one is noticed by its next request
        )

    async def _session(self, shared: Upstream, key: tuple[str, str], make_spec: Callable[[], UpstreamSpec]) -> _Session:
        session = self._sessions.get(key)
        if session is None:
            session = self._open(shared, make_spec(), key)
        session.last_used = anyio.current_time()
        upstream = session.upstream
        if not upstream.connected:
            session.in_flight += 1  # not swept while it connects
            try:
                await session.wait_settled()
            finally:
                session.in_flight -= 1
        if not upstream.connected:
            self._close(key)
            if upstream.state == "needs_login":
                raise UpstreamUnauthorized(
                    f"Server {shared.id!r} cannot act as this caller: {upstream.reason}.",
                    server=shared.id,
                    details={"needs_login": True},
                )
            if upstream.unauthorized:
                raise UpstreamUnauthorized(
                    f"Server {shared.id!r} refused the caller's token (HTTP {upstream.http_status}); "
                    "sign in again or ask for access to that server.",
                    server=shared.id,
                    details={"http_status": upstream.http_status},
                )
            raise unavailable_error(upstream)
        return session

    def _open(self, shared: Upstream, spec: UpstreamSpec, key: tuple[str, str]) -> _Session:
        if len(self._sessions) >= self.max_sessions:
            self._evict_one()
        events = _CallerEvents(self.owner)
        upstream = Upstream(
            spec,
            events,
            startup_timeout=shared.startup_timeout,
            call_timeout=shared.call_timeout,
            relay_requests=shared.relay_requests,
            http_client=shared.http_client,
            max_message_bytes=shared.max_message_bytes,
            lean_calls=shared.lean_calls,
        )
        upstream.limiter = shared.limiter
        session = self._sessions[key] = _Session(upstream, events, anyio.current_time())
        group = self.task_group()
        group.start_soon(upstream.run, name=f"caller session {shared.id}")
        if not self._sweeping:
            self._sweeping = True
            group.start_soon(self._sweep, name="caller session sweeper")
        logger.info("opened a caller session to %r (%d open)", shared.id, len(self._sessions))
        return session

    def _close(self, key: tuple[str, str]) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            session.upstream.stop()

    def retire(self, server_id: str) -> list[Upstream]:
        """Forget every caller session to one server (restarted, changed, removed or disabled) and
        return them, still running: the owner drains and stops them. New requests open new ones."""
        keys = [key for key in self._sessions if key[0] == server_id]
        return [self._sessions.pop(key).upstream for key in keys]

    def _evict_one(self) -> None:
        idle = [(s.last_used, key) for key, s in self._sessions.items() if s.in_flight == 0]
        if idle:
            self._close(min(idle)[1])

    def sweep(self) -> None:
        """Close sessions idle for `idle_seconds` and sessions that lost their connection."""
        now = anyio.current_time()
        for key, session in list(self._sessions.items()):
            if session.in_flight:
                continue
            if now - session.last_used >= self.idle_seconds or session.upstream.state == "failed":
                self._close(key)

    async def _sweep(self) -> None:
        try:
            while True:
                await anyio.sleep(max(0.05, min(self.idle_seconds / 4, 30.0)))
                self.sweep()
                if not self._sessions:
                    return
        finally:
            self._sweeping = False
