"""The outermost layer of the call chain: plugins' `gateway_before_call`, `gateway_after_call`
and `gateway_translate_error` hooks (see gateway/hookspecs.py for what each may do)."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import mcp_types as types
import pluggy

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import ExecutionError, GatewayError

__all__ = ["PluginHooks"]

logger = logging.getLogger(__name__)


class PluginHooks:
    """The middleware that runs the plugins' call hooks around the rest of the chain."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        try:
            result = await self._run(call, call_next)
        except GatewayError as error:
            translated = await self._first("gateway_translate_error", call=call, error=error)
            if translated is None:
                raise
            return translated
        return result

    async def _run(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        hooks = self.pm.hook
        result: types.CallToolResult | None = None
        for impl in hooks.gateway_before_call.get_hookimpls():
            result = await self._one(impl, "gateway_before_call", call=call)
            if result is not None:
                break
        if result is None:
            result = await call_next(call)
        for impl in reversed(hooks.gateway_after_call.get_hookimpls()):
            replaced = await self._one(impl, "gateway_after_call", call=call, result=result)
            if replaced is not None:
                result = replaced
        return result

    async def _first(self, hook: str, **kwargs: Any) -> types.CallToolResult | None:
        for impl in getattr(self.pm.hook, hook).get_hookimpls():  # plugin order, as the before-hooks
            result = await self._one(impl, hook, **kwargs)
            if result is not None:
                return result
        return None

    async def _one(self, impl: pluggy.HookImpl, hook: str, **kwargs: Any) -> types.CallToolResult | None:
        """Call one plugin's hook (sync or async) with the arguments it takes; check what it returns."""
        plugin = impl.plugin_name
        try:
            value = impl.function(**{name: kwargs[name] for name in impl.argnames})
            if inspect.isawaitable(value):
                value = await value
        except GatewayError:
            raise
        except Exception as exc:  # boundary: a plugin's bug becomes one clear error, not a crash
            logger.exception("plugin %r failed in %s", plugin, hook)
            raise ExecutionError(f"Plugin {plugin!r} failed in {hook}: {type(exc).__name__}: {exc}") from None
        if value is not None and not isinstance(value, types.CallToolResult):
            raise ExecutionError(
                f"Plugin {plugin!r} returned a {type(value).__name__} from {hook}; expected a CallToolResult or None."
            )
        return value
