"""Authorizations in flight, from the URL a person is sent to until the callback comes back.

The SDK's flow runs in a task of its own: it hands over the authorization URL (which
`begin` returns, for a redirect, a printed line or an elicitation), then waits for the
callback that `complete` delivers by the flow's `state`. The state is single-use and
unguessable, and it alone ties a callback to the account that began the flow: the
callback needs no other credentials (a browser coming back from the provider has none).
Used by `mcp-gateway login` (its callback on 127.0.0.1) and `/connect` (per-user links).
A flow not completed within `ttl` seconds is dropped. Flows live in this process: behind
several replicas, the callback must reach the replica that began the flow (sticky sessions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
from mcp.shared.auth import AuthorizationCodeResult

from gateway.upstreams.oauth.binding import OAuthBinding
from gateway.upstreams.oauth.flow import FLOW_TIMEOUT, OAuthFlowFailed, authorize
from gateway.upstreams.oauth.grant import Grant

__all__ = ["LinkFlows", "UnknownLink"]

logger = logging.getLogger(__name__)


class UnknownLink(Exception):
    """A callback whose `state` no flow in flight knows (used, expired, or never begun here)."""


@dataclass
class _Flow:
    binding: OAuthBinding
    account: str | None
    started: float = field(default_factory=time.monotonic)
    url: str | None = None
    shown: anyio.Event = field(default_factory=anyio.Event)
    arrived: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    result: AuthorizationCodeResult | None = None
    refusal: str | None = None
    error: str | None = None
    grant: Grant | None = None


class LinkFlows:
    """Flows in flight by their `state`, run in `task_group()`."""

    def __init__(
        self, task_group: Callable[[], anyio.abc.TaskGroup], *, ttl: float = 600.0, max_flows: int = 256
    ) -> None:
        self.task_group = task_group
        self.ttl = ttl
        self.max_flows = max_flows
        """Most flows in flight at once: each holds a task until its callback or `ttl`."""
        self._flows: dict[str, _Flow] = {}
        self._by_account: dict[tuple[str, str | None], _Flow] = {}
        """The flow in flight per (server, account): a caller who calls again gets the same link."""

    def __len__(self) -> int:
        return len(self._flows)

    async def begin(
        self,
        binding: OAuthBinding,
        account: str | None,
        redirect_uri: str,
        *,
        sse: bool = False,
        subject_hint: str | None = None,
    ) -> str:
        """Start a flow for `account` (None: the gateway) and return the URL to send the person to
        (the URL of the flow already in flight for that account, if there is one)."""
        key = (binding.server_id, account)
        pending = self._by_account.get(key)
        if pending is not None and pending.url is not None and not pending.arrived.is_set():
            return pending.url
        if len(self._by_account) >= self.max_flows:
            raise OAuthFlowFailed(f"{self.max_flows} authorizations are in progress; try again in a few minutes")
        flow = self._by_account[key] = _Flow(binding, account)

        async def show(url: str) -> None:
            state = parse_qs(urlsplit(url).query).get("state", [""])[0]
            self._flows[state] = flow
            flow.url = url
            flow.shown.set()

        async def wait() -> AuthorizationCodeResult:
            with anyio.fail_after(self.ttl):
                await flow.arrived.wait()
            if flow.result is None:
                raise OAuthFlowFailed(f"the authorization was refused: {flow.refusal}")
            return flow.result

        async def run() -> None:
            try:
                flow.grant = await authorize(
                    binding, account, redirect_uri, show, wait, sse=sse, subject_hint=subject_hint
                )
            except TimeoutError:
                flow.error = f"the authorization was not completed within {self.ttl:g} s"
            except Exception as exc:  # noqa: BLE001 - boundary: the flow's failure is told to whoever waits for it
                flow.error = f"{type(exc).__name__}: {exc}"
                logger.warning("server %r: OAuth authorization failed: %s", binding.server_id, flow.error)
            finally:
                flow.done.set()
                flow.shown.set()
                for state in [s for s, f in self._flows.items() if f is flow]:
                    del self._flows[state]
                if self._by_account.get(key) is flow:
                    del self._by_account[key]

        self.task_group().start_soon(run, name=f"oauth flow {binding.server_id}")
        with anyio.fail_after(FLOW_TIMEOUT * 2):
            await flow.shown.wait()
        if flow.url is None:
            raise OAuthFlowFailed(flow.error or "the authorization flow ended before it had a URL")
        return flow.url

    async def complete(
        self, state: str, code: str | None, *, iss: str | None = None, error: str | None = None
    ) -> tuple[OAuthBinding, str | None, Grant]:
        """Deliver the callback of the flow `state` and wait for its tokens; returns the server's binding,
        the account and its grant. `error`: the provider's refusal (`?error=access_denied`)."""
        flow = self._flows.pop(state, None)
        if flow is None:
            raise UnknownLink("this authorization link is unknown, used or expired; start again")
        if error is not None or not code:
            flow.refusal = error or "no code"
        else:
            flow.result = AuthorizationCodeResult(code=code, state=state, iss=iss)
        flow.arrived.set()
        with anyio.fail_after(FLOW_TIMEOUT * 2):
            await flow.done.wait()
        if flow.grant is None:
            raise OAuthFlowFailed(flow.error or "the authorization failed")
        return flow.binding, flow.account, flow.grant
