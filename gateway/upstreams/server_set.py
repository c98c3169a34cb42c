"""The set of running upstreams, and the changes made to it while the gateway serves.

The registry (`gateway.registry`) owns one `ServerSet`. It makes each `Upstream` from its spec
(refusing an entry that would start this gateway again), runs each in its own cancel scope
(`gateway.upstreams.supervision`), and changes the set at runtime: restart one server, disable
or enable one, or apply a new set of specs (a reloaded config) while the others keep their
sessions and the calls in flight on them. What the owner keys by server id (breakers,
metrics, caller sessions, the catalog) it is told about through `ServerSetOwner`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.abc
from mcp import StdioServerParameters
from mcp.client.extension import ClientExtension
from mcp.client.stdio import get_default_environment

from gateway.upstreams.recursion import Chain, starts_gateway
from gateway.upstreams.spec import UpstreamSpec
from gateway.upstreams.supervision import SpecChanges, Supervisors, diff_specs
from gateway.upstreams.upstream import Upstream, UpstreamEvents

__all__ = ["OPERATOR_DISABLED", "ServerSet", "ServerSetOwner", "UnknownServer", "duplicate_ids"]

logger = logging.getLogger("gateway.registry")

OPERATOR_DISABLED = "disabled by an operator"
"""The reason of a server `set_enabled(..., False)` disabled (until enabled, or the gateway restarts)."""


class UnknownServer(KeyError):
    """No server has this id. `args[0]` is the id; the message names the servers there are."""

    def __init__(self, server_id: str, known: Sequence[str]) -> None:
        super().__init__(server_id)
        self.message = f"no server {server_id!r}; servers: {', '.join(known) or 'none'}"

    def __str__(self) -> str:
        return self.message


class ServerSetOwner(UpstreamEvents, Protocol):
    """What the set needs of its owner, besides the upstreams' events."""

    @property
    def task_group(self) -> anyio.abc.TaskGroup: ...

    def client_extensions(self, server_id: str) -> list[ClientExtension]:
        """Extensions every session to the server gets."""
        ...

    def retire_callers(self, server_id: str) -> list[Upstream]:
        """The server's caller sessions, forgotten and still running (the set drains and stops them)."""
        ...

    def server_removed(self, server_id: str) -> None:
        """Forget what is kept under the id (breaker, metrics series)."""
        ...

    async def rebuild(self) -> None:
        """Rebuild the catalog from the current upstreams and tell its listeners."""
        ...


def duplicate_ids(specs: Sequence[UpstreamSpec]) -> list[str]:
    ids = [s.id for s in specs]
    return sorted({i for i in ids if ids.count(i) > 1})


def _self_start(spec: UpstreamSpec, chain: Chain) -> str | None:
    """Why an enabled stdio entry must never be started: it starts a gateway whose config is in `chain`."""
    target = spec.target
    if not (spec.enabled and isinstance(target, StdioServerParameters)):
        return None
    env = get_default_environment() | (target.env or {})  # what the child gets (`gateway.upstreams.stdio_child`)
    return starts_gateway(target.command, target.args, env, target.cwd, chain.configs)


def _with_chain(spec: UpstreamSpec, chain: Chain) -> UpstreamSpec:
    """A stdio spec whose child learns the chain of gateways above it (`MCP_GATEWAY_CHAIN`) and its cap."""
    if not isinstance(spec.target, StdioServerParameters):
        return spec
    env = {**(spec.target.env or {}), **chain.child_env()}
    return dataclasses.replace(spec, target=spec.target.model_copy(update={"env": env}))


class _RefusedUpstream(Upstream):
    """An entry that would start this gateway again: failed from the start, never spawned."""

    def __init__(self, refusal: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusal = refusal

    async def run(self) -> None:
        await self._set_state("failed", self.refusal)
        self._ready.set()


class ServerSet:
    """The running upstreams by id, their supervisors, and the runtime changes to them."""

    def __init__(
        self, specs: Sequence[UpstreamSpec], owner: ServerSetOwner, chain: Chain, options: Mapping[str, Any]
    ) -> None:
        """`options`: the `Upstream` keyword arguments every server gets (timeouts, caps...)."""
        self.owner = owner
        self.chain = chain
        self.options = dict(options)
        self.specs: dict[str, UpstreamSpec] = {spec.id: spec for spec in specs}
        """The specs running, as given (before the chain's environment is added): what `apply` diffs."""
        self.upstreams: dict[str, Upstream] = {spec.id: self._make(spec) for spec in specs}
        """Replaced as a whole, never changed in place: a loop over it is never disturbed by a change."""
        self.operator_disabled: set[str] = set()
        self._supervisors: Supervisors | None = None
        self._lock: anyio.Lock | None = None
        self._deferred: list[bool] | None = None

    def current(self, upstream: Upstream) -> bool:
        """Whether `upstream` is the one running under its id (not one replaced or removed)."""
        return self.upstreams.get(upstream.id) is upstream

    # ---- running -------------------------------------------------------------------

    @asynccontextmanager
    async def running(self, grace: float = 10.0) -> AsyncIterator[None]:
        """Start every upstream; on exit stop them all, waiting at most `grace` seconds."""
        self._lock = anyio.Lock()
        async with anyio.create_task_group() as group:
            supervisors = self._supervisors = Supervisors(group)
            for upstream in self.upstreams.values():
                supervisors.start(upstream)
            try:
                yield
            finally:
                # Supervisors close their sessions (and reap stdio children) on stop;
                # the deadline bounds a server that will not go away.
                self._supervisors = None
                supervisors.stop_all()
                group.cancel_scope.deadline = anyio.current_time() + grace

    def hold_rebuild(self) -> bool:
        """True while a change is under way: the owner's rebuild waits for its end (one rebuild)."""
        if self._deferred is None:
            return False
        self._deferred.append(True)
        return True

    # ---- runtime changes -----------------------------------------------------------

    async def restart(self, server_id: str) -> None:
        """Close the server's session (a stdio child is reaped) and start a fresh one (a new process)."""
        async with self._changing() as supervisors:
            old = self._known(server_id)
            if server_id in self.operator_disabled or old.state == "disabled":
                raise ValueError(f"server {server_id!r} is disabled ({old.reason}); enable it to start it")
            logger.info("restarting server %r", server_id)
            new = self._successor(old, self.specs[server_id], old.spec.enabled)
            async with self._one_rebuild():
                self.upstreams = {**self.upstreams, server_id: new}
            await self._stop(supervisors, old, "an operator restarted it")
            supervisors.start(new)

    async def set_enabled(self, server_id: str, enabled: bool) -> None:
        """Disable a server (session stopped, state `disabled` "disabled by an operator") or enable it."""
        async with self._changing() as supervisors:
            old = self._known(server_id)
            if not enabled:
                if server_id in self.operator_disabled:
                    return
                logger.info("server %r is disabled by an operator", server_id)
                self.operator_disabled.add(server_id)
                async with self._one_rebuild():
                    await self._stop(supervisors, old, OPERATOR_DISABLED)
                    await old.disabled_by(OPERATOR_DISABLED)
                return
            if server_id not in self.operator_disabled and old.state != "disabled":
                return
            logger.info("server %r is enabled by an operator", server_id)
            self.operator_disabled.discard(server_id)
            new = self._successor(old, self.specs[server_id], True)  # even one the config disables
            async with self._one_rebuild():
                self.upstreams = {**self.upstreams, server_id: new}
            supervisors.start(new)

    async def apply(self, specs: Sequence[UpstreamSpec], drain_seconds: float) -> SpecChanges:
        """Diff `specs` against the running ones by id and make them the running ones (see
        `Registry.apply_specs`); the ids must be unique."""
        async with self._changing() as supervisors:
            changes = diff_specs(self.specs, specs)
            retiring = [self.upstreams[i] for i in (*changes.removed, *changes.changed)]
            upstreams: dict[str, Upstream] = {}
            for spec in specs:
                old = self.upstreams.get(spec.id)
                if old is not None and spec.id in changes.unchanged:
                    upstreams[spec.id] = old
                else:
                    upstreams[spec.id] = self._successor(old, spec, spec.enabled) if old else self._make(spec)
            for server_id in changes.removed:
                self.operator_disabled.discard(server_id)
                self.owner.server_removed(server_id)
            callers = {u.id: self.owner.retire_callers(u.id) for u in retiring}
            starting = [i for i in (*changes.added, *changes.changed) if i not in self.operator_disabled]
            self.specs = {spec.id: spec for spec in specs}
            async with self._one_rebuild():
                self.upstreams = upstreams
                for server_id in (*changes.added, *changes.changed):
                    if server_id in self.operator_disabled:  # an operator's disable holds across a reload
                        await upstreams[server_id].disabled_by(OPERATOR_DISABLED)
            for server_id in starting:
                supervisors.start(upstreams[server_id])
            for old in retiring:
                self.owner.task_group.start_soon(self._retire, supervisors, old, callers[old.id], drain_seconds)
            return changes

    @asynccontextmanager
    async def _changing(self) -> AsyncIterator[Supervisors]:
        """One change at a time, while the set runs."""
        if self._supervisors is None or self._lock is None:
            raise RuntimeError("the registry is not running")
        async with self._lock:
            yield self._supervisors

    @asynccontextmanager
    async def _one_rebuild(self) -> AsyncIterator[None]:
        """Hold the owner's rebuilds back during a change, then rebuild once."""
        self._deferred = []
        try:
            yield
        finally:
            self._deferred = None
        await self.owner.rebuild()

    def _known(self, server_id: str) -> Upstream:
        upstream = self.upstreams.get(server_id)
        if upstream is None:
            raise UnknownServer(server_id, list(self.upstreams))
        return upstream

    def _make(self, spec: UpstreamSpec) -> Upstream:
        refusal = _self_start(spec, self.chain)
        chained = _with_chain(spec, self.chain)
        if refusal is None:
            upstream = Upstream(chained, self.owner, **self.options)
        else:
            upstream = _RefusedUpstream(refusal, chained, self.owner, **self.options)
        upstream.client_extensions.extend(self.owner.client_extensions(spec.id))
        return upstream

    def _successor(self, old: Upstream, spec: UpstreamSpec, enabled: bool) -> Upstream:
        """A fresh upstream in `old`'s place: its first session has a new number (the breaker closes),
        and it keeps the resources clients subscribed to."""
        new = self._make(dataclasses.replace(spec, enabled=enabled))
        new.sessions = old.sessions
        new.subscriptions.uris = set(old.subscriptions.uris)
        return new

    async def _stop(self, supervisors: Supervisors, upstream: Upstream, because: str) -> None:
        """Stop at once: the calls in flight are cancelled, saying `because`."""
        for caller in self.owner.retire_callers(upstream.id):
            caller.requests.cancel(because)
            caller.stop(because)
        upstream.requests.cancel(because)
        await supervisors.stop(upstream, because)

    async def _retire(
        self, supervisors: Supervisors, old: Upstream, callers: list[Upstream], drain_seconds: float
    ) -> None:
        """Let the calls in flight on a removed or replaced server finish (bounded), then stop it."""
        with anyio.move_on_after(drain_seconds):
            for upstream in (old, *callers):
                await upstream.requests.wait_done()
        left = sum(u.requests.count for u in (old, *callers))
        if left:
            logger.warning("server %r: cancelling %d call(s) still running after %g s", old.id, left, drain_seconds)
        how = "removed from" if old.id not in self.upstreams else "changed in"
        because = f"it was {how} the configuration, and its calls had {drain_seconds:g} s to finish"
        for upstream in (*callers, old):
            upstream.requests.cancel(because)
        for caller in callers:
            caller.stop(because)
        await supervisors.stop(old, because)
        logger.info("server %r (%s) stopped", old.id, "removed" if old.id not in self.upstreams else "replaced")
