"""The chain every proxied tool call runs through, one concern per module.

    metrics     counts every call, its outcome and its time (Prometheus, `gateway.observability.metrics`)
    plugin_hooks  plugins' before/after/translate-error hooks (when a plugin has one)
    validation  arguments checked against the tool's inputSchema before anything is sent
    retry       annotation-aware retries (tenacity), bounded in attempts and time
    breaker     one circuit breaker per upstream
    timeout     the per-call deadline (server default, tool overrides); cancels upstream

`chain.compose` puts them in that order around the call that reaches the upstream.
"""

from gateway.calls.chain import CallHandler, Middleware, ToolCall, compose

__all__ = ["CallHandler", "Middleware", "ToolCall", "compose"]
