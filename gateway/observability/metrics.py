"""Prometheus metrics of one gateway, served as `GET /metrics` on the HTTP transport.

Each gateway owns its own `CollectorRegistry` (never the library's global default), so
several gateways in one process, and the tests, count apart. Two kinds of figures:

- events, counted as they happen: tool calls by server, tool and status; errors by
  code; call latency by server; calls in flight; searches and their latency (the call
  chain's `gateway.calls.metrics` middleware and `ToolHandlers.search` record them);
- states, read when Prometheus scrapes: each upstream's state and circuit breaker, the
  router's embedding work, records the records store had to drop, and open HTTP sessions. Each
  is a callable its owner plugs in (`watch_upstreams`, `watch_router`, `watch_records_dropped`,
  `watch_sessions`), so the
  metrics import none of the parts they describe: the registry, the router and the call
  chain all record into them.

Label values are server ids, exposed tool names, error codes and fixed words: never
arguments, queries or results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.errors import error_class

__all__ = [
    "CONTENT_TYPE",
    "NO_SERVER",
    "CallStatus",
    "GatewayMetrics",
    "RouterFigures",
    "Running",
    "SearchStatus",
    "UpstreamFigures",
]

logger = logging.getLogger(__name__)

NO_SERVER = "(no server)"
"""The `server` label of calls to a tool that no server owns."""
CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of `GatewayMetrics.exposition()`: the Prometheus text format."""

CallStatus = Literal["success", "error", "timeout", "cancelled"]
SearchStatus = Literal["success", "error", "timeout"]

CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds: from an in-memory plugin's sub-millisecond answer to a slow remote tool's minutes."""
SEARCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds: a warm search takes milliseconds, one waiting for the first index up to its timeout."""


@dataclass(frozen=True)
class UpstreamFigures:
    """One upstream server as a scrape sees it: its state and its circuit breaker's."""

    server: str
    state: str
    breaker: str


@dataclass(frozen=True)
class RouterFigures:
    """The router's embedding work as a scrape sees it."""

    semantic: bool
    """Searches use the embedding model (not BM25 alone)."""
    embedded: int
    cached: int
    pending: int


class GatewayMetrics:
    """Every metric of one gateway, in its own registry. Recording is cheap and never raises."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "mcp_gateway_tool_calls", "Proxied tool calls, by outcome.", ["server", "tool", "status"], registry=r
        )
        self.errors = Counter(
            "mcp_gateway_tool_call_errors",
            "Tool calls that failed, by error code (tool_error: the server's own error result) and by whose "
            "failure it is: class caller (an unknown tool, bad arguments), upstream or gateway.",
            ["server", "code", "class"],
            registry=r,
        )
        self.latency = Histogram(
            "mcp_gateway_tool_call_duration_seconds",
            "Time from the call entering the call chain to its result, retries included.",
            ["server"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.replica = Gauge(
            "mcp_gateway_replica",
            "This process's replica id (GATEWAY_REPLICA_ID) as the label `replica`; the value is always 1.",
            ["replica"],
            registry=r,
        )
        self.in_flight = Gauge("mcp_gateway_tool_calls_in_flight", "Tool calls running now.", ["server"], registry=r)
        self.searches = Counter("mcp_gateway_searches", "Tool searches, by outcome.", ["status"], registry=r)
        self.search_latency = Histogram(
            "mcp_gateway_search_duration_seconds",
            "Time a tool search took (search_tools, POST /route).",
            buckets=SEARCH_BUCKETS,
            registry=r,
        )
        self.loop_stalls = Counter(
            "mcp_gateway_event_loop_stalls",
            "Times the event loop was held past GATEWAY_LOOP_STALL_THRESHOLD, by the plugin whose code held it "
            "(`-`: no plugin code on the stack).",
            ["plugin"],
            registry=r,
        )
        self._call_children: dict[tuple[str, str, str], Counter] = {}
        self._server_children: dict[str, tuple[Running, Histogram]] = {}
        self._error_codes: dict[str, set[tuple[str, str]]] = {}
        self._state = _StateCollector()
        r.register(self._state)

    def identify(self, replica: str) -> None:
        """Name this process among the replicas (`mcp_gateway_replica{replica=...} 1`); once, at start."""
        self.replica.clear()
        self.replica.labels(replica).set(1)

    # ---- what is read at scrape time ------------------------------------------------

    def watch_upstreams(
        self, read: Callable[[], Iterable[UpstreamFigures]], states: Sequence[str], breaker_states: Sequence[str]
    ) -> None:
        """Report each upstream's state and circuit breaker, as `read()` gives them at each scrape;
        `states` and `breaker_states` are every value each can take (one gauge per value)."""
        self._state.upstreams = read
        self._state.server_states = tuple(states)
        self._state.breaker_states = tuple(breaker_states)

    def watch_router(self, read: Callable[[], RouterFigures]) -> None:
        """Report the router's embedding work (documents embedded vs found in the cache)."""
        self._state.router = read

    def watch_sessions(self, count: Callable[[], int]) -> None:
        """Report `count()` as `mcp_gateway_http_sessions`: the streamable-HTTP sessions open now."""
        self._state.sessions = count

    def watch_records_dropped(self, dropped: Callable[[], int]) -> None:
        """Report `dropped()` as `mcp_gateway_records_dropped_total`: records the store lost
        (buffer full, database down). The records writer exposes such a count."""
        self._state.records_dropped = dropped

    # ---- events -----------------------------------------------------------------------

    def observe_call(self, server: str, tool: str, status: CallStatus, code: str | None, seconds: float) -> None:
        """Count one call; `server` is empty for a tool no server owns (`NO_SERVER` in the labels)."""
        server = server or NO_SERVER
        key = (server, tool, status)
        counter = self._call_children.get(key)
        if counter is None:
            counter = self._call_children[key] = self.calls.labels(server, tool, status)
        counter.inc()
        if code is not None:
            labels = (code, error_class(code) or "gateway")
            self.errors.labels(server, *labels).inc()
            self._error_codes.setdefault(server, set()).add(labels)
        self.server_children(server)[1].observe(seconds)

    def server_children(self, server: str) -> tuple[Running, Histogram]:
        """The calls running now and the latency histogram of one server (`labels()` looked up once).
        The gauge of the calls in flight reads `Running.calls` when scraped: a call only counts."""
        server = server or NO_SERVER
        children = self._server_children.get(server)
        if children is None:
            running = Running()
            self.in_flight.labels(server).set_function(running.read)
            children = self._server_children[server] = (running, self.latency.labels(server))
        return children

    def forget_server(self, server: str) -> None:
        """Drop a removed server's series, so a scrape no longer reports it."""
        for key in [key for key in self._call_children if key[0] == server]:
            del self._call_children[key]
            self.calls.remove(*key)
        for labels in self._error_codes.pop(server, set()):
            self.errors.remove(server, *labels)
        if self._server_children.pop(server, None) is not None:
            self.in_flight.remove(server)
            self.latency.remove(server)

    def observe_search(self, status: SearchStatus, seconds: float) -> None:
        self.searches.labels(status).inc()
        self.search_latency.observe(seconds)

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class Running:
    """The calls of one server running now: counted on the event loop, read by a scrape. A server
    forgotten (`forget_server`) and seen again gets a new one; calls still running count in the old."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> float:
        return float(self.calls)


class _StateCollector(Collector):
    """Reads states when scraped, so a gauge is never stale and nothing polls in between."""

    def __init__(self) -> None:
        self.upstreams: Callable[[], Iterable[UpstreamFigures]] | None = None
        self.server_states: tuple[str, ...] = ()
        self.breaker_states: tuple[str, ...] = ()
        self.router: Callable[[], RouterFigures] | None = None
        self.records_dropped: Callable[[], int] | None = None
        self.sessions: Callable[[], int] | None = None

    def describe(self) -> Iterable[Metric]:
        return []  # families depend on what is watched; describing none keeps registration lazy

    def collect(self) -> Iterator[Metric]:
        if self.upstreams is not None:
            yield from self._upstreams(self.upstreams)
        if self.router is not None:
            yield from self._router(self.router())
        if self.records_dropped is not None:
            yield from self._records_dropped(self.records_dropped)
        if self.sessions is not None:
            sessions = GaugeMetricFamily(
                "mcp_gateway_http_sessions",
                "Streamable-HTTP sessions open now (handshake-era clients; closed by DELETE or when idle).",
            )
            sessions.add_metric([], float(self.sessions()))
            yield sessions

    def _upstreams(self, read: Callable[[], Iterable[UpstreamFigures]]) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            "mcp_gateway_upstream_state",
            "1 for the state each upstream server is in, 0 for the others.",
            labels=["server", "state"],
        )
        breakers = GaugeMetricFamily(
            "mcp_gateway_circuit_breaker_state",
            "1 for the state of each server's circuit breaker, 0 for the others.",
            labels=["server", "state"],
        )
        for upstream in read():
            for state in self.server_states:
                states.add_metric([upstream.server, state], 1.0 if upstream.state == state else 0.0)
            for state in self.breaker_states:
                breakers.add_metric([upstream.server, state], 1.0 if upstream.breaker == state else 0.0)
        yield states
        yield breakers

    def _router(self, figures: RouterFigures) -> Iterator[Metric]:
        dense = GaugeMetricFamily(
            "mcp_gateway_router_semantic", "1 once searches use the embedding model, 0 while BM25 alone serves."
        )
        dense.add_metric([], 1.0 if figures.semantic else 0.0)
        yield dense
        embedded = CounterMetricFamily(
            "mcp_gateway_router_documents_embedded", "Tool documents this process embedded with the model."
        )
        embedded.add_metric([], float(figures.embedded))
        yield embedded
        cached = CounterMetricFamily(
            "mcp_gateway_router_documents_cached",
            "Tool documents whose embedding came from the embedding cache (SQLite file or PostgreSQL).",
        )
        cached.add_metric([], float(figures.cached))
        yield cached
        pending = GaugeMetricFamily(
            "mcp_gateway_router_documents_pending",
            "Tools whose full text is not embedded yet (the router ranks them by their short text meanwhile).",
        )
        pending.add_metric([], float(figures.pending))
        yield pending

    def _records_dropped(self, dropped: Callable[[], int]) -> Iterator[Metric]:
        try:
            value = float(dropped())
        except Exception:  # boundary: a scrape must not fail because one source did
            logger.exception("metrics: reading the records store's dropped count failed")
            return
        family = CounterMetricFamily(
            "mcp_gateway_records_dropped", "Execution records lost without being written (buffer full, store down)."
        )
        family.add_metric([], value)
        yield family
