"""OpenTelemetry traces: the provider and its exporter, the gateway's own spans, and trace context
on the HTTP hops.

The MCP SDK already makes, through the OpenTelemetry API, a SERVER span for every request the
gateway serves (its parent taken from `params._meta.traceparent`) and a CLIENT span for every
request it sends upstream (injecting `traceparent` into that request's `_meta`). Without a
provider those are no-ops. `start_tracing` installs one (`GATEWAY_TRACING__ENABLED`), exporting
over OTLP as the standard `OTEL_*` variables say, and then:

- `span`, `record_span` and `annotate` give the call chain's spans (validation, each attempt, a
  breaker's refusal, a timeout) and attributes; while tracing is off they cost one global read;
- `TraceContextMiddleware` continues a trace from a downstream HTTP request's `traceparent`
  header (`_meta` still wins, as the SDK reads it first);
- `gateway.upstreams.transports` puts the current context in an HTTP upstream's request headers
  (an httpx request hook, on while a provider is installed), so an HTTP server instrumented on
  its own continues the trace.

While tracing is off nothing of the OpenTelemetry SDK or any exporter is imported: only the API
(which the MCP SDK imports anyway).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, StatusCode
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config.runtime_settings import TracingSettings
from gateway.errors import GatewayError
from gateway.tracer_provider import provider_installed
from gateway.version import installed_version

__all__ = [
    "OTEL_EXTRA_HINT",
    "Tracing",
    "RequestSpans",
    "TraceContextMiddleware",
    "TracingUnavailable",
    "annotate",
    "child_span",
    "current_ids",
    "current_span",
    "current_trace_id",
    "enabled",
    "mark_failed",
    "provider_installed",
    "record_span",
    "skip_idle_request_spans",
    "span",
    "start_root",
    "start_tracing",
]

logger = logging.getLogger(__name__)

OTEL_EXTRA_HINT = "pip install 'mcp-gateway[otel]'"
_GRPC_EXTRA_HINT = "pip install 'mcp-gateway[otel-grpc]'"
_TRACER_NAME = "mcp-gateway"

_tracer: trace.Tracer | None = None
"""The gateway's tracer while tracing is on; None when off (every helper then does nothing)."""
_layer_spans = True
"""`GATEWAY_TRACING__LAYER_SPANS`: whether `span` makes the every-call spans (validation, attempts)."""
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


class TracingUnavailable(Exception):
    """Tracing was asked for, and what it needs is not installed or not understood."""


@dataclass
class Tracing:
    """Tracing as started: `shutdown` exports what is still buffered (call it before exiting)."""

    provider: Any
    """The OpenTelemetry SDK's `TracerProvider`."""
    exporter: str
    """What the spans go to: `otlp http/protobuf`, `otlp grpc`, `console` or `none`."""

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop making spans and export those still buffered, waiting `timeout` seconds at most: the
        exporter retries an unreachable collector for up to its own timeout (10 s by default), and
        a gateway asked to stop must not wait that long. Spans still unsent then are lost."""
        global _tracer
        _tracer = None
        stopping = threading.Thread(target=self.provider.shutdown, name="tracing-shutdown", daemon=True)
        stopping.start()
        stopping.join(timeout)
        if stopping.is_alive():
            logger.warning("tracing: the spans not exported within %g s of shutting down are lost", timeout)


def enabled() -> bool:
    """Whether the gateway makes spans (tracing started and not shut down)."""
    return _tracer is not None


def start_tracing(
    settings: TracingSettings, *, processor: Any = None, instance_id: str | None = None
) -> Tracing | None:
    """Install the process's tracer provider when `settings.enabled`; None when tracing is off.

    The exporter follows `OTEL_TRACES_EXPORTER` (`otlp`, the default; `console`, on stderr; `none`) and, for
    OTLP, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`,
    the default, or `grpc`); the exporter itself reads the endpoint, headers and timeout from the
    `OTEL_EXPORTER_OTLP_*` variables, the provider the sampler (`OTEL_TRACES_SAMPLER`, `..._ARG`)
    and the resource (`OTEL_SERVICE_NAME`, else `mcp-gateway`; `OTEL_RESOURCE_ATTRIBUTES`).
    `processor` replaces the exporter's batch processor (tests collect spans in memory with it).
    """
    global _tracer, _layer_spans
    if not settings.enabled:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"GATEWAY_TRACING__ENABLED is true, but the OpenTelemetry SDK is not installed ({exc.name}): "
            f"{OTEL_EXTRA_HINT}"
        ) from None
    version = installed_version() or "0"
    attributes: dict[str, Any] = {"service.version": version}
    if instance_id is not None:  # the replica (`GATEWAY_REPLICA_ID`), to tell the spans of replicas apart
        attributes["service.instance.id"] = instance_id
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "mcp-gateway"
    provider = TracerProvider(resource=Resource.create(attributes))
    if processor is not None:
        provider.add_span_processor(processor)
        described = "given processor"
    else:
        exporter, described = _exporter()
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer(_TRACER_NAME, version)
    _layer_spans = settings.layer_spans
    logger.info("tracing on: spans go to %s", described)
    return Tracing(provider, described)


def _exporter() -> tuple[Any, str]:
    """The span exporter the `OTEL_*` variables ask for, and how to name it in a log line."""
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if kind == "none":
        return None, "none"
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr, never stdout: stdout carries the MCP protocol under `serve --transport stdio`.
        return ConsoleSpanExporter(out=sys.stderr), "console (stderr)"
    if kind != "otlp":
        raise TracingUnavailable(f"OTEL_TRACES_EXPORTER={kind!r} is not supported: use otlp, console or none.")
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    )
    protocol = protocol.strip().lower() or "http/protobuf"
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise TracingUnavailable(
                f"OTLP over gRPC needs the gRPC exporter, which is not installed: {_GRPC_EXTRA_HINT} "
                "(or use OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
            ) from None
        return GrpcExporter(), "otlp grpc"
    if protocol != "http/protobuf":
        raise TracingUnavailable(f"OTLP protocol {protocol!r} is not supported: use http/protobuf or grpc.")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    except ImportError:
        raise TracingUnavailable(
            f"OTLP over HTTP needs the OTLP exporter, which is not installed: {OTEL_EXTRA_HINT}"
        ) from None
    return HttpExporter(), "otlp http/protobuf"


# ---- spans ------------------------------------------------------------------------------


def span(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the current one around a block, made current within it; an exception
    leaving the block sets its status and `error.type` (`mark_failed`). Nothing when tracing is off,
    or when the current span does not record (a trace the sampler left out: its children would
    not be sampled either, and making them costs as much as recording them), or when
    `GATEWAY_TRACING__LAYER_SPANS` is false."""
    if _tracer is None or not _layer_spans or not trace.get_current_span().is_recording():
        return _OFF
    return _span(_tracer, name, attributes)


def child_span(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current one, made current, whatever `GATEWAY_TRACING__LAYER_SPANS` says: for
    a call made inside another request (a code-mode program's inner call), which must not annotate that
    request's span as its own. Nothing when tracing is off or the current span does not record."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return _OFF
    return _span(_tracer, name, attributes)


class _Span:
    """A span made current for a block: `start_span`, attach, detach, end, without the two generator
    context managers `start_as_current_span` stacks (a few microseconds per span on the call path)."""

    __slots__ = ("_span", "_token")

    def __init__(self, tracer: trace.Tracer, name: str, attributes: Mapping[str, Any] | None) -> None:
        self._span = tracer.start_span(name, attributes=attributes)
        self._token: Any = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        if error is not None:
            mark_failed(self._span, error)
        otel_context.detach(self._token)
        self._span.end()


def _span(tracer: trace.Tracer, name: str, attributes: Mapping[str, Any] | None) -> _Span:
    return _Span(tracer, name, attributes)


def record_span(
    name: str, error: BaseException, *, started_ns: int | None = None, attributes: Mapping[str, Any] | None = None
) -> None:
    """A span for something already over, that failed: a breaker's refusal (instant), a timeout
    (from `started_ns`, a `time.time_ns()`, until now). Nothing when tracing is off or the current
    span does not record."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return
    ended = _tracer.start_span(name, attributes=attributes, start_time=started_ns or time.time_ns())
    mark_failed(ended, error)
    ended.end()


def mark_failed(target: Span, error: BaseException) -> None:
    """Error status, and `error.type`: a gateway error's model-facing code, else the exception's type."""
    if isinstance(error, GatewayError):
        target.set_attribute("error.type", error.code)
        target.set_status(StatusCode.ERROR, error.message)
    elif isinstance(error, Exception):
        target.set_attribute("error.type", type(error).__qualname__)
        target.set_status(StatusCode.ERROR, str(error))
    else:  # a cancellation (the caller went away, or an outer deadline): not the upstream's failure
        target.set_attribute("error.type", "cancelled")
        target.set_status(StatusCode.ERROR, "cancelled")


def current_span() -> Span | None:
    """The current span if tracing is on and it records (the SDK's server span, or one of ours)."""
    if _tracer is None:
        return None
    found = trace.get_current_span()
    return found if found.is_recording() else None


def annotate(attributes: Mapping[str, Any]) -> None:
    """Add attributes to the current span (nothing when tracing is off or it does not record)."""
    target = current_span()
    if target is not None:
        target.set_attributes(attributes)


def current_trace_id() -> str | None:
    """The current trace id as 32 hex digits, or None (tracing off, or no trace)."""
    if _tracer is None:
        return None
    found = trace.get_current_span().get_span_context()
    return format(found.trace_id, "032x") if found.is_valid else None


def current_ids() -> tuple[str, str] | None:
    """`(trace id, span id)` in hex of the current span, whether tracing is on or a client's
    context was merely attached; None when there is none."""
    found = trace.get_current_span().get_span_context()
    if not found.is_valid:
        return None
    return format(found.trace_id, "032x"), format(found.span_id, "016x")


def start_root(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """An INTERNAL span made current when there is no span at all (a call that reaches the chain
    outside any served request), so it still gets a trace; nothing under a span, sampled or not."""
    if _tracer is None or trace.get_current_span().get_span_context().is_valid:
        return _OFF
    return _span(_tracer, name, attributes)


# ---- the SDK's request spans ------------------------------------------------------------------


class RequestSpans:
    """The SDK's `OpenTelemetryMiddleware` (a SERVER span around every request the gateway serves), run only
    when it can make a difference: a tracer provider is installed (ours or anyone's), or the request's
    `_meta` carries a `traceparent`, whose context the SDK's middleware makes current even with no
    provider (JSON log lines then carry the client's trace id). Otherwise it would only extract nothing,
    start a span that is no span and attach it: a few percent of a proxied call's CPU, for nothing."""

    __slots__ = ("sdk",)

    def __init__(self, sdk: Any) -> None:
        self.sdk = sdk

    def __call__(self, ctx: Any, call_next: Any) -> Any:
        """The rest of the chain's awaitable as it is when there is nothing to trace (no coroutine of its own)."""
        meta = ctx.meta
        if _tracer is None and not (meta and "traceparent" in meta) and not provider_installed():
            return call_next(ctx)
        return self.sdk(ctx, call_next)


def skip_idle_request_spans(middleware: list[Any]) -> None:
    """Wrap the SDK's `OpenTelemetryMiddleware` in a server's middleware list in `RequestSpans`, in place."""
    from mcp.server._otel import OpenTelemetryMiddleware  # the SDK's (mcp 2.3), on by default in every server

    for index, layer in enumerate(middleware):
        if isinstance(layer, OpenTelemetryMiddleware):
            middleware[index] = RequestSpans(layer)


# ---- propagation over HTTP ------------------------------------------------------------------


class TraceContextMiddleware:
    """ASGI middleware: a request's W3C `traceparent`/`tracestate` headers become the current
    context while it is handled, so the SDK's server span continues the caller's trace (a
    `traceparent` in the request's `_meta` still takes precedence). Installed only when tracing is on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope.get("headers", ())
            if key in (b"traceparent", b"tracestate")
        }
        if "traceparent" not in carrier:
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)
