"""A plugin fails alone: every way a plugin breaks (import, hook validation, a misspelt hook, its
registration hook, two packages with one name) leaves that plugin `failed`, named with its file or
package, line and reason, in `plugins`, `check`, `servers`, `/readyz` and the admin API; the
others serve. Real plugins on disk and installed packages, the real CLI, a real client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gateway.security.auth import hash_key, new_key
from tests.conftest import REPO, gateway_over_stdio, start_gateway_http, stop_process, write_config

GOOD = """
    from mcp.server import MCPServer
    from gateway.hookspecs import hookimpl

    @hookimpl
    def gateway_register_servers(register):
        server = MCPServer("good")

        @server.tool()
        def hello(who: str) -> str:
            \"\"\"Say hello.\"\"\"
            return f"hello {who}"

        register("good", server)
"""

BROKEN = {
    # 1. a misspelt hook: pluggy's check_pending used to stop every command
    "misspelt": """
        from gateway.hookspecs import hookimpl

        @hookimpl
        def gateway_befor_call(call):
            return None
    """,
    # 2. a registration hook that raises
    "raiser": """
        from gateway.hookspecs import hookimpl

        @hookimpl
        def gateway_register_servers(register):
            settings = {}
            raise KeyError("api_key")
    """,
    # 3. a syntax error, an import error, a hook argument the hook does not have
    "syntax": """
        def broken(:
            pass
    """,
    "missing": """
        import this_module_does_not_exist
    """,
    "wrongarg": """
        from gateway.hookspecs import hookimpl

        @hookimpl
        def gateway_before_call(calll):
            return None
    """,
}

EXPECTED = {
    "misspelt": ("__init__.py", 3, "'gateway_befor_call' is not a gateway hook (did you mean 'gateway_before_call'?)"),
    "raiser": ("__init__.py", 6, "gateway_register_servers raised KeyError: 'api_key'"),
    "syntax": ("__init__.py", 1, "importing it raised SyntaxError"),
    "missing": ("__init__.py", 1, "ModuleNotFoundError: No module named 'this_module_does_not_exist'"),
    "wrongarg": ("__init__.py", 3, "calll"),
}


def _plugins(directory: Path, plugins: dict[str, str]) -> Path:
    for name, body in plugins.items():
        (directory / name).mkdir(parents=True)
        (directory / name / "__init__.py").write_text(textwrap.dedent(body).lstrip("\n"))
    return directory


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return env | {
        "GATEWAY_DATA_DIR": str(tmp_path / "data"),
        "GATEWAY_PLUGINS__ENTRY_POINTS": "false",
        "GATEWAY_EMBEDDING__ENABLED": "false",
        "PYTHONPATH": str(REPO),
        **extra,
    }


def _cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(tmp_path / "gateway.yaml"), *args],
        capture_output=True,
        text=True,
        env=env or _env(tmp_path),
        cwd=tmp_path,
        timeout=120,
    )


@pytest.fixture
def broken_plugins(tmp_path: Path) -> Path:
    """`gateway.yaml` beside `plugins/` holding one good plugin and five broken ones."""
    _plugins(tmp_path / "plugins", {"good": GOOD, **BROKEN})
    write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    return tmp_path


def test_plugins_names_every_broken_plugin_with_file_line_and_reason_and_exits_1(broken_plugins: Path) -> None:
    done = _cli(broken_plugins, "plugins", "--json")
    assert done.returncode == 1, done.stderr
    infos = {info["name"]: info for info in json.loads(done.stdout)}
    assert infos["good"]["status"] == "loaded"
    for name, (file, line, reason) in EXPECTED.items():
        info = infos[name]
        assert info["status"] == "failed", name
        assert info["file"] == str(broken_plugins / "plugins" / name / file), name
        assert info["line"] == line, name
        assert reason in info["reason"], (name, info["reason"])

    text = _cli(broken_plugins, "plugins")
    assert text.returncode == 1
    assert f"plugin 'raiser' ({broken_plugins / 'plugins' / 'raiser' / '__init__.py'}:6): " in text.stdout
    assert "Traceback" not in text.stderr  # logged as one line each, never a crash


@pytest.mark.parametrize("command", ["check", "servers"])
def test_check_and_servers_show_each_failed_plugin_as_a_failed_server_and_exit_1(
    broken_plugins: Path, command: str
) -> None:
    done = _cli(broken_plugins, command, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    rows = {row["server"]: row for row in report["servers"]}
    assert rows["good"]["status"] == "ok" and rows["good"]["tools"] == 1
    for name, (_, line, reason) in EXPECTED.items():
        assert rows[name]["status"] == "failed", name
        assert f"__init__.py:{line}): " in rows[name]["reason"] and reason in rows[name]["reason"], rows[name]
    assert report["ok"] is False and {p["name"] for p in report["plugins_failed"]} == set(EXPECTED)

    table = _cli(broken_plugins, command)
    assert table.returncode == 1
    assert "plugin 'misspelt'" in table.stdout and "Traceback" not in table.stderr


def test_the_good_plugin_serves_a_real_client_beside_the_broken_ones(broken_plugins: Path) -> None:
    async def main() -> tuple[list[str], str]:
        with anyio.fail_after(60):
            env = _env(broken_plugins, GATEWAY_PLUGINS__DIRECTORY=str(broken_plugins / "plugins"))
            async with gateway_over_stdio(broken_plugins / "gateway.yaml", broken_plugins, env) as client:
                tools = [tool.name for tool in (await client.list_tools()).tools]
                result = await client.call_tool("good__hello", {"who": "Ada"})
                return tools, result.content[0].text  # type: ignore[union-attr]

    tools, text = anyio.run(main)
    assert "good__hello" in tools and text == "hello Ada"


def test_the_admin_api_lists_each_failed_plugin_with_its_reason_while_readyz_stays_ready(broken_plugins: Path) -> None:
    key = new_key()
    write_config(
        broken_plugins / "gateway.yaml",
        f"""
        mcps: {{}}
        auth:
          api_keys:
            - {{name: root, hash: "{hash_key(key)}", admin: true}}
        """,
    )
    env = _env(broken_plugins, GATEWAY_PLUGINS__DIRECTORY=str(broken_plugins / "plugins"))
    process, url = start_gateway_http(broken_plugins / "gateway.yaml", broken_plugins, env)
    try:
        base = url.removesuffix("/mcp")
        with httpx.Client(base_url=base, timeout=30) as http:
            ready = http.get("/readyz")
            assert ready.status_code == 200  # the good plugin serves: the gateway stays in the load balancer
            listed = http.get("/admin/api/v1/servers", headers={"Authorization": f"Bearer {key}"})
            assert listed.status_code == 200, listed.text
            rows: dict[str, Any] = {row["server"]: row for row in listed.json()["servers"]}
            assert rows["misspelt"]["state"] == "failed" and "gateway_befor_call" in rows["misspelt"]["reason"]
            assert "gateway_register_servers raised KeyError" in rows["raiser"]["reason"]
            assert rows["good"]["state"] == "ready"
    finally:
        stop_process(process)


def _install(site: Path, dist: str, module: str, entry_name: str, body: str) -> None:
    """An installed distribution `dist` 1.0 in `site` (a sys.path entry) with entry point `entry_name`."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(textwrap.dedent(body))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[mcp_gateway]\n{entry_name} = {module}\n")


def test_two_installed_packages_with_one_entry_point_name_are_both_named(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install(site, "units-one", "units_one", "units", GOOD.replace('"good"', '"units"'))
    _install(site, "units-two", "units_two", "units", GOOD.replace('"good"', '"units2"'))
    write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    builtins = '["clock","notes","openapi","sql"]'
    env = _env(tmp_path, GATEWAY_PLUGINS__ENTRY_POINTS="true", GATEWAY_PLUGINS__DENY=builtins)
    env["PYTHONPATH"] = f"{site}{os.pathsep}{REPO}"
    done = _cli(tmp_path, "plugins", "--json", env=env)
    assert done.returncode == 1, done.stderr
    units = [info for info in json.loads(done.stdout) if info["name"] == "units"]
    assert [(u["status"], u["package"]) for u in units] == [("loaded", "units-one 1.0"), ("failed", "units-two 1.0")]
    assert "also used by package units-one 1.0" in units[1]["reason"]

    check = _cli(tmp_path, "check", env=env)
    assert check.returncode == 1
    assert "plugin 'units' (package units-two 1.0): the entry point name 'units' is also used by" in check.stdout


SLOW = """
    import anyio
    from mcp.server import MCPServer
    from gateway.hookspecs import hookimpl

    @hookimpl
    def gateway_register_servers(register):
        server = MCPServer("slow")

        @server.tool()
        async def wait(seconds: float) -> str:
            \"\"\"Wait a while.\"\"\"
            await anyio.sleep(seconds)
            return "done"

        register("slow", server, timeout=30)
"""


def test_the_yaml_names_plugin_directories_and_a_plugins_timeout_which_fires(tmp_path: Path) -> None:
    """`plugins.directories` finds plugins beside the default folder; `plugins.<name>.gateway.timeout`
    overrides the plugin's own `register(..., timeout=30)`; the plugin's settings never see it."""
    _plugins(tmp_path / "plugins", {"good": GOOD})
    _plugins(tmp_path / "shared" / "more", {"slow": SLOW})
    write_config(
        tmp_path / "gateway.yaml",
        """
        plugins:
          directories: [plugins, shared/more]
          slow:
            gateway:
              timeout: 1
        """,
    )
    listed = _cli(tmp_path, "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(i["name"], i["status"]) for i in json.loads(listed.stdout)] == [("good", "loaded"), ("slow", "loaded")]

    async def main() -> tuple[bool, dict[str, Any], str]:
        with anyio.fail_after(60):
            async with gateway_over_stdio(tmp_path / "gateway.yaml", tmp_path, _env(tmp_path)) as client:
                slow = await client.call_tool("slow__wait", {"seconds": 20})
                quick = await client.call_tool("slow__wait", {"seconds": 0})
                return slow.is_error, slow.meta or {}, quick.content[0].text  # type: ignore[union-attr]

    is_error, meta, quick = anyio.run(main)
    assert is_error and json.dumps(meta).count("upstream_timeout") >= 1, meta
    assert quick == "done"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("plugins:\n  directories: plugins\n", "gateway.yaml:2: plugins.directories: must be a list of folders"),
        ("plugins:\n  good:\n    gateway:\n      timout: 3\n", "plugins.good.gateway.timout: unknown setting (did you"),
        ("plugins:\n  good:\n    gateway:\n      timeout: -1\n", "gateway.yaml:4: plugins.good.gateway.timeout: Input"),
        ("plugin:\n  good: {}\n", "gateway.yaml:1: plugin: unknown key 'plugin' (did you mean 'plugins'?)"),
    ],
)
def test_plugins_validates_the_config_and_names_file_line_and_key(tmp_path: Path, body: str, expected: str) -> None:
    _plugins(tmp_path / "plugins", {"good": GOOD})
    write_config(tmp_path / "gateway.yaml", body)
    done = _cli(tmp_path, "plugins")
    assert done.returncode == 2, done.stdout
    assert expected in done.stderr
