"""The gateway as users install and start it: a wheel in a fresh venv, and the README's Claude Desktop command,
run from directories that are not the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import EXAMPLE_CONFIG, REPO

BUILTINS = ("clock", "notes", "openapi", "sql")
CONVERT = {"time": "2025-01-15T12:00:00", "from_timezone": "UTC", "to_timezone": "Asia/Tokyo"}


def _user_env(data: Path) -> dict[str, str]:
    """A user's environment: no GATEWAY_* settings of the test session, nothing from the repository on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k != "PYTHONPATH"}
    return env | {"GATEWAY_DATA_DIR": str(data), "GATEWAY_LOG_LEVEL": "WARNING", "PIP_NO_INDEX": "1"}


def _run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


class Installed:
    """A wheel built from the sources, installed alone into a fresh venv (its dependencies lent by the project's)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wheel = self._build(root)
        self.venv = root / "venv"
        self.bin = self.venv / "bin"
        env = _user_env(root / "data")
        _run(sys.executable, "-m", "venv", "--without-pip", self.venv, cwd=root, env=env)
        site = Path(
            _run(
                self.bin / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=root, env=env
            ).stdout.strip()
        )
        # Only the dependencies come from the project's venv: the .pth adds its site-packages after the fresh
        # one, and a path listed in a .pth file has its own .pth files (the editable install's finder) ignored.
        (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
        pip = (sys.executable, "-m", "pip", "--python", self.bin / "python", "install", "--no-deps", "--no-index")
        _run(*pip, self.wheel, cwd=root, env=env)
        self.site = site

    @staticmethod
    def _build(root: Path) -> Path:
        """`pip wheel` on a copy of the sources, so no build output lands in the repository."""
        source = root / "source"
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in ("gateway", "plugins"):
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, source / name)
        wheels = root / "wheels"
        pip = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source)
        _run(*pip, cwd=root, env=_user_env(root / "data"))
        [wheel] = wheels.glob("mcp_gateway-*.whl")
        return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(tmp_path_factory.mktemp("packaging"))


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory `cwd` that is not the repository, and the example config copied into `conf`."""
    (tmp_path / "cwd").mkdir()
    (tmp_path / "conf").mkdir()
    shutil.copy(EXAMPLE_CONFIG, tmp_path / "conf" / "external-mcps.yaml")
    return tmp_path


def _started_in(elsewhere: Path) -> dict[str, Any]:
    return {"cwd": elsewhere / "cwd", "env": _user_env(elsewhere / "data"), "timeout": 120}


def test_the_wheel_holds_every_package_and_the_example_spec_but_no_top_level_plugins(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    sources = {p.relative_to(REPO).as_posix() for d in ("gateway", "plugins") for p in (REPO / d).rglob("*.py")}
    expected = {re.sub(r"^plugins/", "mcp_gateway_plugins/", s) for s in sources}
    assert expected <= names, sorted(expected - names)
    assert "mcp_gateway_plugins/openapi/examples/github-public.json" in names
    assert not any(n.startswith("plugins/") for n in names)
    assert not (installed.site / "plugins").exists()


def test_the_installed_gateway_is_imported_from_the_fresh_venv(installed: Installed, elsewhere: Path) -> None:
    code = "import gateway, mcp_gateway_plugins.clock as c; print(gateway.__file__); print(c.__file__)"
    files = _run(installed.bin / "python", "-c", code, **_started_in(elsewhere)).stdout.splitlines()
    assert len(files) == 2 and all(Path(f).is_relative_to(installed.site) for f in files), files


def test_the_installed_gateway_lists_the_built_ins_as_entry_points(installed: Installed, elsewhere: Path) -> None:
    config = elsewhere / "conf" / "external-mcps.yaml"
    done = _run(installed.bin / "mcp-gateway", "plugins", "--json", "--config", config, **_started_in(elsewhere))
    infos = [(i["name"], i["source"], i["status"]) for i in json.loads(done.stdout)]
    assert infos == [(n, f"entry point mcp_gateway_plugins.{n}", "loaded") for n in BUILTINS]


def test_the_installed_gateway_checks_the_example_config_from_another_directory(
    installed: Installed, elsewhere: Path
) -> None:
    config = elsewhere / "conf" / "external-mcps.yaml"
    done = _run(installed.bin / "mcp-gateway", "--config", config, "check", "--json", **_started_in(elsewhere))
    servers = {s["server"]: s for s in json.loads(done.stdout)["servers"]}
    assert {n: servers[n]["status"] for n in BUILTINS} == dict.fromkeys(BUILTINS, "ok")
    assert servers["openapi"]["tools"] == 2
    assert (elsewhere / "data" / "demo-shop.sqlite").is_file()  # the sql plugin's database, in the data dir
    assert not list((elsewhere / "cwd").iterdir())  # nothing written where it was started


async def _call_over_stdio(command: Path, args: list[str], cwd: Path, env: dict[str, str]) -> tuple[set[str], str, str]:
    """Serve over stdio with the SDK's client: the tool names, a clock conversion and the openapi services."""
    params = StdioServerParameters(command=str(command), args=args, cwd=str(cwd), env=env)
    with anyio.fail_after(120):
        async with Client(params) as client:  # type: ignore[arg-type]
            names = {t.name for t in (await client.list_tools()).tools}
            converted = await client.call_tool("clock__convert_time", CONVERT)
            services = await client.call_tool("openapi__search_api", {})
    return names, json.dumps(converted.structured_content), services.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_the_installed_gateway_serves_a_tool_call_over_stdio_from_another_directory(
    installed: Installed, elsewhere: Path
) -> None:
    config = elsewhere / "conf" / "external-mcps.yaml"
    names, converted, services = await _call_over_stdio(
        installed.bin / "mcp-gateway",
        ["serve", "--config", str(config)],
        elsewhere / "cwd",
        _user_env(elsewhere / "data"),
    )
    assert {"clock__now", "notes__add_note", "sql__execute_sql", "openapi__call_api"} <= names
    assert "21:00" in converted
    assert "(github, 16 operations, base URL https://api.github.com)" in services


@pytest.mark.anyio
async def test_the_readmes_claude_desktop_command_serves_the_built_ins_from_another_directory(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", readme, flags=re.DOTALL)
    stdio_entry = next(block for block in blocks if '"command"' in block)  # the quick start's desktop client
    entry = json.loads(stdio_entry.replace("/path/to/mcp-gateway", str(REPO)))
    gateway = entry["mcpServers"]["gateway"]
    (tmp_path / "cwd").mkdir()
    names, converted, services = await _call_over_stdio(
        Path(gateway["command"]), gateway["args"], tmp_path / "cwd", _user_env(tmp_path / "data")
    )
    assert {"clock__now", "notes__add_note", "sql__execute_sql", "openapi__call_api"} <= names
    assert "21:00" in converted
    assert "(github, 16 operations, base URL https://api.github.com)" in services
    assert not list((tmp_path / "cwd").iterdir())
