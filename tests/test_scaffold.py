"""`mcp-gateway new-plugin`: the scaffolded plugin loads, serves its tool, and its own test passes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from gateway.settings import PluginSettings, Settings
from tests.conftest import REPO, call_plugin_tool


def _new_plugin(tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GATEWAY_PLUGINS__DIRECTORY": str(tmp_path / "plugins")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "new-plugin", name, "--tests", str(tmp_path / "tests")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_new_plugin_writes_a_plugin_that_serves_its_tool_and_a_test_that_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = _new_plugin(tmp_path, "hello")
    assert done.returncode == 0, done.stderr
    assert f"wrote {tmp_path / 'plugins' / 'hello' / '__init__.py'}" in done.stdout

    settings = Settings(
        data_dir=tmp_path / "data", plugins=PluginSettings(directory=tmp_path / "plugins", entry_points=False)
    )
    result = anyio.run(call_plugin_tool, settings, "hello__greet", {"who": "Ada"})
    assert result.content[0].text == "Hello, Ada!"  # type: ignore[union-attr]

    # The generated test imports `plugins.hello`: run it with tmp_path as the project root.
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in [m for m in sys.modules if m == "plugins" or m.startswith("plugins.")]:
        monkeypatch.delitem(sys.modules, module)
    spec = importlib.util.spec_from_file_location("test_hello_plugin", tmp_path / "tests" / "test_hello_plugin.py")
    assert spec is not None and spec.loader is not None
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    generated.test_greet_says_hello()


@pytest.mark.parametrize("name", ["Hello", "1st", "with-dash", "x" * 40])
def test_a_name_that_cannot_be_a_plugin_is_refused(tmp_path: Path, name: str) -> None:
    done = _new_plugin(tmp_path, name)
    assert done.returncode == 2 and "cannot be a plugin name" in done.stderr
    assert not (tmp_path / "plugins").exists()


def test_existing_files_are_never_overwritten(tmp_path: Path) -> None:
    assert _new_plugin(tmp_path, "hello").returncode == 0
    again = _new_plugin(tmp_path, "hello")
    assert again.returncode == 2 and "not overwriting" in again.stderr
