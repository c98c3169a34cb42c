"""`mcp-gateway calls` over a records store filled by real calls, and the commands that act on a running
gateway (`tools approve`, `servers restart|disable|enable`, `reload`) through a `serve` child."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from gateway.cli.main import run
from gateway.cli.remote import RUNTIME_FILE
from gateway.config.settings import Settings
from gateway.records.service import open_store
from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    START_DEADLINE,
    _read_line_with_prefix,
    gateway_env,
    start_gateway_http,
    stop_process,
    write_config,
)
from tests.records_client import recorded_gateway, token_of

pytestmark = pytest.mark.anyio

POISONED_SERVER = REPO / "tests" / "servers" / "poisoned_server.py"


async def fill(tmp_path: Path) -> dict[str, str]:
    """Calls made by the SDK's client through a gateway in process, recorded in tmp_path/data."""
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        ids = {
            "ok": token_of(await client.call_tool("mem__add", {"a": 2, "b": 3})),
            "echo": token_of(await client.call_tool("mem__echo", {"text": "hello"})),
            "failed": token_of(await client.call_tool("mem__fail", {"message": "no"})),
            "refused": token_of(await client.call_tool("mem__nope", {})),
        }
    return ids


async def test_calls_lists_the_recorded_calls_with_filters_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = await fill(tmp_path)
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    assert run(["calls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TIME", "SERVER", "TOOL", "STATUS", "MS", "ID", "SUMMARY"]
    assert [line.split()[3] for line in lines[1:]] == [
        "mem__add",
        "mem__echo",
        "mem__fail",
        "mem__nope",
    ]  # oldest first
    assert "error (tool_error)" in lines[3] and "refused (tool_not_found)" in lines[4]

    assert run(["calls", "--json", "--tool", "mem__add", "--status", "ok", "--since", "10m"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["status"], r["summary"]) for r in rows] == [(ids["ok"], "ok", "5")]

    assert run(["calls", "--json", "--status", "error"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [ids["failed"]]
    assert run(["calls", "--json", "--status", "refused", "--server", "mem"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [ids["refused"]]
    assert run(["calls", "--json", "--limit", "2"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [ids["failed"], ids["refused"]]
    assert run(["calls", "--server", "nobody"]) == 0
    assert "No calls recorded match." in capsys.readouterr().err


def test_calls_refuses_bad_filters_with_their_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    assert run(["calls", "--since", "yesterday"]) == 2
    assert "--since takes a duration like 30m" in capsys.readouterr().err
    assert run(["calls", "--limit", "0"]) == 2
    assert "limit must be from 1 to 1000; got 0" in capsys.readouterr().err


async def test_calls_follow_prints_calls_recorded_after_it_started(tmp_path: Path) -> None:
    ids = await fill(tmp_path)
    env = gateway_env(tmp_path)
    output = tmp_path / "follow.jsonl"
    follower = subprocess.Popen(
        [sys.executable, "-m", "gateway", "calls", "--follow", "--json", "--tool", "mem__echo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        first = _read_line_with_prefix(follower.stdout, "{", START_DEADLINE, follower, output)  # type: ignore[arg-type]
        assert json.loads("{" + first)["id"] == ids["echo"]
        later = await fill(tmp_path)
        with anyio.fail_after(20):
            while later["echo"] not in output.read_text():
                await anyio.sleep(0.05)
    finally:
        stop_process(follower)
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == [ids["echo"], later["echo"]]


# ---- acting on a running gateway -----------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          alpha: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, alpha]}}
          poisoned: {{command: {sys.executable}, args: ["{POISONED_SERVER}", stdio]}}
        security:
          tool_changes: block
        """,
    )
    log = tmp_path / "gateway.log"  # at INFO: what an operator reads while acting on it
    process, url = start_gateway_http(config, tmp_path, NO_EMBEDDINGS | {"GATEWAY_LOG_LEVEL": "INFO"}, log=log)
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GATEWAY_CONFIG", str(config))
    try:
        yield process, url.removesuffix("/mcp")
    finally:
        stop_process(process)
    assert not (tmp_path / "data" / RUNTIME_FILE).exists()  # removed on exit


def wait_for(base: str, server: str, state: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = httpx2.get(f"{base}/admin/api/v1/servers/{server}", timeout=10).json()
        if found["state"] == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"{server} did not become {state}: {found}")


def test_serve_writes_a_runtime_file_with_its_pid_and_url(served: tuple[object, str], tmp_path: Path) -> None:
    process, base = served
    runtime = json.loads((tmp_path / "data" / RUNTIME_FILE).read_text())
    assert runtime == {"pid": process.pid, "url": base}  # type: ignore[attr-defined]


def test_tools_approve_goes_through_the_running_gateway(
    served: tuple[object, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, base = served
    wait_for(base, "alpha", "ready")
    assert run(["tools", "approve", "alpha__add"]) == 0
    assert "approved alpha__add on the gateway at " + base in capsys.readouterr().out
    audit = httpx2.get(f"{base}/admin/api/v1/audit", timeout=10).json()["audit"]
    assert [(a["principal"], a["action"], a["target"]) for a in audit][0] == ("local", "approve", "alpha__add")
    assert run(["tools", "approve", "alpha__nope"]) == 1
    assert "answered 404: There is no tool 'alpha__nope'" in capsys.readouterr().err


def test_servers_actions_without_a_running_gateway_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / RUNTIME_FILE).write_text(json.dumps({"pid": 2**22 + 7, "url": "http://127.0.0.1:9"}))
    assert run(["servers", "restart", "alpha"]) == 2  # a runtime file whose process is gone is ignored
    assert "no running gateway uses the data dir" in capsys.readouterr().err
    assert run(["reload"]) == 2
    assert "no running gateway uses the data dir" in capsys.readouterr().err


def test_stores_opened_by_the_command_see_the_schema_of_the_console(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path))
    assert store.read("SELECT count(*) FROM audit")[1] == [(0,)]
    store.close()


def test_servers_restart_disable_enable_and_reload_act_on_the_running_gateway(
    served: tuple[object, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, base = served
    wait_for(base, "alpha", "ready")
    wait_for(base, "poisoned", "ready")
    before = {s["server"]: s["pid"] for s in httpx2.get(f"{base}/admin/api/v1/servers", timeout=10).json()["servers"]}
    assert run(["servers", "restart", "alpha"]) == 0
    assert f"restarted alpha on the gateway at {base}" in capsys.readouterr().out
    wait_for(base, "alpha", "ready")
    after = {s["server"]: s["pid"] for s in httpx2.get(f"{base}/admin/api/v1/servers", timeout=10).json()["servers"]}
    assert after["alpha"] != before["alpha"] and after["poisoned"] == before["poisoned"]
    log = (tmp_path / "gateway.log").read_text()
    assert "server 'alpha' (replaced or removed) is stopped (an operator restarted it)" in log
    assert "the gateway stopped" not in log, "the gateway did not stop"

    assert run(["servers", "disable", "alpha"]) == 0
    wait_for(base, "alpha", "disabled")
    assert run(["servers", "restart", "alpha"]) == 1
    assert "answered 409" in capsys.readouterr().err
    assert run(["servers", "enable", "alpha"]) == 0
    wait_for(base, "alpha", "ready")
    assert run(["servers", "restart", "zeta"]) == 1
    assert "answered 404: There is no server 'zeta'" in capsys.readouterr().err

    assert run(["reload", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and {"alpha", "poisoned"} <= set(report["unchanged"])


def test_reload_sends_a_stdio_gateway_sighup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    log = tmp_path / "gateway.log"
    env = gateway_env(tmp_path) | NO_EMBEDDINGS | {"GATEWAY_LOG_LEVEL": "INFO"}
    with open(log, "w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(config), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=env,
            cwd=REPO,
        )
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    runtime = tmp_path / "data" / RUNTIME_FILE
    try:
        deadline = time.monotonic() + 60
        while not runtime.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(runtime.read_text()) == {"pid": child.pid, "url": None}
        assert run(["reload"]) == 0
        assert f"sent SIGHUP to the stdio gateway (pid {child.pid})" in capsys.readouterr().err
        while "received SIGHUP" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "received SIGHUP" in log.read_text() and child.poll() is None  # reloaded, still serving
        assert child.stdin is not None
        child.stdin.close()  # the end of stdin ends a stdio gateway
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert not runtime.exists()
