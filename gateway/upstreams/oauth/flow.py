"""Getting a grant interactively: the MCP authorization spec's client side, by the SDK's `OAuthClientProvider`.

The SDK does discovery (the 401's `WWW-Authenticate` -> protected-resource metadata, RFC 9728 ->
authorization-server metadata, RFC 8414 or OpenID discovery), dynamic client registration
(RFC 7591), the authorization code with PKCE (S256), the resource indicator (RFC 8707) and the
scopes the server asks for. This module gives it what it needs from the gateway: the client
registration kept in the vault (or the pre-registered client from the config), a place to show
the authorization URL and a way to wait for the callback; then it keeps the outcome as a `Grant`.

The flow is started by one unauthenticated request to the server (a streamable-HTTP
`initialize`, or the SSE stream's GET): its 401 is what the SDK's flow answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
)

from gateway.upstreams.oauth.binding import OAuthBinding
from gateway.upstreams.oauth.grant import Grant, client_slot

__all__ = ["OAuthFlowFailed", "authorize"]

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = "2025-11-25"
FLOW_TIMEOUT = 30.0
"""Seconds each HTTP request of the flow may take (the wait for the person is not bounded here)."""


class OAuthFlowFailed(Exception):
    """The authorization did not end with tokens the server accepts."""


class _FlowStorage(TokenStorage):
    """The SDK's storage for one flow: no tokens to start from (a login asks anew), the client
    registration from the vault (or the config's pre-registered client)."""

    def __init__(self, binding: OAuthBinding, redirect_uri: str) -> None:
        self.binding = binding
        self.redirect_uri = redirect_uri
        self.tokens: OAuthToken | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        config = self.binding.config
        if config.client_id is not None:
            return OAuthClientInformationFull(
                client_id=config.client_id,
                client_secret=config.client_secret,
                redirect_uris=[self.redirect_uri],  # type: ignore[list-item]
                token_endpoint_auth_method="client_secret_post" if config.client_secret else "none",
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
            )
        record = await self.binding.vault.get(self.binding.server_id, client_slot(self.redirect_uri))
        return OAuthClientInformationFull.model_validate(record) if record is not None else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self.binding.config.client_id is None:
            record = client_info.model_dump(mode="json", exclude_none=True)
            await self.binding.vault.put(self.binding.server_id, client_slot(self.redirect_uri), record)


class _Provider(OAuthClientProvider):
    """The SDK's provider, asking for the configured `scopes` besides the ones the server asks for."""

    extra_scopes: tuple[str, ...] = ()

    async def _perform_authorization(self) -> httpx2.Request:
        if self.extra_scopes:
            asked = (self.context.client_metadata.scope or "").split()
            self.context.client_metadata.scope = " ".join(dict.fromkeys([*asked, *self.extra_scopes]))
        return await super()._perform_authorization()


def _token_endpoint(server_url: str, meta: OAuthMetadata | None) -> str:
    """The token endpoint the flow used: the metadata's, else `/token` at the server's origin (the spec's
    fallback for servers without metadata, as the SDK does)."""
    if meta is not None:
        return str(meta.token_endpoint)
    parts = urlsplit(server_url)
    return f"{parts.scheme}://{parts.netloc}/token"


async def authorize(
    binding: OAuthBinding,
    account: str | None,
    redirect_uri: str,
    show_url: Callable[[str], Awaitable[None]],
    wait_callback: Callable[[], Awaitable[AuthorizationCodeResult]],
    *,
    sse: bool = False,
    subject_hint: str | None = None,
) -> Grant:
    """Run the authorization for `account` (None: the gateway itself) and store the grant.

    `show_url` gets the authorization URL (print it, redirect a browser to it); `wait_callback`
    returns what came back to `redirect_uri`. `sse`: the server speaks the SSE transport."""
    binding.vault.check_key()  # before the person is sent anywhere
    config = binding.config
    storage = _FlowStorage(binding, redirect_uri)
    metadata = OAuthClientMetadata(
        redirect_uris=[redirect_uri],  # type: ignore[list-item]
        client_name=config.client_name,
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="client_secret_post" if config.client_secret else "none",
        scope=" ".join(config.scopes) or None,
    )
    provider = _Provider(binding.url, metadata, storage, redirect_handler=show_url, callback_handler=wait_callback)
    provider.extra_scopes = tuple(config.scopes)
    headers = {"MCP-Protocol-Version": PROTOCOL_VERSION}
    async with httpx2.AsyncClient(auth=provider, timeout=FLOW_TIMEOUT) as client:
        if sse:
            request = client.stream("GET", binding.url, headers={**headers, "Accept": "text/event-stream"})
        else:
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "mcp-gateway-login", "version": "1"},
                },
            }
            accept = {"Accept": "application/json, text/event-stream"}
            request = client.stream("POST", binding.url, json=body, headers={**headers, **accept})
        async with request as response:
            status = response.status_code
    context = provider.context
    tokens, client_info = context.current_tokens, context.client_info
    if tokens is None or client_info is None:
        raise OAuthFlowFailed(
            f"server {binding.server_id!r} answered HTTP {status} without asking for authorization: "
            "is `auth: oauth` right for it?"
        )
    if status in (401, 403):
        raise OAuthFlowFailed(f"server {binding.server_id!r} refused the new token (HTTP {status})")
    meta = context.oauth_metadata
    include_resource = context.should_include_resource_param(context.protocol_version)
    grant = Grant(
        access_token=tokens.access_token,
        token_type=tokens.token_type,
        refresh_token=tokens.refresh_token,
        scope=tokens.scope,
        expires_at=context.token_expiry_time,
        lifetime=float(tokens.expires_in) if tokens.expires_in is not None else None,
        token_endpoint=_token_endpoint(binding.url, meta),
        revocation_endpoint=str(meta.revocation_endpoint) if meta and meta.revocation_endpoint else None,
        resource=context.get_resource_url() if include_resource else None,
        issuer=str(meta.issuer) if meta else None,
        client_id=client_info.client_id,
        client_secret=client_info.client_secret,
        token_endpoint_auth_method=client_info.token_endpoint_auth_method,
        subject_hint=subject_hint,
    )
    await binding.save(account, grant)
    logger.info(
        "server %r: stored a new OAuth grant (%s)", binding.server_id, "gateway" if account is None else "a caller"
    )
    return grant
