"""`mcp-gateway new-plugin NAME`: the minimal plugin of the plugin guide, with its test.

The files are the guide's example with the name filled in, so what a new plugin author
starts from is what the guide explains (and what `tests/test_scaffold.py` proves works).
The plugin goes where the gateway looks for plugin directories (next to the config
file), and its test beside that directory, importing it as `<directory name>.<name>`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["NAME_PATTERN", "ScaffoldError", "new_plugin", "write_config"]

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

PLUGIN_TEMPLATE = '''"""The {name} plugin: an MCP server served by mcp-gateway. Say here what its tools are for."""

from mcp.server import MCPServer

from gateway.hookspecs import hookimpl


def create_server() -> MCPServer:
    server = MCPServer("{name}")

    @server.tool()
    def greet(who: str) -> str:
        """Greet someone by name."""
        return f"Hello, {{who}}!"

    return server


@hookimpl
def gateway_register_servers(register, settings):
    register("{name}", create_server(), description="Greets people", capabilities=["{name}"])
'''

TEST_TEMPLATE = '''"""The {name} plugin: its server through the SDK's real client, then behind a real gateway."""

from pathlib import Path

import anyio
from mcp import Client

from gateway.testing import plugin_client
from {package}.{name} import create_server

PLUGINS = Path(__file__).resolve().parent / "{plugins_from_tests}"


def test_greet_says_hello() -> None:
    async def main() -> str:
        async with Client(create_server()) as client:
            result = await client.call_tool("greet", {{"who": "Ada"}})
            return result.content[0].text

    assert anyio.run(main) == "Hello, Ada!"


def test_greet_is_served_behind_the_gateway() -> None:
    async def main() -> str:
        async with plugin_client(PLUGINS) as client:
            result = await client.call_tool("{name}__greet", {{"who": "Ada"}})
            return result.content[0].text

    assert anyio.run(main) == "Hello, Ada!"
'''

CONFIG_TEMPLATE = """# mcp-gateway: servers under `mcps:`, plugin settings under `plugins:` (docs/configuration.md).
mcps: {}
"""


class ScaffoldError(Exception):
    """A name that cannot be a plugin, or files that already exist."""


def new_plugin(name: str, plugins_dir: Path, tests_dir: Path) -> list[Path]:
    """Write `plugins_dir/<name>/__init__.py` and `tests_dir/test_<name>_plugin.py`; return their paths."""
    if not NAME_PATTERN.match(name):
        raise ScaffoldError(
            f"{name!r} cannot be a plugin name: use lowercase letters, digits and '_', starting with a letter "
            "(at most 32), so that it is also the tool prefix and a Python module name"
        )
    if not plugins_dir.name.isidentifier():
        raise ScaffoldError(
            f"the plugin directory {plugins_dir} is not named like a Python package, so a test could not import "
            f"`{plugins_dir.name}.{name}`; use a directory named like `plugins`"
        )
    plugin, test = plugins_dir / name / "__init__.py", tests_dir / f"test_{name}_plugin.py"
    existing = [str(path) for path in (plugin, test) if path.exists()]
    if existing:
        raise ScaffoldError(f"not overwriting {', '.join(existing)}")
    plugin.parent.mkdir(parents=True, exist_ok=True)
    test.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text(PLUGIN_TEMPLATE.format(name=name), encoding="utf-8")
    relative = Path(os.path.relpath(plugins_dir.resolve(), tests_dir.resolve())).as_posix()
    test.write_text(
        TEST_TEMPLATE.format(name=name, package=plugins_dir.name, plugins_from_tests=relative), encoding="utf-8"
    )
    return [plugin, test]


def write_config(path: Path) -> bool:
    """Write an empty config at `path` unless one is there, so the next steps' commands run; whether it wrote."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONFIG_TEMPLATE, encoding="utf-8")
    return True
