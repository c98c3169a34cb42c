"""`mcp-gateway new-plugin`: the scaffolded plugin loads, serves its tool, and its own test passes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from gateway.config.runtime_settings import PluginSettings
from gateway.config.settings import Settings
from tests.conftest import REPO, call_plugin_tool


def _new_plugin(
    tmp_path: Path, name: str, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`new-plugin NAME` for the config `tmp_path/gateway.yaml`, run from another directory."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | (env or {})
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "gateway", "new-plugin", name, "--config", str(tmp_path / "gateway.yaml"), *options],
        capture_output=True,
        text=True,
        env=environment | {"PYTHONPATH": str(REPO)},
        cwd=tmp_path / "elsewhere",
        stdin=subprocess.DEVNULL,  # not a terminal: a question becomes an error that names the flag
        timeout=60,
    )


def test_new_plugin_writes_a_plugin_that_serves_its_tool_and_a_test_that_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = _new_plugin(tmp_path, "hello", "--tests", str(tmp_path / "tests"))
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
    generated.test_greet_is_served_behind_the_gateway()


def test_new_plugin_writes_beside_the_config_file_where_the_gateway_and_pytest_find_it(tmp_path: Path) -> None:
    done = _new_plugin(tmp_path, "hello")
    assert done.returncode == 0, done.stderr
    plugin, test = tmp_path / "plugins" / "hello" / "__init__.py", tmp_path / "tests" / "test_hello_plugin.py"
    assert done.stdout.splitlines()[:2] == [f"wrote {plugin}", f"wrote {test}"]
    assert not list((tmp_path / "elsewhere").iterdir())  # nothing in the current directory

    # What the printed next step says: its test passes, run with pytest from the config's folder.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PYTHONPATH"))}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout


def test_a_plugin_directory_that_is_not_a_package_name_is_refused(tmp_path: Path) -> None:
    refused = _new_plugin(tmp_path, "hello", env={"GATEWAY_PLUGINS__DIRECTORY": "my-plugins"})
    assert refused.returncode == 2
    assert "my-plugins is not named like a Python package" in refused.stderr
    assert not (tmp_path / "my-plugins").exists()


@pytest.mark.parametrize("name", ["Hello", "1st", "with-dash", "x" * 40])
def test_a_name_that_cannot_be_a_plugin_is_refused(tmp_path: Path, name: str) -> None:
    done = _new_plugin(tmp_path, name)
    assert done.returncode == 2 and "cannot be a plugin name" in done.stderr
    assert not (tmp_path / "plugins").exists()


def test_existing_files_are_never_overwritten(tmp_path: Path) -> None:
    assert _new_plugin(tmp_path, "hello").returncode == 0
    again = _new_plugin(tmp_path, "hello")
    assert again.returncode == 2 and "not overwriting" in again.stderr


def test_new_plugin_on_a_fresh_install_writes_a_config_so_every_printed_next_step_runs(tmp_path: Path) -> None:
    """No config file yet: `new-plugin` writes one, and the `tools` command it prints then lists the tool."""
    done = _new_plugin(tmp_path, "hello")
    assert done.returncode == 0, done.stderr
    config = tmp_path / "gateway.yaml"
    assert f"wrote {config}" in done.stdout.splitlines()
    [tools_step] = [line for line in done.stdout.splitlines() if "tools --server hello" in line]
    command = tools_step.split("`")[1].split()
    assert command[0] == "mcp-gateway"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | {
        "GATEWAY_EMBEDDING__ENABLED": "false"
    }
    listed = subprocess.run(
        [sys.executable, "-m", "gateway", *command[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "hello__greet" in listed.stdout
    # The test step names the gateway's own interpreter, which has the gateway (and here, pytest).
    assert f"`{sys.executable} -m pytest {tmp_path / 'tests' / 'test_hello_plugin.py'}`" in done.stdout
    assert "pytest is not installed" not in done.stdout


def test_new_plugin_says_to_install_pytest_when_it_is_missing(tmp_path: Path) -> None:
    """An interpreter without pytest (`find_spec` answers None for it): the next step says what to install."""
    script = (
        "import importlib.util, sys; find = importlib.util.find_spec; "
        "importlib.util.find_spec = lambda name, *a: None if name == 'pytest' else find(name, *a); "
        "from gateway.cli.main import run; sys.exit(run())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "new-plugin", "hello", "--config", str(tmp_path / "gateway.yaml")],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | {"PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"pytest is not installed: `{sys.executable} -m pip install pytest`, then" in done.stdout


def test_a_name_an_installed_plugin_has_needs_replace(tmp_path: Path) -> None:
    refused = _new_plugin(tmp_path, "clock")
    assert refused.returncode == 2
    assert "an installed plugin is named 'clock' (package mcp-gateway " in refused.stderr
    assert "a plugin directory 'clock' would replace it: choose another name, or pass --replace" in refused.stderr
    assert not (tmp_path / "plugins").exists()

    replaced = _new_plugin(tmp_path, "clock", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert (tmp_path / "plugins" / "clock" / "__init__.py").is_file()
