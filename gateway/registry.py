"""The registry: every upstream server, internal and external, and the catalog they make.

It starts every upstream concurrently (each in its own cancel scope), rebuilds the merged
catalog whenever a server's listing or state changes, and tells its listeners (the
downstream server) what changed. While it runs, one server can be restarted, disabled or
enabled, and a new set of specs applied (a reloaded config), while the others keep serving.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, get_args

import anyio
import mcp_types as types
from mcp.client.extension import ClientExtension

from gateway.calls import Middleware, ToolCall, compose
from gateway.calls.access import Access
from gateway.calls.breaker import BreakerState, CircuitBreakers
from gateway.calls.chain import Caller
from gateway.calls.limits import CallLimits
from gateway.calls.metrics import CallMetrics
from gateway.calls.plugin_hooks import PluginHooks
from gateway.calls.retry import Retries
from gateway.calls.runnable import admitted, runnable, unresolved_call
from gateway.calls.timeout import apply_timeout
from gateway.calls.validation import ArgumentValidator
from gateway.catalog import Catalog, Entry, ServerListing, build_catalog
from gateway.config.security import LimitsConfig
from gateway.config.settings import Settings
from gateway.errors import ExecutionError, GatewayError, ToolNotFound, UpstreamUnauthorized, naming_exposed_tool
from gateway.observability.health import server_health
from gateway.observability.metrics import GatewayMetrics, UpstreamFigures
from gateway.plugins import PluginManager
from gateway.relay import Relay
from gateway.server_specs import RegistrationError
from gateway.upstreams import lean_calls
from gateway.upstreams.caller_sessions import CallerSessions
from gateway.upstreams.oauth import account_id
from gateway.upstreams.recursion import ChainError, gateway_chain, is_refusal
from gateway.upstreams.server_set import OPERATOR_DISABLED, ServerSet, UnknownServer, duplicate_ids
from gateway.upstreams.spec import ServerState
from gateway.upstreams.supervision import SpecChanges
from gateway.upstreams.tasks import TaskStatusExtension
from gateway.upstreams.upstream import CONNECTED_STATES, LISTED_STATES, Upstream, UpstreamSpec, unavailable_error

__all__ = ["OPERATOR_DISABLED", "ChangeKind", "Registry", "SpecChanges", "UnknownServer"]

logger = logging.getLogger(__name__)

ChangeKind = str
"""One of `tools`, `prompts`, `resources`."""

ChangeListener = Callable[[set[ChangeKind]], Awaitable[None]]
ResourceListener = Callable[[str], Awaitable[None]]
LogListener = Callable[[str, types.LoggingMessageNotificationParams], Awaitable[None]]
TaskStatusListener = Callable[[str, types.TaskStatusNotificationParams], Awaitable[None]]


def _check_ids(specs: Sequence[UpstreamSpec]) -> None:
    duplicates = duplicate_ids(specs)
    if duplicates:
        raise RegistrationError(f"server id(s) used twice (plugin and config?): {', '.join(duplicates)}")


class Registry:
    """Owns the upstreams and the merged catalog. Use `async with registry.running():`."""

    def __init__(
        self,
        specs: Sequence[UpstreamSpec],
        settings: Settings,
        *,
        relay_requests: bool = True,
        plugins: PluginManager | None = None,
    ) -> None:
        """`relay_requests=False` for one-shot commands: with no client to ask, upstreams are
        told the gateway does not support sampling, elicitation or roots. `plugins` brings
        the plugins' call hooks into the call chain."""
        _check_ids(specs)
        self.settings = settings
        try:  # a gateway that started itself, or one nested too deep, stops here
            chain = gateway_chain(settings.config, settings.max_nesting)
        except ChainError as exc:
            raise RegistrationError(str(exc)) from None
        self.chain = chain
        """This gateway's place among gateways that start one another (`gateway.upstreams.recursion`)."""
        options: dict[str, Any] = {
            "startup_timeout": settings.startup_timeout,
            "call_timeout": settings.call_timeout,
            "relay_requests": relay_requests,
            "max_concurrent_calls": settings.resilience.max_concurrent_calls,
            "health_interval": settings.resilience.health_interval,
            "listing_dir": settings.data_dir / "listings",
            "http_client": settings.upstreams.http_client,
            "max_message_bytes": settings.upstreams.max_message_bytes,
            "lean_calls": settings.upstreams.lean_calls,
        }
        self.task_status_listeners: list[TaskStatusListener] = []
        """Told of every `notifications/tasks/status` a server sends (`gateway.serving.tasks`)."""
        self.servers = ServerSet(specs, self, chain, options)
        """The running upstreams and the changes made to them at runtime (`gateway.upstreams.server_set`)."""
        self.plugins = plugins
        """The plugin manager, for hooks other parts call (e.g. the router's `gateway_enrich_tool`)."""
        resilience = settings.resilience
        self.metrics = GatewayMetrics()
        self.metrics.identify(settings.replica_id)
        """This gateway's Prometheus metrics (`GET /metrics` on HTTP): its own registry, not the global one."""
        self.metrics.watch_upstreams(self._upstream_figures, get_args(ServerState), get_args(BreakerState))
        self.breakers = CircuitBreakers(resilience.breaker_failures, resilience.breaker_reset_seconds)
        self._recorder: Middleware | None = None
        self._observer: Middleware | None = None
        self.admission: list[Middleware] = [runnable]
        """The layers that refuse calls which must not go on (`check_calls`, `admit`)."""
        self._counted: Middleware = CallMetrics(self.metrics)
        """Outside the admission layers: a refused call (an unknown tool, a limit) is counted too,
        as the caller's error."""
        self._core: list[Middleware] = [
            ArgumentValidator(),
            Retries(
                resilience.retry_attempts,
                resilience.retry_max_seconds,
                eta=self._eta,
                wait_ready=self._wait_ready,
            ),
            self.breakers,
            apply_timeout,
        ]
        if plugins is not None and _has_call_hooks(plugins):
            self._core.insert(0, PluginHooks(plugins))
        self.call_chain: list[Middleware] = []
        """What every proxied tool call runs through, outermost first (see `gateway.calls`)."""
        self._compose()
        self._offline_tools: dict[str, Entry[types.Tool]] = {}
        """Tools of servers that are down, so a call can wait for a reconnect instead of failing."""
        self.catalog = Catalog()
        self.relay = Relay()
        self.change_listeners: list[ChangeListener] = []
        self.resource_listeners: list[ResourceListener] = []
        self.log_listeners: list[LogListener] = []
        self.listing_filter: Callable[[Sequence[ServerListing]], list[ServerListing]] | None = None
        """Vets listings before they enter the catalog (`gateway.security.vetting`); None: all pass."""
        self.withheld: Callable[[str], GatewayError | None] | None = None
        """The error for a tool that vetting withholds (`ToolVetter.withheld`), so that a call of it
        says so instead of "no tool by that name"."""
        self._task_group: anyio.abc.TaskGroup | None = None
        self.caller_sessions = CallerSessions(self, lambda: self.task_group)
        """Sessions opened with callers' own tokens (servers with `forward_caller_token: true`)."""

    # ---- lifecycle ------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Registry]:
        """Start every upstream concurrently; stop them all on exit."""
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            async with self.servers.running():
                yield self
            # Work that outlived requests (router, relay exchanges) ends with the upstreams.
            tg.cancel_scope.cancel()
            self._task_group = None

    @property
    def upstreams(self) -> dict[str, Upstream]:
        """The running upstreams by id, in configuration order (a new dict after each runtime change)."""
        return self.servers.upstreams

    @property
    def specs(self) -> dict[str, UpstreamSpec]:
        """The running specs by id, as given (what `apply_specs` diffs against)."""
        return self.servers.specs

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        """For work that outlives one request (relay exchanges)."""
        if self._task_group is None:
            raise RuntimeError("the registry is not running")
        return self._task_group

    async def wait_settled(self, timeout: float | None = None) -> None:
        """Wait until every server has connected or failed (bounded by `timeout`)."""
        with anyio.move_on_after(timeout):
            for upstream in list(self.upstreams.values()):
                await upstream.wait_settled()

    # ---- runtime changes (`gateway.upstreams.server_set`) ---------------------

    async def restart_server(self, server_id: str) -> None:
        """Close the server's session (a stdio child is reaped) and start a fresh one (a new process);
        calls of its tools meanwhile wait for it. Raises `UnknownServer` (a `KeyError(server_id)`)
        for an unknown id, `ValueError` for a disabled server (enable it instead)."""
        await self.servers.restart(server_id)

    async def set_server_enabled(self, server_id: str, enabled: bool) -> None:
        """Disable a server (session stopped, its items out of the catalog, state `disabled` with
        reason "disabled by an operator"; a call of its tool says so) or enable it again. Runtime
        only: a restarted gateway reads the config again. Raises `UnknownServer` for an unknown id."""
        await self.servers.set_enabled(server_id, enabled)

    async def apply_specs(self, specs: Sequence[UpstreamSpec], *, drain_seconds: float) -> SpecChanges:
        """Make `specs` (a reloaded config) the running servers, diffed by id: unchanged ones keep
        running untouched (same session, same process); changed ones are replaced (new process);
        removed ones leave the catalog at once, then drain in the background (calls in flight get up
        to `drain_seconds`, then are cancelled) and stop; added ones start. The catalog is rebuilt
        and listeners told once; an operator's disable holds. Ids used twice raise
        `RegistrationError` before anything changes."""
        _check_ids(specs)
        return await self.servers.apply(specs, drain_seconds)

    # ---- ServerSetOwner ---------------------------------------------------------

    def client_extensions(self, server_id: str) -> list[ClientExtension]:
        return [TaskStatusExtension(partial(self._task_status, server_id))]

    def retire_callers(self, server_id: str) -> list[Upstream]:
        return self.caller_sessions.retire(server_id)

    def server_removed(self, server_id: str) -> None:
        self.breakers.forget(server_id)
        self.metrics.forget_server(server_id)

    async def rebuild(self) -> None:
        await self._rebuild()

    # ---- UpstreamEvents -------------------------------------------------------

    async def listing_changed(self, upstream: Upstream) -> None:
        if self.servers.current(upstream):  # not one that was replaced or removed
            await self._rebuild()

    async def state_changed(self, upstream: Upstream) -> None:
        level = logging.WARNING if upstream.state == "failed" else logging.INFO
        reason = f" ({upstream.reason})" if upstream.reason else ""
        if not self.servers.current(upstream):
            logger.info("server %r (replaced or removed) is %s%s", upstream.id, upstream.state, reason)
            return
        if upstream.state == "failed" and is_refusal(upstream.reason):
            upstream.stop()  # it starts a gateway that refuses its chain, and would refuse every retry
            reason += "; not retried"
        logger.log(level, "server %r is %s%s", upstream.id, upstream.state, reason)
        if upstream.state == "ready":  # a fresh session (new number) closes the breaker
            self.breakers.session_started(upstream.id, upstream.sessions)
        if upstream.state not in CONNECTED_STATES:  # `idle` too: its listing may just have been loaded
            await self._rebuild()

    async def resource_updated(self, upstream: Upstream, uri: str) -> None:
        from gateway.catalog import expose_uri

        exposed = expose_uri(upstream.spec.prefix, uri)
        for listener in list(self.resource_listeners):
            await listener(exposed)

    async def log_message(self, upstream: Upstream, params: types.LoggingMessageNotificationParams) -> None:
        for listener in list(self.log_listeners):
            await listener(upstream.id, params)

    async def relay_request(
        self, upstream: Upstream, request: types.InputRequest
    ) -> types.InputResponse | types.ErrorData:
        return await self.relay.ask(upstream.id, request)

    async def _task_status(self, server_id: str, params: types.TaskStatusNotificationParams) -> None:
        for listener in list(self.task_status_listeners):
            await listener(server_id, params)

    # ---- catalog --------------------------------------------------------------

    async def revet(self) -> None:
        """Rebuild the catalog from the current listings (after a tool approval changed what is vetted)."""
        await self._rebuild()

    async def _rebuild(self) -> None:
        if self.servers.hold_rebuild():
            return
        upstreams = self.upstreams
        listings: list[ServerListing] = [u.listing for u in upstreams.values() if u.state in LISTED_STATES]
        if self.listing_filter is not None:
            listings = self.listing_filter(listings)
        old, new = self.catalog, build_catalog(listings)

        def down(server_id: str) -> bool:  # down for now: a call may wait for it
            upstream = upstreams.get(server_id)
            return upstream is not None and upstream.state not in (*LISTED_STATES, "disabled")

        self._offline_tools = {
            name: entry
            for name, entry in {**self._offline_tools, **old.tools}.items()
            if name not in new.tools and down(entry.server_id)
        }
        for message in new.collisions:
            if message not in old.collisions:
                logger.warning("name collision: %s", message)
        changed: set[ChangeKind] = set()
        if _items(old.tools) != _items(new.tools):
            changed.add("tools")
        if _items(old.prompts) != _items(new.prompts):
            changed.add("prompts")
        if _items(old.resources) != _items(new.resources) or _items(old.templates) != _items(new.templates):
            changed.add("resources")
        self.catalog = new
        if changed:
            for listener in list(self.change_listeners):
                await listener(changed)

    def tool(self, name: str) -> tuple[Upstream, Entry[types.Tool]]:
        """The upstream of an exposed tool and its catalog entry (upstream name, definition).

        A tool of a server that is down (its tools leave the catalog while it is) is still
        found, so that the call chain can wait for the reconnect or say when it is due.
        Raises `UpstreamUnavailable` for a server that is down and whose tools were never
        seen, `ToolWithheld` for a tool vetting withholds, else `ToolNotFound` naming close ones.
        """
        entry = self.catalog.tools.get(name) or self._offline_tools.get(name)
        if entry is not None:
            return self.upstreams[entry.server_id], entry
        owner = self.owner_of(name)
        if owner is not None and owner.state not in CONNECTED_STATES:
            raise unavailable_error(owner)
        withheld = self.withheld(name) if self.withheld is not None else None
        if withheld is not None:
            raise withheld
        close = difflib.get_close_matches(name, list(self.catalog.tools), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ToolNotFound(f"There is no tool named {name!r}.{hint}")

    def _eta(self, server_id: str) -> float:
        upstream = self.upstreams.get(server_id)
        return upstream.eta() if upstream is not None else math.inf

    async def _wait_ready(self, server_id: str, seconds: float) -> None:
        upstream = self.upstreams.get(server_id)
        if upstream is not None:
            await upstream.wait_ready(seconds)

    def redact(self, server_id: str, text: str) -> str:
        """`text` with the server's configured secrets masked (an unknown server's: unchanged)."""
        upstream = self.upstreams.get(server_id)
        return upstream.redact(text) if upstream is not None else text

    def server_of(self, name: str) -> Upstream | None:
        """The server a tool name resolves to (up or down), else the one its prefix belongs to."""
        entry = self.catalog.tools.get(name) or self._offline_tools.get(name)
        return self.upstreams[entry.server_id] if entry is not None else self.owner_of(name)

    def owner_of(self, name: str) -> Upstream | None:
        """The server whose prefix a `prefix__name` belongs to, whether or not it is up."""
        prefix, separator, _ = name.partition("__")
        if not separator:
            return None
        return next((u for u in self.upstreams.values() if u.spec.prefix == prefix), None)

    def prompt(self, name: str) -> tuple[Upstream, str] | None:
        entry = self.catalog.prompts.get(name)
        return None if entry is None else (self.upstreams[entry.server_id], entry.original)

    def resource(self, uri: str) -> tuple[Upstream, str] | None:
        found = self.catalog.resolve_resource(uri)
        return None if found is None else (self.upstreams[found[0]], found[1])

    def template(self, uri_template: str) -> tuple[Upstream, str] | None:
        found = self.catalog.resolve_template(uri_template)
        return None if found is None else (self.upstreams[found[0]], found[1])

    async def request_as(
        self,
        caller_token: str | None,
        upstream: Upstream,
        operation: str,
        send: Callable[[Any], Awaitable[Any]],
        *,
        timeout: float | None = None,
        account: str | None = None,
    ) -> Any:
        """`upstream.request`, in the caller's own session when the server takes callers' tokens
        (`forward_caller_token: true`) and the caller has one to forward, or acts as each caller's
        own OAuth account (`auth: {per_user: true}`, `account`: the caller's); else the shared session.
        A per-user server never falls back to the shared session (the gateway's own grant)."""
        oauth = upstream.spec.oauth
        if oauth is not None and oauth.per_user:
            if account is None:
                raise UpstreamUnauthorized(
                    f"Server {upstream.id!r} acts as each caller's own account, and this request comes from no "
                    "authenticated caller (the gateway's `auth:` identifies callers by API key or JWT).",
                    server=upstream.id,
                )
            return await self.caller_sessions.request_linked(
                upstream, account, operation, send, timeout=timeout, subject_token=caller_token
            )
        if caller_token and upstream.spec.forward_caller_token:
            return await self.caller_sessions.request(upstream, caller_token, operation, send, timeout=timeout)
        return await upstream.request(operation, send, timeout=timeout)

    def server_health(self, upstream: Upstream, *, stderr: bool = False) -> dict[str, Any]:
        """What `/readyz` and `mcp-gateway servers` say of one server (`gateway.observability.health`)."""
        breaker = self.breakers.state(upstream.id)
        return server_health(upstream, breaker=breaker, tools=self.catalog.server_items(upstream.id), stderr=stderr)

    def _upstream_figures(self) -> list[UpstreamFigures]:
        """Each server's state and breaker, for a metrics scrape."""
        return [UpstreamFigures(u.id, u.state, self.breakers.state(u.id)) for u in list(self.upstreams.values())]

    def _compose(self) -> None:
        outer = [layer for layer in (self._observer, self._recorder) if layer is not None]
        self.call_chain = [*outer, self._counted, *self.admission, *self._core]
        self._run_call = compose(self.call_chain)

    def record_calls(self, recorder: Middleware) -> None:
        """Put the records' middleware outermost in the call chain: it sees final results and refusals."""
        self._recorder = recorder
        self._compose()

    def observe_calls(self, observer: Middleware) -> None:
        """Put the tracing and log-context layer (`gateway.calls.observed`) outermost, around the records'
        one: the call's span is current when its record takes the trace id."""
        self._observer = observer
        self._compose()

    def check_calls(self, limits: LimitsConfig) -> None:
        """Admit only what each caller may call, within `limits`: the scope (`Access`) and limits
        (`CallLimits`) layers go before `runnable`. The serving gateway sets them; a call the gateway
        makes itself (no `caller`) passes them."""
        self.admission = [Access(lambda: self.catalog.tools, self.owner_of), CallLimits(limits), runnable]
        self._compose()

    async def admit(self, name: str, arguments: dict[str, Any] | None, caller: Caller | None) -> None:
        """Run only the admission layers for a call (a task-augmented one, which skips the rest of
        the chain): raises the refusal, if any."""
        await compose(self.admission, innermost=admitted)(self._tool_call(name, arguments, caller=caller))

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        *,
        progress: Any = None,
        meta: Any = None,
        caller_token: str | None = None,
        notes: dict[str, Any] | None = None,
        caller: Caller | None = None,
    ) -> types.CallToolResult:
        """Call an exposed tool through the call chain; gateway errors are raised (`GatewayError`).

        `progress` (an SDK progress callback) and `meta` (request `_meta`) are passed upstream;
        `caller_token` is forwarded only to servers configured to take it;
        `notes` becomes the `ToolCall.notes` (who calls, in; the execution id, out);
        `caller` is who calls, for the admission layers (None: the gateway itself).
        """
        call = self._tool_call(
            name, arguments, caller=caller, progress=progress, meta=meta, caller_token=caller_token, notes=notes
        )
        return await self._run_call(call)

    def _tool_call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        *,
        caller: Caller | None,
        progress: Any = None,
        meta: Any = None,
        caller_token: str | None = None,
        notes: dict[str, Any] | None = None,
    ) -> ToolCall:
        """The `ToolCall` for a name; one that does not resolve carries why (`ToolCall.unresolved`),
        and the admission layers refuse it."""
        try:
            upstream, entry = self.tool(name)
        except GatewayError as error:
            owner = self.owner_of(name)
            server = owner.id if owner is not None else ""
            return unresolved_call(name, server, arguments, error, notes=notes, caller=caller)

        principal = caller.principal if caller is not None else None
        account = account_id(principal.name, principal.issuer) if principal is not None else None

        async def send(args: dict[str, Any] | None) -> types.CallToolResult:
            result = await self.request_as(
                caller_token,
                upstream,
                f"tools/call {name!r}",
                lambda c: lean_calls.call_tool(c, entry.original, args, progress, meta),
                timeout=math.inf,  # `apply_timeout` bounds each attempt with the tool's own timeout
                account=account,
            )
            if not isinstance(result, types.CallToolResult):
                raise ExecutionError(f"Server {upstream.id!r} answered {name!r} with something that is not a result.")
            return naming_exposed_tool(result, entry.original, name)

        return ToolCall(
            server=upstream.id,
            name=name,
            original=entry.original,
            tool=entry.item,
            arguments=arguments,
            send=send,
            timeout=upstream.timeout_for(entry.original),
            idempotent=upstream.idempotent(entry.item, entry.original),
            notes=notes if notes is not None else {},
            caller=caller,
        )


def _has_call_hooks(pm: PluginManager) -> bool:
    hooks = (pm.hook.gateway_before_call, pm.hook.gateway_after_call, pm.hook.gateway_translate_error)
    return any(hook.get_hookimpls() for hook in hooks)


def _items(entries: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, e.item) for k, e in entries.items()]
