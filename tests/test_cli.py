"""The `mcp-gateway` command, run as a real child process on real configs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import (
    DEMO_SERVER,
    REPO,
    example_config,
    gateway_env,
    start_gateway_http,
    stop_process,
    write_config,
)

BUILTIN_PLUGINS = REPO / "plugins"
BROKEN_PLUGINS = REPO / "tests" / "fixtures" / "broken_plugins"


def run_cli(
    *args: str, tmp_path: Path, plugins: Path = BUILTIN_PLUGINS, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = gateway_env(tmp_path, plugins_dir=plugins)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=120,
    )


def example(tmp_path: Path) -> str:
    """A pristine copy of the shipped example config (never the repository's, which users edit)."""
    return str(example_config(tmp_path / "example"))


def test_check_on_the_example_config_reports_every_server_ok(tmp_path: Path) -> None:
    result = run_cli("--config", example(tmp_path), "check", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SERVER", "TRANSPORT", "STATUS", "TOOLS", "LATENCY"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert {"clock", "notes", "openapi", "sql"} <= set(rows)
    assert all(row[2] == "ok" for row in rows.values()), result.stdout
    assert rows["openapi"][3] == "2"
    assert (tmp_path / "data" / "demo-shop.sqlite").is_file()  # the example's demo database, made on first start


def test_the_example_config_serves_the_openapi_example_spec_shipped_with_the_plugin(tmp_path: Path) -> None:
    tools = run_cli("--config", example(tmp_path), "tools", "--server", "openapi", tmp_path=tmp_path)
    assert [line.split()[0] for line in tools.stdout.splitlines()[1:]] == ["openapi__call_api", "openapi__search_api"]
    result = run_cli(
        "--config",
        example(tmp_path),
        "call",
        "openapi__search_api",
        "--args",
        "{}",
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "(github, 16 operations, base URL https://api.github.com)" in result.stdout
    assert "- licenses: 3" in result.stdout


def test_check_exits_1_and_names_the_server_and_reason_when_one_fails(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "gw.yaml",
        f"""
        mcps:
          child:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio]
          ghost:
            command: /nonexistent/ghost-server
        """,
    )
    result = run_cli("--config", str(config), "check", "--json", tmp_path=tmp_path)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    status = {s["server"]: s for s in report["servers"]}
    assert status["child"]["status"] == "ok" and status["child"]["tools"] >= 5
    assert status["ghost"]["status"] == "failed"
    assert "No such file" in status["ghost"]["reason"]
    assert report["ok"] is False


def test_a_stdio_servers_relative_paths_are_found_from_the_config_files_folder(tmp_path: Path) -> None:
    """The gateway runs in the repository here; the server's relative script path only makes sense from the file."""
    (tmp_path / "conf").mkdir()
    script = os.path.relpath(DEMO_SERVER, tmp_path / "conf")
    config = write_config(
        tmp_path / "conf" / "gw.yaml",
        f"""
        mcps:
          rel:
            command: {sys.executable}
            args: ["{script}", stdio]
        """,
    )
    result = run_cli("--config", str(config), "check", "--json", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["servers"][0]["status"] == "ok"


def test_tools_lists_one_servers_namespaced_tools(tmp_path: Path) -> None:
    result = run_cli("--config", example(tmp_path), "tools", "--server", "clock", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert names == sorted(names) and "clock__now" in names and "clock__convert_time" in names
    assert not any(n.startswith("notes__") for n in names)


def test_tools_json_gives_full_tool_definitions(tmp_path: Path) -> None:
    result = run_cli("--config", example(tmp_path), "tools", "--json", tmp_path=tmp_path)
    tools = {t["name"]: t for t in json.loads(result.stdout)}
    assert tools["notes__add_note"]["inputSchema"]["required"] == ["title", "text"]
    sql_tools = {"sql__describe_schema", "sql__execute_sql", "sql__add_records", "sql__generate_sql"}
    assert sql_tools <= set(tools)
    assert tools["sql__execute_sql"]["inputSchema"]["properties"]["dry_run"]["default"] is True


def test_call_runs_one_tool_and_prints_its_result(tmp_path: Path) -> None:
    result = run_cli(
        "--config",
        example(tmp_path),
        "call",
        "clock__convert_time",
        "--args",
        '{"time": "2025-01-15T12:00:00", "from_timezone": "UTC", "to_timezone": "Asia/Tokyo"}',
        "--json",
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["isError"] is False
    assert "21:00" in json.dumps(payload["structuredContent"])


def test_call_of_an_unknown_tool_exits_1_with_close_names(tmp_path: Path) -> None:
    result = run_cli("--config", example(tmp_path), "call", "clock__nw", tmp_path=tmp_path)
    assert result.returncode == 1
    assert "clock__now" in result.stdout


def test_call_with_arguments_that_are_not_json_exits_2(tmp_path: Path) -> None:
    result = run_cli(
        "--config",
        example(tmp_path),
        "call",
        "clock__now",
        "--args",
        "{oops",
        tmp_path=tmp_path,
    )
    assert result.returncode == 2
    assert "--args is not valid JSON" in result.stderr


def test_plugins_reports_a_broken_plugin_with_its_traceback_goes_on_and_exits_1(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    result = run_cli("plugins", "--config", str(config), tmp_path=tmp_path, plugins=BROKEN_PLUGINS)
    assert result.returncode == 1
    assert "broken" in result.stdout and "failed" in result.stdout
    assert "Traceback" in result.stdout and "broken on purpose" in result.stdout


def test_plugins_reports_a_directory_plugin_that_replaces_a_built_in(tmp_path: Path) -> None:
    (tmp_path / "plugins" / "clock").mkdir(parents=True)
    (tmp_path / "plugins" / "clock" / "__init__.py").write_text('"""My own clock."""\n')
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    env = {"GATEWAY_PLUGINS__ENTRY_POINTS": "true"}
    result = run_cli("plugins", "--config", str(config), tmp_path=tmp_path, plugins=Path("plugins"), env=env)
    assert result.returncode == 0, result.stderr
    rows = [line.split(maxsplit=2) for line in result.stdout.splitlines()[1:5]]
    assert rows[:2] == [
        ["clock", "loaded", f"directory {tmp_path / 'plugins' / 'clock'}"],
        ["clock", "overridden", "entry point mcp_gateway_plugins.clock"],
    ]
    assert [row[:2] for row in rows[2:]] == [["notes", "loaded"], ["openapi", "loaded"]]
    note = f"clock (entry point mcp_gateway_plugins.clock): the plugin directory {tmp_path / 'plugins' / 'clock'}"
    assert f"  {note} replaces it" in result.stdout.splitlines()


def test_a_broken_plugin_does_not_stop_the_gateway_and_fails_check(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    result = run_cli("--config", str(config), "check", tmp_path=tmp_path, plugins=BROKEN_PLUGINS)
    assert result.returncode == 1
    assert "broken on purpose" in result.stderr
    assert "broken  memory     failed" in result.stdout


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("mcps:\n  a:\n    command: x\n   bad: indent\n", "gw.yaml:4"),
        ("mcps:\n  a:\n    command: x\n    timeout: -3\n", "gw.yaml:4: mcps.a.timeout"),
        ("mcps:\n  a:\n    comand: x\n", "did you mean 'command'"),
        ("mcps:\n  a: {}\n", "gw.yaml:2: mcps.a"),
        ("mcp: {}\n", "did you mean 'mcps'"),
    ],
    ids=["syntax", "bad-timeout", "typo", "no-transport", "unknown-top-level"],
)
def test_every_bad_config_gives_one_clear_line_and_exit_code_2(tmp_path: Path, body: str, expected: str) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(body)
    result = run_cli("--config", str(config), "check", tmp_path=tmp_path)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("mcp-gateway: config error: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_missing_config_file_says_how_to_choose_one(tmp_path: Path) -> None:
    result = run_cli("--config", str(tmp_path / "nope.yaml"), "check", tmp_path=tmp_path)
    assert result.returncode == 2
    assert "nope.yaml" in result.stderr and "Traceback" not in result.stderr


def test_a_claude_desktop_config_file_is_accepted_as_it_is(tmp_path: Path) -> None:
    config = tmp_path / "claude_desktop_config.json"
    config.write_text(
        json.dumps({"mcpServers": {"demo": {"command": sys.executable, "args": [str(DEMO_SERVER), "stdio"]}}}, indent=2)
    )
    result = run_cli("--config", str(config), "tools", "--server", "demo", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "demo__echo" in result.stdout


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("run a SQL query on the shop database", "sql__execute_sql"),
        ("find the GitHub API endpoint that lists a repository's issues", "openapi__search_api"),
        ("what time is it in Tokyo", "clock__now"),
    ],
)
def test_the_router_ranks_the_built_in_plugins_tools_on_the_example_config(
    tmp_path: Path, query: str, expected: str
) -> None:
    result = run_cli("--config", example(tmp_path), "search", query, "--k", "3", "--json", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert expected in [hit["name"] for hit in json.loads(result.stdout)]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GATEWAY_DATABASE_URL", "mysql://user:hunter2@db/gw", "GATEWAY_DATABASE_URL: must be a postgresql:// URL"),
        ("GATEWAY_HTTP__PORT", "eighty", "GATEWAY_HTTP__PORT: Input should be a valid integer"),
    ],
)
def test_a_bad_setting_names_the_variable_without_its_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str, message: str
) -> None:
    from gateway.cli.main import run

    monkeypatch.setenv(variable, value)
    assert run(["tools"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mcp-gateway: settings error: {message}") and value not in err


def test_global_options_are_accepted_after_the_command(tmp_path: Path) -> None:
    result = run_cli(
        "tools",
        "--server",
        "clock",
        "--config",
        example(tmp_path),
        "--log-level",
        "ERROR",
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "clock__now" in result.stdout


def test_a_global_option_given_before_and_after_the_command_takes_the_later_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli.main import run

    before, after = tmp_path / "before.yaml", tmp_path / "after.yaml"
    assert run(["--config", str(before), "check", "--config", str(after)]) == 2
    err = capsys.readouterr().err
    assert str(after) in err and str(before) not in err


def test_version_prints_the_installed_version(tmp_path: Path) -> None:
    result = run_cli("--version", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"mcp-gateway {importlib.metadata.version('mcp-gateway')}\n"


@pytest.mark.anyio
async def test_serve_with_its_config_after_the_command_serves_over_stdio(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "serve", "--config", str(config), "--transport", "stdio"],
        env=gateway_env(tmp_path),
        cwd=str(tmp_path),
    )
    with anyio.fail_after(60):
        async with Client(params) as client:  # type: ignore[arg-type]
            result = await client.call_tool("mem__echo", {"text": "after the command"})
    assert result.content[0].text == "after the command"  # type: ignore[union-attr]


README_REMOTE = """\
  remote:                                  # streamable HTTP (`transport: sse` for legacy SSE)
    url: https://mcp.example.com/mcp
    headers: {Authorization: "Bearer ${REMOTE_TOKEN}"}
    prefix: r                              # tools become r__<tool>
"""


def test_the_readmes_remote_example_is_in_the_readme() -> None:
    assert README_REMOTE in (REPO / "README.md").read_text(), "the entry the next test starts from"


@pytest.mark.anyio
async def test_an_entry_whose_variable_is_unset_fails_alone_and_the_others_are_served(tmp_path: Path) -> None:
    """The README's `remote` entry without $REMOTE_TOKEN set: that server is failed, with the file, line
    and key; the gateway serves, and the stdio child next to it answers."""
    config = write_config(
        tmp_path / "gw.yaml",
        f"mcps:\n  child:\n    command: {sys.executable}\n    args: ['{DEMO_SERVER}', stdio]\n" + README_REMOTE,
    )
    env = gateway_env(tmp_path)
    env.pop("REMOTE_TOKEN", None)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"],
        env=env,
        cwd=str(tmp_path),
    )
    with anyio.fail_after(60):
        async with Client(params) as client:  # type: ignore[arg-type]
            assert (await client.call_tool("child__add", {"a": 2, "b": 3})).content[0].text == "5"  # type: ignore[union-attr]

    result = run_cli("--config", str(config), "check", tmp_path=tmp_path)
    assert result.returncode == 1, "a failed server is a failed check"
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:] if line[:1] != " "}
    assert (rows["child"][2], rows["remote"][2]) == ("ok", "failed")
    reason = f"  remote: {config}:7: mcps.remote.headers.Authorization: environment variable REMOTE_TOKEN is not set"
    assert reason in result.stdout, result.stdout


def test_no_test_reads_the_example_config_a_user_may_have_edited() -> None:
    """The README invites users to edit `external-mcps.yaml`: tests copy `EXAMPLE_CONFIG` instead."""
    reads = re.compile(r"(load_config|copy|str)\(\s*REPO / \"external-mcps\.yaml\"")
    readers = [path.name for path in (REPO / "tests").glob("*.py") if reads.search(path.read_text())]
    assert not readers, f"these tests read the user's own config: {readers}"


def run_as_user(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A command with the log level a user has who set none (the tests' own environment sets WARNING)."""
    environment = gateway_env(tmp_path, plugins_dir=BUILTIN_PLUGINS)
    del environment["GATEWAY_LOG_LEVEL"]
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, env=environment, cwd=REPO, timeout=120
    )


def test_one_shot_commands_print_only_their_result_at_the_default_log_level(tmp_path: Path) -> None:
    config = example(tmp_path)
    called = run_as_user("--config", config, "call", "clock__now", "--args", '{"timezone": "UTC"}', tmp_path=tmp_path)
    assert called.returncode == 0 and called.stderr == "", called.stderr
    assert len(called.stdout.strip().splitlines()) == 1 and "UTC" in called.stdout
    checked = run_as_user("--config", config, "check", tmp_path=tmp_path)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    listed = run_as_user("--config", config, "servers", tmp_path=tmp_path)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    asked = run_as_user("--config", config, "--log-level", "INFO", "check", tmp_path=tmp_path)
    assert "server 'clock' is ready" in asked.stderr, "an asked-for level is kept"


def test_nothing_is_logged_after_the_servers_stopped(tmp_path: Path) -> None:
    """A gateway stopped while it is still loading its embedding model: its log ends with the servers'
    stop, not with the model's load finishing afterwards."""
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    log = tmp_path / "gateway.log"
    process, _ = start_gateway_http(config, tmp_path, {"GATEWAY_LOG_LEVEL": "INFO"}, log=log)
    stop_process(process)  # at once: the router has just started loading the model
    lines = log.read_text().strip().splitlines()
    assert any(" is stopped " in line for line in lines), lines
    last_stop = max(i for i, line in enumerate(lines) if " is stopped " in line)
    assert lines[last_stop + 1 :] == [], "logged after every server stopped"
