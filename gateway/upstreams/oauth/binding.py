"""One server's OAuth as a running gateway uses it: where its grants are, and the HTTP auth that
puts them on requests.

`GrantAuth` is our own `httpx2.Auth`, not the SDK's `OAuthClientProvider`, for the serving side:
the SDK's provider runs the whole interactive flow on a 401 (a gateway has no browser there, the
server must wait for `mcp-gateway login` instead), refreshes only once a token has expired, and
after a restart forgets the token endpoint it discovered. `GrantAuth` refreshes before expiry
and once on a 401, stores what it refreshed, and otherwise records that a login is needed
(`needs_login`), which the upstream's supervisor reads to wait in the `needs_login` state
instead of retrying in a loop. The SDK's provider does the interactive part (`gateway.upstreams.oauth.flow`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

import anyio
import httpx2

from gateway.config.servers import OAuthConfig
from gateway.errors import UpstreamUnauthorized, UpstreamUnavailable
from gateway.upstreams.errors import describe
from gateway.upstreams.oauth.grant import GATEWAY_SLOT, Grant, RefreshRefused, refresh, user_slot
from gateway.upstreams.oauth.vault import OAuthVaultError, Vault

__all__ = [
    "GrantAuth",
    "NeedsLogin",
    "OAuthBinding",
    "TokenEndpointDown",
    "account_id",
    "login_reason",
    "login_refusal",
    "token_endpoint_error",
    "token_endpoint_reason",
]

logger = logging.getLogger(__name__)

TOKEN_TIMEOUT = 30.0
"""Seconds a token-endpoint request may take."""


def account_id(name: str, issuer: str | None) -> str:
    """A caller's account as grants are kept: the JWT issuer and subject, or the API key's name."""
    return f"jwt:{issuer}:{name}" if issuer else f"key:{name}"


class NeedsLogin(Exception):
    """No usable grant: the gateway's operator must log in, or the caller must link their account."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(server, message)
        self.server = server
        self.message = message

    def __str__(self) -> str:
        return self.message


class OAuthBinding:
    """Server `server_id` (at `url`) behind OAuth: its grants in `vault`, one per account."""

    def __init__(
        self, server_id: str, url: str, config: OAuthConfig, vault: Vault, *, poll_interval: float = 2.0
    ) -> None:
        self.server_id = server_id
        self.url = url
        self.config = config
        self.vault = vault
        self.poll_interval = poll_interval

    @property
    def per_user(self) -> bool:
        return self.config.per_user

    def slot(self, account: str | None) -> str:
        return GATEWAY_SLOT if account is None else user_slot(account)

    def login_hint(self, account: str | None) -> str:
        """What to do to give the gateway a grant: a command for the operator, a link for a caller."""
        if account is None:
            return f"run `mcp-gateway login {self.server_id}`"
        return f"link your account at /connect/{self.server_id}"

    async def grant(self, account: str | None) -> Grant | None:
        record = await self.vault.get(self.server_id, self.slot(account))
        return Grant.model_validate(record) if record is not None else None

    async def save(self, account: str | None, grant: Grant) -> None:
        await self.vault.put(self.server_id, self.slot(account), grant.model_dump())

    async def forget(self, account: str | None) -> bool:
        return await self.vault.delete(self.server_id, self.slot(account))

    def auth(self, account: str | None, on_needs_login: Callable[[], None] | None = None) -> GrantAuth:
        return GrantAuth(self, account, on_needs_login)

    async def open_auth(self, account: str | None, on_needs_login: Callable[[], None]) -> GrantAuth:
        """The auth of one connection attempt; `NeedsLogin` at once when no grant is stored."""
        if await self.grant(account) is None:
            raise self.needs_login(account, "no OAuth grant is stored")
        return self.auth(account, on_needs_login)

    async def wait_for_grant(self, account: str | None, stop: anyio.Event) -> None:
        """Return once a grant is stored for `account` (a login elsewhere, another replica) or `stop` is set."""
        while not stop.is_set():
            try:
                if await self.grant(account) is not None:
                    return
            except OAuthVaultError as exc:
                logger.debug("server %r: the token store cannot be read yet: %s", self.server_id, exc)
            with anyio.move_on_after(self.poll_interval):
                await stop.wait()

    def needs_login(self, account: str | None, why: str) -> NeedsLogin:
        return NeedsLogin(self.server_id, f"{why}; {self.login_hint(account)}")


class TokenEndpointDown(Exception):
    """A refresh could not reach (or got a server error from) the authorization server's token endpoint."""


def token_endpoint_reason(auth: GrantAuth | None) -> str | None:
    """Why the last attempt failed, when it was the token endpoint's fault (not the MCP server's)."""
    return auth.token_endpoint_down if auth is not None else None


def token_endpoint_error(server: str, auth: GrantAuth | None, operation: str) -> UpstreamUnavailable | None:
    """The error for a request that failed because the token endpoint could not refresh its token."""
    why = token_endpoint_reason(auth)
    if why is None:
        return None
    message = f"Server {server!r} was not sent {operation}: {why}. Try again later."
    return UpstreamUnavailable(message, server=server, sent=False, details={"token_endpoint_down": True})


def login_reason(auth: GrantAuth | None, exc: BaseException) -> str | None:
    """Why a connection attempt needs an OAuth login, if that is why it failed (`exc` may be the
    transport's own error: the auth's `needs_login` says what lay behind it)."""
    if isinstance(exc, NeedsLogin):
        return str(exc)
    return str(auth.needs_login) if auth is not None and auth.needs_login is not None else None


def login_refusal(server: str, auth: GrantAuth | None, operation: str) -> UpstreamUnauthorized | None:
    """The error for a request that failed because the OAuth grant ended, if it did."""
    if auth is None or auth.needs_login is None:
        return None
    return UpstreamUnauthorized(
        f"Server {server!r} refused {operation}: {auth.needs_login}.", server=server, details={"needs_login": True}
    )


class GrantAuth(httpx2.Auth):
    """Bearer tokens from the account's stored grant, refreshed before expiry and once on a 401."""

    def __init__(
        self, binding: OAuthBinding, account: str | None, on_needs_login: Callable[[], None] | None = None
    ) -> None:
        """`on_needs_login`: told when the grant turns out unusable (the upstream closes its session:
        a transport such as SSE's only logs a failed POST, and the request would wait for its timeout)."""
        self.binding = binding
        self.account = account
        self.on_needs_login = on_needs_login
        self.needs_login: NeedsLogin | None = None
        """Set when no usable grant is left: the server waits for a login instead of retrying."""
        self.token_endpoint_down: str | None = None
        """Why the last refresh could not reach the authorization server's token endpoint (None once one
        succeeds): the MCP server itself was not asked, so its failure is not the server's."""
        self._grant: Grant | None = None
        self._lock = anyio.Lock()

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        grant = await self._usable(refused=None)
        request.headers["Authorization"] = f"Bearer {grant.access_token}"
        response = yield request
        if response.status_code == 401:
            grant = await self._usable(refused=grant.access_token)
            request.headers["Authorization"] = f"Bearer {grant.access_token}"
            yield request

    def sync_auth_flow(self, request: httpx2.Request) -> Any:
        raise RuntimeError("GrantAuth works with an async client only")

    async def _usable(self, refused: str | None) -> Grant:
        """The grant to send: the stored one (re-read when the server refused ours, another replica or a
        login may have stored a newer one), refreshed if it is about to expire or was refused."""
        async with self._lock:
            binding, account = self.binding, self.account
            if self._grant is None or refused is not None or self._grant.expiring():
                self._grant = await binding.grant(account)
            grant = self._grant
            if grant is None:
                raise self._fail("no OAuth grant is stored" if refused is None else "the server refused the token")
            if (refused is not None and grant.access_token == refused) or grant.expiring():
                try:
                    async with httpx2.AsyncClient(timeout=TOKEN_TIMEOUT) as client:
                        grant = await refresh(grant, client)
                except httpx2.HTTPError as exc:  # the authorization server is down or failing: not a refusal
                    self.token_endpoint_down = (
                        f"the gateway could not refresh its OAuth access token: the authorization server's "
                        f"token endpoint {grant.token_endpoint} failed ({describe(exc)}); the MCP server was not asked"
                    )
                    raise TokenEndpointDown(self.token_endpoint_down) from None
                except RefreshRefused as exc:
                    latest = await binding.grant(account)
                    if latest is not None and latest.refresh_token != grant.refresh_token and not latest.expiring():
                        # Another replica refreshed first (and the server rotated the refresh token),
                        # or a new login was stored meanwhile: use that one.
                        self._grant = latest
                        return latest
                    if latest is not None and latest.refresh_token == grant.refresh_token:
                        await binding.forget(account)  # dead: the waiting server looks for a new one
                    raise self._fail(f"the OAuth grant ended: {exc}") from None
                self.token_endpoint_down = None
                await binding.save(account, grant)
                logger.info("server %r: refreshed its OAuth access token", binding.server_id)
                self._grant = grant
            return grant

    def _fail(self, why: str) -> NeedsLogin:
        self._grant = None
        self.needs_login = self.binding.needs_login(self.account, why)
        if self.on_needs_login is not None:
            self.on_needs_login()
        return self.needs_login
