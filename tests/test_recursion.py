"""No self-recursion (`upstreams.recursion`): entries that start the gateway itself, the chain of gateways, its cap.

The command-line reading is tested over many shapes of entry; the guards are tested with
real gateways as real child processes, counting the processes they start.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import psutil
import pytest

from gateway.config.loader import load_config
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.server_specs import RegistrationError, specs_from_config
from gateway.upstreams.recursion import (
    CHAIN_VAR,
    SELF_START,
    TOO_DEEP,
    ChainError,
    chain_problem,
    config_identity,
    inherited_chain,
    starts_gateway,
)
from tests.conftest import REPO, gateway_env, write_config

TINY_SERVER = REPO / "tests" / "servers" / "tiny_server.py"
CONSOLE_SCRIPT = Path(sys.executable).parent / "mcp-gateway"
PYTHON = sys.executable


# ---- reading entries: which ones start this gateway -----------------------------------------


@pytest.fixture
def own(tmp_path: Path) -> Path:
    """This gateway's config, in a folder that is also the entries' working directory."""
    return write_config(tmp_path / "gw.yaml", "mcps: {}\n")


def _detects(
    own: Path, command: str, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> bool:
    chain = [config_identity(own)]
    reason = starts_gateway(command, args, {"PATH": os.environ["PATH"], **(env or {})}, cwd or own.parent, chain)
    return reason is not None and reason.startswith(SELF_START)


SAME_CONFIG_SHAPES = {
    "the console script by name": ("mcp-gateway", ["--config", "{own}", "serve"]),
    "the console script by its path": ("/opt/venv/bin/mcp-gateway", ["--config", "{own}", "serve"]),
    "a relative --config, from the working directory": ("mcp-gateway", ["--config", "gw.yaml", "serve"]),
    "--config after the subcommand": ("mcp-gateway", ["serve", "--config={own}"]),
    "an abbreviated --config": ("mcp-gateway", ["--conf", "{own}", "serve", "--transport", "stdio"]),
    "-c": ("mcp-gateway", ["-c", "{own}", "serve"]),
    "the last --config wins": ("mcp-gateway", ["--config", "other.yaml", "serve", "--config", "{own}"]),
    "python -m gateway": ("python", ["-m", "gateway", "--config", "{own}", "serve"]),
    "python3.11 with interpreter options": ("python3.11", ["-I", "-u", "-X", "utf8", "-m", "gateway", "-c", "{own}"]),
    "python -mgateway": ("/usr/bin/python3", ["-mgateway", "--config", "{own}", "serve"]),
    "python -c importing gateway.cli": (
        "python",
        ["-c", "from gateway.cli.main import main; main()", "--config", "{own}"],
    ),
    "npx -y": ("npx", ["-y", "mcp-gateway", "--config", "{own}", "serve"]),
    "npx -c": ("npx", ["-c", "mcp-gateway --config '{own}' serve"]),
    "npm exec --": ("npm", ["exec", "--", "mcp-gateway", "--config", "{own}", "serve"]),
    "uvx with a version": ("uvx", ["mcp-gateway@0.1.0", "--config", "{own}", "serve"]),
    "uvx with options": ("uvx", ["--from", "/src/mcp-gateway", "--python", "3.12", "mcp-gateway", "-c", "{own}"]),
    "uv tool run": ("uv", ["tool", "run", "mcp-gateway", "--config", "{own}", "serve"]),
    "uv run -m gateway": ("uv", ["run", "--project", "/src", "-m", "gateway", "--config", "{own}", "serve"]),
    "uv run python -m gateway": ("uv", ["run", "python", "-m", "gateway", "--config", "{own}", "serve"]),
    "pipx run --spec": ("pipx", ["run", "--spec", "mcp-gateway==0.1", "mcp-gateway", "--config", "{own}"]),
    "sh -c with cd, exec and a redirection": (
        "sh", ["-c", "cd '{dir}' && exec mcp-gateway -c gw.yaml serve 2>/dev/null"]
    ),
    "bash -lc with a variable": ("bash", ["-lc", "GATEWAY_CONFIG=$HOME/gw.yaml mcp-gateway serve"]),
    "bash -o pipefail -c with export and ~": (
        "/bin/bash", ["-o", "pipefail", "-c", "export GATEWAY_CONFIG=~/gw.yaml; mcp-gateway serve"]
    ),
    "env with an assignment": ("env", ["GATEWAY_CONFIG={own}", "mcp-gateway", "serve"]),
    "env -S": ("/usr/bin/env", ["-S", "mcp-gateway --config {own}", "serve"]),
    "exec and nohup": ("nohup", ["exec", "mcp-gateway", "--config", "{own}", "serve"]),
    "GATEWAY_CONFIG in the entry's env": ("mcp-gateway", ["serve"], {"GATEWAY_CONFIG": "{own}"}),
    "gateway_config in any case": ("mcp-gateway", ["serve"], {"gateway_config": "{own}"}),
}  # fmt: skip


@pytest.mark.parametrize("shape", SAME_CONFIG_SHAPES.values(), ids=SAME_CONFIG_SHAPES.keys())
def test_an_entry_that_starts_the_gateway_with_its_own_config_is_recognised(own: Path, shape: tuple) -> None:
    command, args, *env = shape

    def fill(text: str) -> str:
        return text.replace("{own}", str(own)).replace("{dir}", str(own.parent))

    environment = {"HOME": str(own.parent), **{name: fill(value) for name, value in (env[0] if env else {}).items()}}
    assert _detects(own, command, [fill(arg) for arg in args], environment)


OTHER_SHAPES = {
    "another config": ("mcp-gateway", ["--config", "other.yaml", "serve"]),
    "--config wins over GATEWAY_CONFIG": (
        "mcp-gateway", ["--config", "other.yaml", "serve"], {"GATEWAY_CONFIG": "{own}"}
    ),
    "the default config of another folder": ("mcp-gateway", ["serve"]),
    "another module": ("python", ["-m", "gateway_tools", "--config", "{own}"]),
    "a python script": ("python", ["server.py", "--config", "{own}"]),
    "another npx package": ("npx", ["-y", "@modelcontextprotocol/server-filesystem", "{own}"]),
    "another uvx package": ("uvx", ["mcp-server-sqlite", "--db-path", "{own}"]),
    "a shell that only prints the command": ("sh", ["-c", "echo mcp-gateway --config {own} serve"]),
    "unbalanced quotes": ("sh", ["-c", "mcp-gateway --config '{own} serve"]),
    "a program that is not there": ("no-such-program-here", ["--config", "{own}"]),
    "env -i drops GATEWAY_CONFIG": ("env", ["-i", "mcp-gateway", "serve"], {"GATEWAY_CONFIG": "{own}"}),
}  # fmt: skip


@pytest.mark.parametrize("shape", OTHER_SHAPES.values(), ids=OTHER_SHAPES.keys())
def test_an_entry_that_starts_something_else_is_left_alone(own: Path, shape: tuple) -> None:
    command, args, *env = shape
    environment = {name: value.replace("{own}", str(own)) for name, value in (env[0] if env else {}).items()}
    assert not _detects(own, command, [arg.replace("{own}", str(own)) for arg in args], environment)


def test_the_default_config_in_the_entrys_working_directory_is_recognised(tmp_path: Path) -> None:
    own = write_config(tmp_path / "external-mcps.yaml", "mcps: {}\n")
    assert _detects(own, "mcp-gateway", ["serve"], cwd=tmp_path)
    assert not _detects(own, "mcp-gateway", ["serve"], cwd=tmp_path.parent)


def test_a_dotenv_file_in_the_entrys_working_directory_names_the_config(own: Path, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("GATEWAY_CONFIG=gw.yaml\n")
    assert _detects(own, "mcp-gateway", ["serve"], cwd=tmp_path)
    (tmp_path / ".env").write_text("GATEWAY_CONFIG=other.yaml\n")
    assert not _detects(own, "mcp-gateway", ["serve"], cwd=tmp_path)


def test_a_config_reached_through_a_symlink_is_the_same_config(own: Path, tmp_path: Path) -> None:
    (tmp_path / "link.yaml").symlink_to(own)
    assert _detects(own, "mcp-gateway", ["--config", str(tmp_path / "link.yaml"), "serve"])


def test_a_copy_of_the_console_script_under_another_name_is_recognised(own: Path, tmp_path: Path) -> None:
    copy = tmp_path / "bin" / "my-gateway"
    copy.parent.mkdir()
    shutil.copy(CONSOLE_SCRIPT, copy)
    assert _detects(own, str(copy), ["--config", str(own), "serve"])
    assert _detects(own, "my-gateway", ["--config", str(own)], env={"PATH": str(copy.parent)})
    assert _detects(own, "python", [str(copy), "--config", str(own), "serve"])


def test_the_repositorys_serve_script_runs_the_default_config_of_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    (root / "gateway" / "cli").mkdir(parents=True)
    (root / "gateway" / "cli" / "main.py").write_text("")
    shutil.copy(REPO / "scripts" / "serve", root / "scripts" / "serve")
    own = write_config(root / "external-mcps.yaml", "mcps: {}\n")
    assert _detects(own, str(root / "scripts" / "serve"), ["--transport", "stdio"], cwd=tmp_path)
    custom = write_config(root / "mine.yaml", "mcps: {}\n")
    assert _detects(custom, str(root / "scripts" / "serve"), [], env={"GATEWAY_CONFIG": "mine.yaml"}, cwd=tmp_path)
    assert not _detects(custom, str(root / "scripts" / "serve"), [], cwd=tmp_path)


def test_an_entry_that_starts_a_gateway_above_this_one_is_recognised_too(own: Path, tmp_path: Path) -> None:
    outer = write_config(tmp_path / "outer.yaml", "mcps: {}\n")
    chain = [config_identity(outer), config_identity(own)]
    reason = starts_gateway("mcp-gateway", ["--config", str(outer), "serve"], {}, tmp_path, chain)
    assert reason is not None and reason.startswith(SELF_START) and "a gateway that started this one" in reason


def test_a_gateway_whose_config_is_already_in_the_chain_must_not_start() -> None:
    problem = chain_problem("/b.yaml", ["/a.yaml", "/b.yaml"], 10)
    assert problem is not None and problem.startswith(SELF_START)
    assert "/a.yaml -> /b.yaml -> /b.yaml" in problem


def test_a_gateway_as_deep_as_the_cap_starts_and_one_deeper_does_not() -> None:
    assert chain_problem("/c.yaml", ["/a.yaml", "/b.yaml"], 3) is None
    problem = chain_problem("/d.yaml", ["/a.yaml", "/b.yaml", "/c.yaml"], 3)
    assert problem is not None and problem.startswith(TOO_DEEP) and "number 4" in problem
    assert "GATEWAY_MAX_NESTING" in problem


def test_the_chain_is_read_from_the_environment_and_a_malformed_one_is_an_error() -> None:
    assert inherited_chain({}) == []
    assert inherited_chain({CHAIN_VAR: json.dumps(["/a.yaml"])}) == ["/a.yaml"]
    with pytest.raises(ChainError, match=CHAIN_VAR):
        inherited_chain({CHAIN_VAR: "/a.yaml:/b.yaml"})


# ---- real gateways, real processes -----------------------------------------------------------


async def _run_counting(
    args: list[str], tmp_path: Path, marker: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """Run `python -m gateway ARGS`; also return the pids of its descendants whose command line
    mentions `marker`, sampled every 20 ms while it runs (a nested gateway lives for seconds)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [PYTHON, "-m", "gateway", *args],
            stdout=stdout,
            stderr=stderr,
            env=gateway_env(tmp_path) | (env or {}),
            cwd=tmp_path,
        )
    seen: set[int] = set()
    try:
        with anyio.fail_after(120):
            while process.poll() is None:
                seen |= _descendants(process.pid, marker)
                await anyio.sleep(0.02)  # the sampling period, not a wait for a condition
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
    return subprocess.CompletedProcess(process.args, process.returncode, out.read_text(), err.read_text()), seen


def _descendants(pid: int, marker: str) -> set[int]:
    """Descendants of `pid` whose command line mentions `marker`, but for a child caught between its
    fork and its exec (starting another server), which still shows the parent's command line."""
    found = set()
    try:
        parent = psutil.Process(pid)
        children, own = parent.children(recursive=True), parent.cmdline()
    except psutil.Error:
        return found  # it has just ended
    for child in children:
        try:
            line = child.cmdline()
            if marker in " ".join(line) and line != own:
                found.add(child.pid)
        except psutil.Error:
            continue  # it ended while we looked
    return found


def _rows(result: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert result.stdout.strip(), result.stderr
    return {row["server"]: row for row in json.loads(result.stdout)["servers"]}


def _tiny() -> dict:
    return {"command": PYTHON, "args": [str(TINY_SERVER)], "protocol": "legacy"}


def _claude_desktop_config(tmp_path: Path) -> Path:
    """Claude Desktop's layout, listing the gateway (its console script) with this very file."""
    path = tmp_path / "claude_desktop_config.json"
    servers = {"gateway": {"command": str(CONSOLE_SCRIPT), "args": ["--config", str(path), "serve"]}, "tiny": _tiny()}
    path.write_text(json.dumps({"mcpServers": servers}, indent=2))
    return path


def _yaml_config(tmp_path: Path) -> Path:
    """Our layout, listing `python -m gateway` with this file's relative path, from its folder."""
    return write_config(
        tmp_path / "self.yaml",
        f"""
        mcps:
          gateway:
            command: {PYTHON}
            args: [-m, gateway, --config, self.yaml, serve]
            cwd: {tmp_path}
          tiny:
            command: {PYTHON}
            args: [{TINY_SERVER}]
            protocol: legacy
        """,
    )


@pytest.mark.anyio
@pytest.mark.parametrize("make_config", [_claude_desktop_config, _yaml_config], ids=["claude-desktop-json", "yaml"])
async def test_check_reports_an_entry_that_starts_the_gateway_itself_failed_and_never_starts_it(
    tmp_path: Path, make_config: Callable[[Path], Path]
) -> None:
    config = make_config(tmp_path)
    result, gateways = await _run_counting(["--config", str(config), "check", "--json"], tmp_path, config.name)
    rows = _rows(result)
    assert result.returncode == 1
    assert rows["gateway"]["state"] == "failed"
    assert rows["gateway"]["reason"].startswith(SELF_START), rows["gateway"]
    assert rows["gateway"]["retry_at"] is None  # never retried
    assert rows["tiny"]["state"] == "ready"  # the rest of the config is served
    assert gateways == set()  # no nested gateway ever ran


@pytest.mark.anyio
async def test_an_entry_that_starts_the_gateway_itself_is_failed_within_5_s_and_starts_no_process(
    tmp_path: Path,
) -> None:
    config = _yaml_config(tmp_path)
    settings = Settings(config=config, data_dir=tmp_path / "data")
    registry = Registry(specs_from_config(load_config(config)), settings, relay_requests=False)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    with anyio.fail_after(5):
        async with registry.running():
            upstream = registry.upstreams["gateway"]
            await upstream.wait_settled()
            assert upstream.state == "failed" and upstream.reason is not None
            assert upstream.reason.startswith(SELF_START)
            assert str(config) in upstream.reason
            assert upstream.pid is None and upstream.eta() == math.inf
            spawned = {child.pid for child in psutil.Process().children(recursive=True)} - before
            tiny = registry.upstreams["tiny"].pid
            assert spawned <= {tiny}, spawned  # the tiny server at most, never a gateway


@pytest.mark.anyio
async def test_a_wrapper_script_that_starts_the_gateway_itself_is_stopped_by_the_chain_and_not_retried(
    tmp_path: Path,
) -> None:
    wrapper = tmp_path / "start-gateway"
    wrapper.write_text(
        '#!/bin/sh\n# static reading cannot see through this script\necho started >> "$SPAWNS"\n'
        'exec "$PYTHON_BIN" -m gateway --config "$1" serve\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    spawns = tmp_path / "spawns"
    config = tmp_path / "wrapped.yaml"
    env = {"SPAWNS": str(spawns), "PYTHON_BIN": PYTHON, "GATEWAY_DATA_DIR": str(tmp_path / "nested-data")}
    entry = {"command": str(wrapper), "args": [str(config)], "env": env}
    write_config(config, json.dumps({"mcps": {"wrapped": entry}}))

    result, gateways = await _run_counting(["--config", str(config), "check", "--json"], tmp_path, config.name)
    row = _rows(result)["wrapped"]
    assert row["state"] == "failed"
    assert SELF_START in row["reason"] and "stderr" in row["reason"], row  # the nested gateway's own words
    assert row["retry_at"] is None
    assert spawns.read_text().splitlines() == ["started"]  # one extra process, once
    assert len(gateways) <= 1


def _gateway_entry(config: Path, tmp_path: Path, **env: str) -> dict:
    """A stdio entry that runs a real nested gateway on `config`, with its own data and no plugins."""
    (tmp_path / "no-plugins").mkdir(exist_ok=True)
    environment = {
        "GATEWAY_DATA_DIR": str(tmp_path / f"data-{config.stem}"),
        "GATEWAY_PLUGINS__DIRECTORY": str(tmp_path / "no-plugins"),
        "GATEWAY_LOG_LEVEL": "WARNING",
        **env,
    }
    return {"command": PYTHON, "args": ["-m", "gateway", "--config", str(config), "serve"], "env": environment}


@pytest.mark.anyio
async def test_a_gateway_that_serves_another_config_still_works_behind_a_gateway(tmp_path: Path) -> None:
    inner = write_config(tmp_path / "inner.yaml", json.dumps({"mcps": {"tiny": _tiny()}}))
    outer = write_config(tmp_path / "outer.yaml", json.dumps({"mcps": {"inner": _gateway_entry(inner, tmp_path)}}))
    arguments = json.dumps({"text": "through two gateways"})
    result, _ = await _run_counting(
        ["--config", str(outer), "call", "inner__tiny__echo", "--args", arguments, "--json"], tmp_path, "inner.yaml"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["content"][0]["text"] == "through two gateways"


@pytest.mark.anyio
async def test_a_gateway_nested_deeper_than_the_cap_refuses_to_start_and_is_not_retried(tmp_path: Path) -> None:
    # This gateway runs second in a chain capped at 2 (as a gateway above it would start it);
    # the gateway it starts would be third, so that one refuses.
    third = write_config(tmp_path / "third.yaml", json.dumps({"mcps": {"tiny": _tiny()}}))
    second = write_config(tmp_path / "second.yaml", json.dumps({"mcps": {"third": _gateway_entry(third, tmp_path)}}))
    env = {CHAIN_VAR: json.dumps([str(tmp_path / "first.yaml")]), "GATEWAY_MAX_NESTING": "2"}
    result, _ = await _run_counting(["--config", str(second), "check", "--json"], tmp_path, "third.yaml", env)
    row = _rows(result)["third"]
    assert row["state"] == "failed"
    assert TOO_DEEP in row["reason"] and "number 3" in row["reason"], row
    assert row["retry_at"] is None


@pytest.mark.anyio
async def test_a_gateway_refuses_to_start_when_the_chain_holds_its_own_config_or_is_at_the_cap(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    own = {CHAIN_VAR: json.dumps([str(tmp_path / "outer.yaml"), str(config)])}
    result, _ = await _run_counting(["--config", str(config), "check"], tmp_path, str(config), own)
    assert result.returncode == 2
    assert f"mcp-gateway: {SELF_START}" in result.stderr

    deep = {CHAIN_VAR: json.dumps(["/a.yaml", "/b.yaml", "/c.yaml"])}  # the default cap is 3
    result, _ = await _run_counting(["--config", str(config), "check"], tmp_path, str(config), deep)
    assert result.returncode == 2
    assert f"mcp-gateway: {TOO_DEEP}" in result.stderr and "number 4" in result.stderr


def test_the_registry_refuses_to_start_under_a_chain_that_holds_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    monkeypatch.setenv(CHAIN_VAR, json.dumps([str(config)]))
    with pytest.raises(RegistrationError, match=SELF_START):
        Registry([], Settings(config=config, data_dir=tmp_path / "data"))
