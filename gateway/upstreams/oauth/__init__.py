"""Upstreams behind OAuth: the client side of the MCP authorization spec (docs/oauth.md).

- `vault`: tokens and client registrations encrypted at rest (data dir or PostgreSQL);
- `grant`: what one account holds for one server, refreshed and revoked from what it keeps;
- `binding`: one server's OAuth in a running gateway, and the `httpx2.Auth` its sessions use;
- `flow`: getting a grant interactively, by the SDK's `OAuthClientProvider`;
- `links`: per-user links started by `GET /connect/SERVER` and ended by `/connect/callback`.
"""

from gateway.upstreams.oauth.binding import GrantAuth, NeedsLogin, OAuthBinding, account_id
from gateway.upstreams.oauth.flow import OAuthFlowFailed, authorize
from gateway.upstreams.oauth.grant import Grant, RefreshRefused, revoke
from gateway.upstreams.oauth.links import LinkFlows, UnknownLink
from gateway.upstreams.oauth.vault import (
    KEY_HINT,
    OAuthKeyMissing,
    OAuthVaultError,
    Vault,
    vault_from_settings,
)

__all__ = [
    "KEY_HINT",
    "Grant",
    "GrantAuth",
    "LinkFlows",
    "NeedsLogin",
    "OAuthBinding",
    "OAuthFlowFailed",
    "OAuthKeyMissing",
    "OAuthVaultError",
    "RefreshRefused",
    "UnknownLink",
    "Vault",
    "account_id",
    "authorize",
    "revoke",
    "vault_from_settings",
]
