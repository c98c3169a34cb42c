"""The chain every proxied tool call runs through, one concern per module.

    (records)   outermost when records are on: every call, refused or not (`gateway.records.recorder`)
    access      admission: the caller's scope; a hidden tool is not found, exactly like an unknown one
    limits      admission: calls per session, argument size
    runnable    admission: a name that did not resolve, a tool the client cannot run (tasks)
    metrics     counts every call, its outcome and its time (Prometheus, `gateway.observability.metrics`)
    plugin_hooks  plugins' before/after/translate-error hooks (when a plugin has one)
    validation  arguments checked against the tool's inputSchema before anything is sent
    retry       annotation-aware retries (tenacity), bounded in attempts and time
    breaker     one circuit breaker per upstream
    timeout     the per-call deadline (server default, tool overrides); cancels upstream

`chain.compose` puts them in that order around the call that reaches the upstream
(`Registry.call_chain`). An admission layer that refuses a call marks it (`chain.refuse`), so the
records keep it as refused; task-augmented calls pass the admission layers alone (`Registry.admit`).
"""

from gateway.calls.chain import Caller, CallHandler, Middleware, ToolCall, compose

__all__ = ["CallHandler", "Caller", "Middleware", "ToolCall", "compose"]
