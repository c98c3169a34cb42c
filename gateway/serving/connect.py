"""Per-user links to servers behind OAuth (`auth: {type: oauth, per_user: true}`): the `/connect` routes.

- `GET /connect/SERVER`, authenticated as the caller (the gateway's `auth:`): starts the
  authorization for the caller's account and redirects to the provider (JSON
  `{"authorization_url": ...}` when the request asks for JSON).
- `GET /connect/callback`: where the provider sends the browser back. It needs no gateway
  credentials (a browser coming from the provider has none): the flow's single-use `state`
  names the account that began it. It stores the grant and says so on a small page.
- `DELETE /connect/SERVER`: unlink: revokes the grant where the server offers revocation
  (RFC 7009), deletes it, and closes the caller's session.

A call from a caller who has not linked (or whose grant ended) is answered, in `tools/call`,
with a URL-mode elicitation (MCP 2025-11-25, `-32042`) when the client declared it, else with
the `upstream_unauthorized` error carrying the authorization URL (`_meta`: `connect_url`).
"""

from __future__ import annotations

import html
import logging
import secrets
from typing import Any

import httpx2
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp_types import ElicitRequestURLParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.errors import GatewayError, UpstreamUnauthorized
from gateway.registry import Registry
from gateway.security.auth import Principal
from gateway.security.http_guard import principal_in
from gateway.upstreams.oauth import (
    LinkFlows,
    OAuthBinding,
    OAuthFlowFailed,
    OAuthVaultError,
    UnknownLink,
    account_id,
    revoke,
)

__all__ = ["CALLBACK_PATH", "Connector", "caller_account", "connect_routes"]

logger = logging.getLogger(__name__)

CALLBACK_PATH = "/connect/callback"


def caller_account(principal: Principal | None) -> str | None:
    """The account a caller's grants are kept under (None: no authenticated caller)."""
    return account_id(principal.name, principal.issuer) if principal is not None else None


class Connector:
    """Per-user links of one HTTP gateway: the flows in flight and where the callback is."""

    def __init__(self, registry: Registry, public_url: str | None) -> None:
        self.registry = registry
        self.public_url = public_url.rstrip("/") if public_url else None
        self.flows = LinkFlows(lambda: registry.task_group)
        self.base_url: str | None = self.public_url
        """Where browsers reach this gateway: `public_url`, else learnt from the first `/connect` request."""

    def binding(self, server: str) -> OAuthBinding | None:
        upstream = self.registry.upstreams.get(server)
        oauth = upstream.spec.oauth if upstream is not None else None
        return oauth if oauth is not None and oauth.per_user else None

    async def begin(self, server: str, principal: Principal) -> str:
        """The authorization URL for `principal`'s account at `server`."""
        binding = self.binding(server)
        assert binding is not None and self.base_url is not None
        upstream = self.registry.upstreams[server]
        return await self.flows.begin(
            binding,
            caller_account(principal),
            self.base_url + CALLBACK_PATH,
            sse=upstream.spec.transport == "sse",
            subject_hint=principal.name,
        )

    def learn_base_url(self, request: Any) -> None:
        """Without `public_url`, browsers reach the gateway where its clients do: the first request's address."""
        if self.base_url is None and isinstance(request, Request):
            self.base_url = str(request.base_url).rstrip("/")

    async def for_error(self, exc: GatewayError, request: Any, client_caps: Any) -> Exception:
        """What to answer a call refused for want of the caller's link: a URL-mode elicitation if the
        client can show one, else `exc` with the authorization URL in its message and details."""
        server = exc.server or ""
        principal = principal_in(request)
        if not isinstance(exc, UpstreamUnauthorized) or not exc.details.get("needs_login") or principal is None:
            return exc
        self.learn_base_url(request)
        if self.binding(server) is None or self.base_url is None:
            return exc
        if self.registry.upstreams[server].state == "needs_login":
            return exc  # the gateway's own login (the catalog's listing) is missing: the operator's to fix
        try:
            url = await self.begin(server, principal)
        except (OAuthFlowFailed, OAuthVaultError, httpx2.HTTPError, TimeoutError) as error:
            logger.warning("could not start a link to %r: %s", server, error)
            return exc
        elicitation = getattr(client_caps, "elicitation", None) if client_caps is not None else None
        if elicitation is not None and getattr(elicitation, "url", None) is not None:
            return UrlElicitationRequiredError(
                [
                    ElicitRequestURLParams(
                        mode="url",
                        message=f"Link your account at {server!r} to use its tools through the gateway.",
                        url=url,
                        elicitation_id=f"connect-{server}-{secrets.token_hex(8)}",
                    )
                ]
            )
        linked = UpstreamUnauthorized(
            f"{exc.message} Open {url} to link it, then call again.",
            server=server,
            details={**exc.details, "connect_url": url},
        )
        return linked


def connect_routes(connector: Connector) -> list[Route]:
    """`/connect/callback` (public: list it among the paths served without credentials) and `/connect/{server}`."""

    async def callback(request: Request) -> Response:
        query = request.query_params
        try:
            binding, _, grant = await connector.flows.complete(
                query.get("state", ""), query.get("code"), iss=query.get("iss"), error=query.get("error")
            )
        except (UnknownLink, OAuthFlowFailed, TimeoutError) as exc:
            return _page(400, f"The link was not made: {exc}")
        who = f" for {grant.subject_hint}" if grant.subject_hint else ""
        return _page(200, f"Linked {binding.server_id}{who}. You can close this window.")

    async def link(request: Request) -> Response:
        server = request.path_params["server"]
        principal = principal_in(request)
        found = _linkable(connector, server, principal)
        if isinstance(found, Response):
            return found
        connector.learn_base_url(request)
        try:
            url = await connector.begin(server, found)
        except (OAuthFlowFailed, OAuthVaultError, httpx2.HTTPError, TimeoutError) as exc:
            return JSONResponse({"error": f"could not start the link to {server!r}: {exc}"}, status_code=502)
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"authorization_url": url})
        return RedirectResponse(url, status_code=302)

    async def unlink(request: Request) -> Response:
        server = request.path_params["server"]
        principal = principal_in(request)
        found = _linkable(connector, server, principal)
        if isinstance(found, Response):
            return found
        binding = connector.binding(server)
        assert binding is not None
        account = caller_account(found)
        try:
            grant = await binding.grant(account)
            revoked = False
            if grant is not None:
                try:
                    async with httpx2.AsyncClient(timeout=30.0) as client:
                        revoked = await revoke(grant, client)
                except httpx2.HTTPError as exc:
                    logger.warning("server %r did not confirm a revocation (%s)", server, type(exc).__name__)
                await binding.forget(account)
        except OAuthVaultError as exc:
            return JSONResponse({"error": str(exc)}, status_code=500)
        assert account is not None
        connector.registry.caller_sessions.close_account(server, account)
        return JSONResponse({"server": server, "unlinked": grant is not None, "revoked": revoked})

    return [
        Route(CALLBACK_PATH, callback, methods=["GET"]),
        Route("/connect/{server}", link, methods=["GET"]),
        Route("/connect/{server}", unlink, methods=["DELETE"]),
    ]


def _linkable(connector: Connector, server: str, principal: Principal | None) -> Principal | Response:
    """The caller, if `server` takes per-user links and the caller is authenticated; else the error response."""
    if connector.binding(server) is None:
        return JSONResponse({"error": f"no server {server!r} with `auth: {{type: oauth, per_user: true}}`"}, 404)
    if principal is None:
        message = "linking an account needs an authenticated caller (the gateway's `auth:` with API keys or JWT)"
        return JSONResponse({"error": message}, status_code=403)
    return principal


def _page(status: int, text: str) -> HTMLResponse:
    body = f"<!doctype html><title>mcp-gateway</title><p>{html.escape(text)}</p>\n"
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})
