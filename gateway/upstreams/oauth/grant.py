"""A grant: the tokens one account holds for one server, with what is needed to refresh and revoke them.

Kept whole in the vault, so a gateway that restarts (or another replica) refreshes and revokes
without discovering the authorization server again: the SDK's OAuth client keeps the token
endpoint only in memory, and after a restart would refresh against `<server origin>/token`.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any
from urllib.parse import quote

import httpx2
from pydantic import BaseModel, Field

from gateway.config.servers import OAuthConfig

__all__ = [
    "GATEWAY_SLOT",
    "Grant",
    "RefreshRefused",
    "client_slot",
    "exchange",
    "refresh",
    "revoke",
    "user_slot",
]

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
TOKEN_TYPES = {
    "jwt": "urn:ietf:params:oauth:token-type:jwt",
    "access_token": "urn:ietf:params:oauth:token-type:access_token",
}
GATEWAY_SLOT = "gateway"
"""The slot of the gateway's own identity (`mcp-gateway login`)."""
REFRESH_MARGIN = 60.0
"""Seconds before expiry at which a token is refreshed (at most half its lifetime)."""


def user_slot(account: str) -> str:
    """The slot of a caller's linked account: a hash, so the store does not say who linked."""
    return "user-" + hashlib.sha256(account.encode()).hexdigest()[:32]


def client_slot(redirect_uri: str) -> str:
    """The slot of the client registered (RFC 7591) for one redirect URI."""
    return "client-" + hashlib.sha256(redirect_uri.encode()).hexdigest()[:32]


class RefreshRefused(Exception):
    """The authorization server refused the refresh token (revoked, expired): a new login is needed."""


class Grant(BaseModel):
    """What one account holds for one server. Its repr shows no token or secret."""

    access_token: str = Field(repr=False)
    token_type: str = "Bearer"
    refresh_token: str | None = Field(default=None, repr=False)
    scope: str | None = None
    expires_at: float | None = None
    """Unix time the access token expires (None: the server did not say)."""
    lifetime: float | None = None
    """Seconds the access token was issued for, to refresh it before the end."""
    token_endpoint: str
    revocation_endpoint: str | None = None
    resource: str | None = None
    """The RFC 8707 resource indicator the tokens were asked for."""
    issuer: str | None = None
    client_id: str
    client_secret: str | None = Field(default=None, repr=False)
    token_endpoint_auth_method: str | None = None
    subject_hint: str | None = None
    """Who linked (a caller's name), for `servers` output; never a token."""

    def expiring(self, now: float | None = None) -> bool:
        """Whether the access token is expired or about to be (refresh it first)."""
        if self.expires_at is None:
            return False
        margin = min(REFRESH_MARGIN, (self.lifetime or REFRESH_MARGIN * 2) / 2)
        return (now if now is not None else time.time()) >= self.expires_at - margin

    def client_auth(self, data: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """The token-endpoint request's form and headers with the client's authentication (RFC 6749 §2.3.1)."""
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        data = {**data, "client_id": self.client_id}
        if self.client_secret and self.token_endpoint_auth_method == "client_secret_basic":
            pair = f"{quote(self.client_id, safe='')}:{quote(self.client_secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif self.client_secret:
            data["client_secret"] = self.client_secret
        return data, headers

    def with_tokens(self, payload: dict[str, Any], now: float | None = None) -> Grant:
        """This grant after a token response (RFC 6749 §5.1): an omitted refresh token or scope is kept."""
        now = now if now is not None else time.time()
        expires_in = payload.get("expires_in")
        lifetime = float(expires_in) if expires_in is not None else None
        return self.model_copy(
            update={
                "access_token": str(payload["access_token"]),
                "token_type": str(payload.get("token_type") or "Bearer"),
                "refresh_token": payload.get("refresh_token") or self.refresh_token,
                "scope": payload.get("scope") or self.scope,
                "lifetime": lifetime,
                "expires_at": now + lifetime if lifetime is not None else None,
            }
        )


async def refresh(grant: Grant, client: httpx2.AsyncClient) -> Grant:
    """The grant with fresh tokens from its refresh token; `RefreshRefused` if the server says no."""
    if not grant.refresh_token:
        raise RefreshRefused("the server issued no refresh token")
    form = {"grant_type": "refresh_token", "refresh_token": grant.refresh_token}
    if grant.resource:
        form["resource"] = grant.resource
    data, headers = grant.client_auth(form)
    response = await client.post(grant.token_endpoint, data=data, headers=headers)
    if response.status_code in (400, 401):
        raise RefreshRefused(f"the authorization server refused the refresh token ({_refusal(response)})")
    response.raise_for_status()
    payload = response.json()
    if not isinstance(payload, dict) or "access_token" not in payload:
        raise RefreshRefused("the authorization server's refresh answer carries no access token")
    return grant.with_tokens(payload)


def _refusal(response: httpx2.Response) -> str:
    try:
        return str(response.json().get("error", "refused"))
    except ValueError:
        return "refused"


async def exchange(config: OAuthConfig, resource: str, subject_token: str, client: httpx2.AsyncClient) -> Grant:
    """RFC 8693: a grant for `resource` from the caller's own `subject_token`, asked of the configured
    identity provider by the configured client. `RefreshRefused` when the provider says no."""
    assert config.token_exchange is not None and config.client_id is not None
    te = config.token_exchange
    base = Grant(
        access_token="",
        token_endpoint=te.token_endpoint,
        resource=resource,
        client_id=config.client_id,
        client_secret=config.client_secret,
        token_endpoint_auth_method="client_secret_post" if config.client_secret else None,
    )
    form = {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": subject_token,
        "subject_token_type": TOKEN_TYPES[te.subject_token_type],
        "requested_token_type": TOKEN_TYPES["access_token"],
        "resource": resource,
    }
    if te.audience:
        form["audience"] = te.audience
    if config.scopes:
        form["scope"] = " ".join(config.scopes)
    data, headers = base.client_auth(form)
    response = await client.post(te.token_endpoint, data=data, headers=headers)
    if response.status_code in (400, 401, 403):
        raise RefreshRefused(f"the identity provider refused to exchange the caller's token ({_refusal(response)})")
    response.raise_for_status()
    payload = response.json()
    if not isinstance(payload, dict) or "access_token" not in payload:
        raise RefreshRefused("the identity provider's exchange answer carries no access token")
    return base.with_tokens(payload)


async def revoke(grant: Grant, client: httpx2.AsyncClient) -> bool:
    """Revoke the grant at the server (RFC 7009): the refresh token (which ends the grant) and the
    access token. Returns whether the server offers revocation."""
    if not grant.revocation_endpoint:
        return False
    tokens = [("refresh_token", grant.refresh_token), ("access_token", grant.access_token)]
    for hint, token in tokens:
        if token:
            data, headers = grant.client_auth({"token": token, "token_type_hint": hint})
            response = await client.post(grant.revocation_endpoint, data=data, headers=headers)
            response.raise_for_status()
    return True
