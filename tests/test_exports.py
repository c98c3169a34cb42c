"""Every public module says what it exports, and exports what it says."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import gateway

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(gateway.__path__, prefix="gateway.") if info.name != "gateway.__main__"
)


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_all_and_every_name_in_it_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None and hasattr(module, "__path__"):  # a package that only groups its modules
        public = [n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)]
        assert not public, f"{name} defines {public} without an __all__"
        return
    assert exported is not None, f"{name} has no __all__"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names missing attributes: {missing}"


def _kind(value: object) -> str:
    if inspect.isclass(value):
        return "class"
    if inspect.isfunction(value):
        return "function"
    return type(value).__name__


def test_the_gateway_package_exports_exactly_the_hookimpl_marker() -> None:
    """A plugin author's `from gateway import hookimpl`: the package exports that and nothing else."""
    from gateway.hookspecs import hookimpl

    assert gateway.__all__ == ["hookimpl"]
    assert gateway.hookimpl is hookimpl


def test_the_plugin_api_in_gateway_hookspecs_is_exactly_what_the_plugin_guide_documents() -> None:
    """Like httpx's test_exported_members: a name added to or dropped from the plugin API fails here,
    so a change of the API is a decision, not a side effect of moving code."""
    from gateway import hookspecs

    exported = {name: _kind(getattr(hookspecs, name)) for name in hookspecs.__all__}
    assert exported == {
        "PROJECT_NAME": "str",
        "RegisterServer": "class",
        "gateway_after_call": "function",
        "gateway_before_call": "function",
        "gateway_embedder": "function",
        "gateway_enrich_tool": "function",
        "gateway_register_servers": "function",
        "gateway_translate_error": "function",
        "hookimpl": "HookimplMarker",
        "hookspec": "HookspecMarker",
    }
    assert hookspecs.PROJECT_NAME == "mcp_gateway"
    # Pluggy passes hook arguments by name: a renamed parameter breaks every plugin that uses it.
    parameters = {
        n: list(inspect.signature(getattr(hookspecs, n)).parameters) for n in exported if n.startswith("gateway_")
    }
    assert parameters == {
        "gateway_after_call": ["call", "result"],
        "gateway_before_call": ["call"],
        "gateway_embedder": ["settings"],
        "gateway_enrich_tool": ["tool", "server_id"],
        "gateway_register_servers": ["register", "settings", "config"],
        "gateway_translate_error": ["call", "error"],
    }
