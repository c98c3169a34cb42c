"""State belongs to a deployment: with no data dir named, each config file gets a data dir of its own.

Two real gateways on one machine, with different configs and no `GATEWAY_DATA_DIR` (the default
parent is moved under the test's directory through `XDG_DATA_HOME`): an HTTP gateway, and a
stdio gateway as a desktop client starts one. Neither sees the other's records or tool
fingerprints (where approvals live), the stdio one's exit leaves the HTTP one's runtime file
alone, and `mcp-gateway reload` and `calls` act on the gateway of the config they are given.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from gateway.config.settings import Settings, deployment_data_dir, legacy_data_dir_notice
from gateway.security.integrity import IntegrityStore
from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    START_DEADLINE,
    _read_line_with_prefix,
    gateway_env,
    stop_process,
    write_config,
)

pytestmark = pytest.mark.anyio


def _env(tmp_path: Path) -> dict[str, str]:
    """A gateway child's environment with no data dir named, its default parent under `tmp_path`."""
    env = {k: v for k, v in gateway_env(tmp_path).items() if k != "GATEWAY_DATA_DIR"}
    return env | NO_EMBEDDINGS | {"XDG_DATA_HOME": str(tmp_path / "xdg")}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gateway", *args]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


def _calls(env: dict[str, str], config: Path) -> list[str]:
    done = _cli(env, "--config", str(config), "calls", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["tool"] for line in done.stdout.splitlines() if line.strip()]


async def test_two_gateways_with_different_configs_never_see_each_others_records_approvals_or_runtime_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])  # for `deployment_data_dir` here, as in the children
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config_a = write_config(
        tmp_path / "a" / "gateway.yaml",
        f'mcps:\n  alpha: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, alpha]}}\n',
    )
    config_b = write_config(tmp_path / "b" / "gateway.yaml", "mcps: {}\n")
    http = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--config", str(config_a), "serve", "--transport", "http", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        url = _read_line_with_prefix(http.stderr, "mcp-gateway: serving on ", START_DEADLINE, http)
        async with Client(url) as client:
            assert (await client.call_tool("alpha__add", {"a": 2, "b": 3})).is_error is False
        # A desktop client starts a gateway of another config over stdio, uses it and quits.
        stdio = StdioServerParameters(
            command=sys.executable, args=["-m", "gateway", "--config", str(config_b), "serve"], env=env, cwd=str(REPO)
        )
        async with Client(stdio) as client:  # type: ignore[arg-type]
            assert (await client.call_tool("mem__echo", {"text": "hi"})).is_error is False
        # ... the HTTP gateway's runtime file is still there: `reload` of its config reaches it.
        reloaded = _cli(env, "--config", str(config_a), "reload", "--json")
        assert reloaded.returncode == 0, reloaded.stderr
        assert "alpha" in json.loads(reloaded.stdout)["unchanged"]
        # `reload` of the other config finds no gateway, and says which data dir it looked in.
        missing = _cli(env, "--config", str(config_b), "reload")
        assert missing.returncode == 2
        assert f"no running gateway uses the data dir {deployment_data_dir(config_b)}" in missing.stderr
    finally:
        stop_process(http)  # a clean stop writes the records still buffered
    dir_a, dir_b = deployment_data_dir(config_a), deployment_data_dir(config_b)
    assert dir_a != dir_b and dir_a.parent == dir_b.parent == tmp_path / "xdg" / "mcp-gateway" / "deployments"
    assert not (dir_a / "gateway.runtime.json").exists() and not (dir_b / "gateway.runtime.json").exists()
    # Records: each config's `calls` shows its own gateway's call and not the other's.
    assert _calls(env, config_a) == ["alpha__add"]
    assert _calls(env, config_b) == ["mem__echo"]
    # Fingerprints (what approvals approve): alpha's tools are known to A alone.
    assert IntegrityStore.in_dir(dir_a).find("alpha__add")
    assert not IntegrityStore.in_dir(dir_b).find("alpha__add")
    assert not (tmp_path / "xdg" / "mcp-gateway" / "records.sqlite3").exists()  # nothing in the old shared dir


def test_a_named_data_dir_is_used_as_it_is_for_every_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "named"))
    settings = Settings().with_config(tmp_path / "a.yaml")
    assert settings.data_dir == tmp_path / "named" and settings.data_dir_named
    assert Settings(data_dir=tmp_path / "x", config=tmp_path / "b.yaml").data_dir == tmp_path / "x"


def test_an_unnamed_data_dir_follows_the_config_and_is_stable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    first = Settings(config=Path("gateway.yaml"))
    assert not first.data_dir_named
    assert first.data_dir == Settings(config=tmp_path / "gateway.yaml").data_dir  # the resolved path counts
    assert first.data_dir.name.startswith(f"{tmp_path.name}-gateway-")
    other = first.with_config(tmp_path / "other.yaml")
    assert other.data_dir != first.data_dir and other.data_dir == deployment_data_dir(tmp_path / "other.yaml")


def test_an_upgrade_is_told_where_the_old_shared_data_is_and_how_to_keep_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    settings = Settings(config=tmp_path / "gateway.yaml")
    assert legacy_data_dir_notice(settings) is None  # nothing old: nothing to say
    old = tmp_path / "xdg" / "mcp-gateway"
    old.mkdir(parents=True)
    (old / "records.sqlite3").write_bytes(b"")
    (old / "notes").mkdir()
    notice = legacy_data_dir_notice(settings)
    assert notice is not None
    assert f"GATEWAY_DATA_DIR={old}" in notice and "records.sqlite3, notes" in notice
    assert str(settings.data_dir) in notice
    settings.data_dir.mkdir(parents=True)
    assert legacy_data_dir_notice(settings) is None  # told once, when the deployment's dir is made
