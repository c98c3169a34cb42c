"""Whether a tracer provider is installed, asked on every call with tracing off.

`opentelemetry.trace.get_tracer_provider()` looks into `os.environ` on each call until a provider
is set: a third of a proxied call's tracing-off cost when both the serving side
(`gateway.observability.tracing`) and the upstream side (`gateway.upstreams.lean_calls`) ask it.
This module sits below both, so that they ask the same cheaper question.
"""

from __future__ import annotations

import os

from opentelemetry import trace

__all__ = ["provider_installed"]

_NAMED_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER"
"""The variable naming a provider the API loads on first use (`opentelemetry.environment_variables`)."""

_provider_named = _NAMED_PROVIDER in os.environ
"""Read once, at import: the API itself reads it only until a provider is set."""


def provider_installed() -> bool:
    """Whether the process has a tracer provider (anyone's), as `get_tracer_provider` would say: the
    API sets its global once and never unsets it, so it is read as it is; a provider named in the
    environment counts as installed (the API loads it on first use, as before)."""
    if getattr(trace, "_TRACER_PROVIDER", None) is not None or _provider_named:
        return True
    return not hasattr(trace, "_TRACER_PROVIDER") and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    )
