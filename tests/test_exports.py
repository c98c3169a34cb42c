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
