"""Plugin discovery and the `gateway_register_servers` hook, in process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp.server import Server

from gateway.config.loader import ConfigError, GatewayConfig, load_config
from gateway.config.runtime_settings import PluginSettings
from gateway.config.settings import Settings
from gateway.plugins import get_plugin_manager, plugin_directory
from gateway.registry import Registry
from gateway.server_specs import check_plugin_sections, specs_from_plugins
from tests.conftest import REPO, call_plugin_tool


def _write_plugin(directory: Path, name: str, body: str) -> None:
    (directory / name).mkdir(parents=True)
    (directory / name / "__init__.py").write_text(textwrap.dedent(body))


SERVER_PLUGIN = """
    from mcp.server import MCPServer
    from gateway.hookspecs import hookimpl

    def make(name):
        server = MCPServer(name)

        @server.tool()
        def hello(who: str) -> str:
            \"\"\"Say hello.\"\"\"
            return f"hello {{who}} from {name}"

        return server

    @hookimpl
    def gateway_register_servers(register, settings):
        register("{name}", make("{name}"), description="says hello", capabilities=["greeting"])
"""


def _settings(tmp_path: Path, plugins: Path, *, entry_points: bool = False, **plugin_settings: list[str]) -> Settings:
    """Settings that load the plugins of `plugins`, and the installed ones only when asked."""
    return Settings(
        data_dir=tmp_path / "data",
        plugins=PluginSettings(directory=plugins, entry_points=entry_points, **plugin_settings),
    )


def _install_entry_point(site: Path, name: str, module: str, body: str) -> None:
    """An installed distribution in `site` (a sys.path entry) whose entry point `name` is package `module`."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(textwrap.dedent(body))
    dist = site / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[mcp_gateway]\n{name} = {module}\n")


def test_a_plugin_directory_registers_its_server_with_description_and_capabilities(tmp_path: Path) -> None:
    _write_plugin(tmp_path / "plugins", "greeter", SERVER_PLUGIN.format(name="greeter"))
    settings = _settings(tmp_path, tmp_path / "plugins")
    pm, infos = get_plugin_manager(settings)
    assert [(i.name, i.status) for i in infos] == [("greeter", "loaded")]
    [spec] = specs_from_plugins(pm, settings)
    assert (spec.id, spec.prefix, spec.transport, spec.origin) == ("greeter", "greeter", "memory", "plugin:greeter")
    assert spec.description == "says hello" and spec.capabilities == ("greeting",)


def test_a_plugin_py_file_also_makes_a_directory_a_plugin(tmp_path: Path) -> None:
    (tmp_path / "plugins" / "solo").mkdir(parents=True)
    (tmp_path / "plugins" / "solo" / "plugin.py").write_text(textwrap.dedent(SERVER_PLUGIN.format(name="solo")))
    pm, infos = get_plugin_manager(_settings(tmp_path, tmp_path / "plugins"))
    assert [(i.name, i.status) for i in infos] == [("solo", "loaded")]


def test_allow_and_deny_settings_choose_which_plugins_load(tmp_path: Path) -> None:
    for name in ("one", "two", "three"):
        _write_plugin(tmp_path / "plugins", name, SERVER_PLUGIN.format(name=name))
    _, infos = get_plugin_manager(_settings(tmp_path, tmp_path / "plugins", allow=["one", "two"], deny=["two"]))
    assert {i.name: i.status for i in infos} == {"one": "loaded", "two": "denied", "three": "denied"}


def test_a_plugin_that_fails_to_import_is_reported_with_its_traceback(tmp_path: Path) -> None:
    _write_plugin(tmp_path / "plugins", "good", SERVER_PLUGIN.format(name="good"))
    _write_plugin(tmp_path / "plugins", "bad", "import this_module_does_not_exist\n")
    pm, infos = get_plugin_manager(_settings(tmp_path, tmp_path / "plugins"))
    status = {i.name: i for i in infos}
    assert status["good"].status == "loaded"
    assert status["bad"].status == "failed"
    assert status["bad"].error is not None and "ModuleNotFoundError" in status["bad"].error


def test_an_installed_package_with_an_entry_point_is_a_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_entry_point(tmp_path / "site", "entry", "gw_entry_demo", SERVER_PLUGIN.format(name="entry"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    settings = _settings(tmp_path, tmp_path / "no-plugins-here", entry_points=True)
    pm, infos = get_plugin_manager(settings)
    assert ("entry", "entry point gw_entry_demo", "loaded") in [(i.name, i.source, i.status) for i in infos]
    assert "entry" in [s.id for s in specs_from_plugins(pm, settings)]


def test_the_built_in_plugins_are_installed_entry_points(tmp_path: Path) -> None:
    _, infos = get_plugin_manager(_settings(tmp_path, tmp_path / "no-plugins-here", entry_points=True))
    builtins = [(i.name, i.source, i.status) for i in infos if i.name in ("clock", "notes", "openapi", "sql")]
    assert builtins == [
        (n, f"entry point mcp_gateway_plugins.{n}", "loaded") for n in ("clock", "notes", "openapi", "sql")
    ]


def test_entry_points_false_loads_only_the_plugin_directory(tmp_path: Path) -> None:
    _write_plugin(tmp_path / "plugins", "greeter", SERVER_PLUGIN.format(name="greeter"))
    _, infos = get_plugin_manager(_settings(tmp_path, tmp_path / "plugins", entry_points=False))
    assert [i.name for i in infos] == ["greeter"]


def test_plugin_directories_are_found_next_to_the_config_file_not_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_plugin(tmp_path / "conf" / "plugins", "greeter", SERVER_PLUGIN.format(name="greeter"))
    _write_plugin(tmp_path / "conf" / "mine", "solo", SERVER_PLUGIN.format(name="solo"))
    _write_plugin(tmp_path / "elsewhere" / "plugins", "stray", SERVER_PLUGIN.format(name="stray"))
    monkeypatch.chdir(tmp_path / "elsewhere")
    config = tmp_path / "conf" / "gateway.yaml"

    default = Settings(config=config, plugins=PluginSettings(entry_points=False))
    assert plugin_directory(default) == tmp_path / "conf" / "plugins"
    assert [(i.name, i.status) for i in get_plugin_manager(default)[1]] == [("greeter", "loaded")]

    relative = Settings(config=config, plugins=PluginSettings(directory=Path("mine"), entry_points=False))
    assert [i.source for i in get_plugin_manager(relative)[1]] == [f"directory {tmp_path / 'conf' / 'mine' / 'solo'}"]

    # A config path given relative to the current directory is where the user's shell says it is.
    monkeypatch.chdir(tmp_path)
    given = Settings(config=Path("conf/gateway.yaml"), plugins=PluginSettings(entry_points=False))
    assert plugin_directory(given) == tmp_path / "conf" / "plugins"


def test_a_directory_plugin_replaces_an_installed_plugin_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_entry_point(tmp_path / "site", "greeter", "gw_greeter_dist", SERVER_PLUGIN.format(name="installed"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    _write_plugin(tmp_path / "plugins", "greeter", SERVER_PLUGIN.format(name="greeter"))
    settings = _settings(tmp_path, tmp_path / "plugins", entry_points=True)
    pm, infos = get_plugin_manager(settings)

    mine = [(i.source, i.status, i.note) for i in infos if i.name == "greeter"]
    assert mine == [
        (f"directory {tmp_path / 'plugins' / 'greeter'}", "loaded", None),
        (
            "entry point gw_greeter_dist",
            "overridden",
            f"the plugin directory {tmp_path / 'plugins' / 'greeter'} replaces it",
        ),
    ]
    ids = [s.id for s in specs_from_plugins(pm, settings)]
    assert "greeter" in ids and "installed" not in ids


def test_the_repositorys_own_plugins_directory_is_the_built_ins_and_loads_once(tmp_path: Path) -> None:
    """Run from the repository, `<config dir>/plugins` holds the very files the entry points name."""
    settings = Settings(data_dir=tmp_path / "data", config=REPO / "external-mcps.yaml")
    settings = settings.model_copy(update={"plugins": PluginSettings(entry_points=True)})
    assert plugin_directory(settings) == REPO / "plugins"
    _, infos = get_plugin_manager(settings)
    assert [(i.name, i.source, i.status) for i in infos] == [
        (n, f"entry point mcp_gateway_plugins.{n}", "loaded") for n in ("clock", "notes", "openapi", "sql")
    ]


def test_registering_a_server_name_another_plugin_took_fails_that_plugin_alone_naming_both(tmp_path: Path) -> None:
    _write_plugin(tmp_path / "plugins", "first", SERVER_PLUGIN.format(name="shared"))
    _write_plugin(tmp_path / "plugins", "second", SERVER_PLUGIN.format(name="shared"))
    settings = _settings(tmp_path, tmp_path / "plugins")
    pm, _ = get_plugin_manager(settings)
    specs = specs_from_plugins(pm, settings)
    assert [(s.id, s.origin, s.failure) for s in specs] == [
        ("shared", "plugin:first", None),
        ("second", "plugin:second", pm.failed()[0].describe()),
    ]
    [failed] = pm.failed()
    assert failed.name == "second" and pm.get_plugin("second") is None
    assert failed.reason == "plugin 'second' registers server 'shared', already registered by plugin 'first'"
    assert failed.file == str(tmp_path / "plugins" / "second" / "__init__.py") and failed.line == 17


def test_registering_something_that_is_not_an_mcp_server_fails_the_plugin_with_a_clear_error(tmp_path: Path) -> None:
    _write_plugin(
        tmp_path / "plugins",
        "wrong",
        """
        from gateway.hookspecs import hookimpl

        @hookimpl
        def gateway_register_servers(register, settings):
            register("wrong", object())
        """,
    )
    settings = _settings(tmp_path, tmp_path / "plugins")
    pm, _ = get_plugin_manager(settings)
    [spec] = specs_from_plugins(pm, settings)
    assert spec.id == "wrong" and spec.failure is not None
    assert "registered 'wrong' with a object; expected an mcp.server.MCPServer" in spec.failure


@pytest.mark.anyio
async def test_a_registered_plugin_server_is_served_through_the_gateway(tmp_path: Path) -> None:
    _write_plugin(tmp_path / "plugins", "greeter", SERVER_PLUGIN.format(name="greeter"))
    result = await call_plugin_tool(_settings(tmp_path, tmp_path / "plugins"), "greeter__hello", {"who": "Ada"})
    assert result.content[0].text == "hello Ada from greeter"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_a_low_level_server_that_paginates_is_read_to_the_last_page(tmp_path: Path) -> None:
    """Upstream pagination: the gateway follows every cursor a server hands out."""
    names = [f"tool_{i:02d}" for i in range(7)]

    async def list_tools(ctx: object, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        start = int(params.cursor) if params and params.cursor else 0
        page = [types.Tool(name=n, input_schema={"type": "object"}) for n in names[start : start + 3]]
        return types.ListToolsResult(tools=page, next_cursor=str(start + 3) if start + 3 < len(names) else None)

    async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])

    from gateway.upstreams.upstream import UpstreamSpec

    server = Server("paged", on_list_tools=list_tools, on_call_tool=call_tool)
    settings = Settings(data_dir=tmp_path)
    registry = Registry([UpstreamSpec(id="paged", prefix="p", transport="memory", target=server)], settings)
    with anyio.fail_after(30):
        async with registry.running():
            await registry.wait_settled()
            assert list(registry.catalog.tools) == [f"p__{n}" for n in names]
            result = await registry.call_tool("p__tool_06", {})
            assert result.content[0].text == "tool_06"  # type: ignore[union-attr]


class _LetterEmbedder:
    """A deterministic stand-in model: one dimension per letter a-z."""

    model_id = "letters@1"
    dim = 26

    def _vector(self, text: str):  # type: ignore[no-untyped-def]
        import numpy as np

        counts = np.zeros(26, dtype=np.float32)
        for ch in text.lower():
            if "a" <= ch <= "z":
                counts[ord(ch) - 97] += 1
        norm = float(np.linalg.norm(counts)) or 1.0
        return counts / norm

    def embed_documents(self, texts):  # type: ignore[no-untyped-def]
        import numpy as np

        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, 26), dtype=np.float32)

    def embed_query(self, text):  # type: ignore[no-untyped-def]
        return self._vector(text)


def test_a_plugin_can_provide_the_routers_embedder(tmp_path: Path) -> None:
    from gateway.hookspecs import hookimpl
    from gateway.router.service import load_router_embedder

    class EmbedderPlugin:
        @hookimpl
        def gateway_embedder(self, settings: Settings) -> _LetterEmbedder:
            return _LetterEmbedder()

    class DeclinesPlugin:
        @hookimpl
        def gateway_embedder(self, settings: Settings) -> None:
            return None

    settings = _settings(tmp_path, tmp_path / "none")
    pm, _ = get_plugin_manager(settings)
    pm.register(EmbedderPlugin(), name="letters")
    pm.register(DeclinesPlugin(), name="declines")
    embedder = load_router_embedder(settings, pm)
    assert embedder is not None and embedder.model_id == "letters@1"


def test_of_two_plugins_providing_an_embedder_the_first_in_plugin_order_wins(tmp_path: Path) -> None:
    from gateway.hookspecs import hookimpl
    from gateway.router.service import load_router_embedder

    class Named(_LetterEmbedder):
        def __init__(self, model_id: str) -> None:
            self.model_id = model_id

    class Provides:
        def __init__(self, model_id: str) -> None:
            self.model_id = model_id

        @hookimpl
        def gateway_embedder(self) -> _LetterEmbedder:
            return Named(self.model_id)

    settings = _settings(tmp_path, tmp_path / "none")
    pm, _ = get_plugin_manager(settings)
    pm.register(Provides("a_first@1"), name="a_first")
    pm.register(Provides("z_last@1"), name="z_last")
    embedder = load_router_embedder(settings, pm)
    assert embedder is not None and embedder.model_id == "a_first@1"


def test_an_embedder_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    from gateway.hookspecs import hookimpl
    from gateway.router.service import load_router_embedder

    class Wrong:
        @hookimpl
        def gateway_embedder(self, settings: Settings) -> object:
            return object()

    settings = _settings(tmp_path, tmp_path / "none")
    pm, _ = get_plugin_manager(settings)
    pm.register(Wrong(), name="wrong")
    with pytest.raises(TypeError, match="not an Embedder"):
        load_router_embedder(settings, pm)


CONFIGURED_PLUGIN = """
    from mcp.server import MCPServer
    from pydantic import BaseModel, ConfigDict
    from gateway.hookspecs import hookimpl

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        greeting: str = "hello"
        times: int = 1

    @hookimpl
    def gateway_register_servers(register, config):
        server = MCPServer("configured")

        @server.tool()
        def greet(who: str) -> str:
            \"\"\"Greet someone.\"\"\"
            return " ".join([f"{config.greeting} {who}"] * config.times)

        register("configured", server)
"""


def _configured(tmp_path: Path, yaml_text: str) -> tuple[Settings, GatewayConfig]:
    _write_plugin(tmp_path / "plugins", "configured", CONFIGURED_PLUGIN)
    (tmp_path / "gw.yaml").write_text(textwrap.dedent(yaml_text))
    return _settings(tmp_path, tmp_path / "plugins"), load_config(tmp_path / "gw.yaml")


def test_a_plugin_gets_its_yaml_section_validated_by_its_config_model(tmp_path: Path) -> None:
    settings, config = _configured(tmp_path, "plugins:\n  configured:\n    greeting: hi\n    times: 2\n")
    pm, _ = get_plugin_manager(settings)

    async def main() -> str:
        async with Registry(specs_from_plugins(pm, settings, config), settings).running() as registry:
            await registry.wait_settled(10)
            result = await registry.call_tool("configured__greet", {"who": "ada"})
            assert isinstance(result.content[0], types.TextContent)
            return result.content[0].text

    assert anyio.run(main) == "hi ada hi ada"


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "plugins:\n  configured:\n    times: many\n",
            "gw.yaml:3: plugins.configured.times: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        (
            "plugins:\n  configured:\n    greting: hi\n",
            "gw.yaml:3: plugins.configured.greting: unknown setting (did you mean 'greeting'?)",
        ),
    ],
)
def test_a_bad_plugin_setting_names_file_line_and_key(tmp_path: Path, yaml_text: str, expected: str) -> None:
    settings, config = _configured(tmp_path, yaml_text)
    pm, _ = get_plugin_manager(settings)
    with pytest.raises(ConfigError) as caught:
        specs_from_plugins(pm, settings, config)
    assert str(caught.value).endswith(expected)


def test_settings_for_a_plugin_without_a_config_model_or_for_no_plugin_are_errors(tmp_path: Path) -> None:
    _write_plugin(tmp_path / "plugins", "greeter", SERVER_PLUGIN.format(name="greeter"))
    settings, config = _configured(tmp_path, "plugins:\n  greeter:\n    x: 1\n")
    pm, infos = get_plugin_manager(settings)
    with pytest.raises(ConfigError, match=r"gw.yaml:2: plugins.greeter: this plugin takes no settings"):
        specs_from_plugins(pm, settings, config)

    typo = load_config(_write(tmp_path / "typo.yaml", "plugins:\n  configurd: {}\n"))
    with pytest.raises(ConfigError, match=r"typo.yaml:2: no plugin named 'configurd' \(did you mean 'configured'\?\)"):
        check_plugin_sections(typo, [info.name for info in infos])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _python_blocks(section: str) -> list[str]:
    """The ```python blocks of one section of the plugin guide, in order."""
    guide = (REPO / "docs" / "plugins.md").read_text()
    text = guide[guide.index(section) :]
    text = text[: text.index("\n## ", len(section))]
    blocks = []
    while "```python\n" in text:
        start = text.index("```python\n") + len("```python\n")
        end = text.index("```\n", start)
        blocks.append(text[start:end])
        text = text[end:]
    return blocks


def _run_pytest(project: Path, test: Path) -> subprocess.CompletedProcess[str]:
    """`python -m pytest TEST` run in `project`, as the guide says, with the gateway's interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PYTHONPATH"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True,
        text=True,
        env=env | {"GATEWAY_EMBEDDING__ENABLED": "false"},
        cwd=project,
        timeout=180,
    )


def test_the_guides_tests_of_its_complete_plugin_pass_as_written(tmp_path: Path) -> None:
    """Both snippets of "Testing a plugin", pasted into a test file beside the guide's plugin, pass
    under pytest with nothing but the installed gateway: the second one behind a real gateway."""
    [plugin] = _python_blocks("## A complete plugin")
    in_memory, behind_the_gateway, _signature = _python_blocks("## Testing a plugin")
    _write_plugin(tmp_path / "plugins", "weather", plugin)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_weather.py").write_text(in_memory + "\n\n" + behind_the_gateway)
    ran = _run_pytest(tmp_path, tmp_path / "tests" / "test_weather.py")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout


@pytest.mark.anyio
async def test_plugin_client_refuses_to_serve_when_a_plugin_failed_naming_it(tmp_path: Path) -> None:
    from gateway.testing import PluginLoadError, plugin_client

    _write_plugin(tmp_path / "plugins", "greeter", SERVER_PLUGIN.format(name="greeter"))
    _write_plugin(
        tmp_path / "plugins",
        "typo",
        "from gateway.hookspecs import hookimpl\n\n@hookimpl\ndef gateway_befor_call(call):\n    pass\n",
    )
    expected = r"plugin 'typo' \(.*typo/__init__.py:3\): @hookimpl 'gateway_befor_call'"
    with anyio.fail_after(30), pytest.raises(PluginLoadError, match=expected):
        async with plugin_client(tmp_path / "plugins"):
            pass


def test_the_guides_worked_plugin_and_its_test_pass_as_written(tmp_path: Path) -> None:
    plugin, test = _python_blocks("## A worked plugin with its test")
    _write_plugin(tmp_path / "plugins", "units", plugin)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_units.py").write_text(test)
    ran = _run_pytest(tmp_path, tmp_path / "tests" / "test_units.py")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout


LIFESPAN_PLUGIN = """
    import contextlib
    from pathlib import Path
    from mcp.server import MCPServer
    from gateway.hookspecs import hookimpl

    @hookimpl
    def gateway_register_servers(register, settings):
        log = Path(settings.data_dir) / "lifespan.log"

        @contextlib.asynccontextmanager
        async def lifespan(server):
            with log.open("a") as out:
                out.write("start\\n")
            try:
                yield {}
            finally:
                with log.open("a") as out:
                    out.write("stop\\n")

        server = MCPServer("life", lifespan=lifespan)

        @server.tool()
        def ping() -> str:
            \"\"\"Answer pong.\"\"\"
            return "pong"

        register("life", server)
"""


@pytest.mark.anyio
async def test_a_plugin_servers_lifespan_starts_when_the_gateway_connects_and_stops_when_it_stops(
    tmp_path: Path,
) -> None:
    from gateway.testing import plugin_client

    _write_plugin(tmp_path / "plugins", "life", LIFESPAN_PLUGIN)
    log = tmp_path / "data" / "lifespan.log"
    (tmp_path / "data").mkdir()
    with anyio.fail_after(30):
        async with plugin_client(tmp_path / "plugins", data_dir=tmp_path / "data") as client:
            assert log.read_text() == "start\n"
            assert (await client.call_tool("life__ping", {})).content[0].text == "pong"  # type: ignore[union-attr]
    assert log.read_text() == "start\nstop\n"


def test_a_directory_plugin_imported_by_a_test_is_a_second_copy_of_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What "Module identity" in the guide says: `plugins.<name>` and the gateway's
    `mcp_gateway_local_plugins.<name>` are two modules, with their own module-level state."""
    import importlib

    _write_plugin(tmp_path / "plugins", "counter", SERVER_PLUGIN.format(name="counter") + "\n    COUNT = [0]\n")
    (tmp_path / "plugins" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in [m for m in sys.modules if m == "plugins" or m.startswith("plugins.")]:
        monkeypatch.delitem(sys.modules, module)
    pm, _ = get_plugin_manager(_settings(tmp_path, tmp_path / "plugins"))
    by_gateway = pm.get_plugin("counter")
    by_test = importlib.import_module("plugins.counter")
    assert by_gateway.__name__ == "mcp_gateway_local_plugins.counter" and by_test.__name__ == "plugins.counter"
    by_test.COUNT[0] += 1
    assert by_gateway.COUNT == [0]
