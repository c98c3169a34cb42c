"""A new user's first minutes: `scripts/serve` starts warm without installing, the start-up lines and
`GET /` say where the MCP endpoint and the console are, `serve --help` explains every option."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters

from gateway.security.auth import hash_key, new_key
from tests.conftest import (
    NO_EMBEDDINGS,
    REPO,
    START_DEADLINE,
    _read_line_with_prefix,
    free_port,
    gateway_env,
    stop_process,
    write_config,
)

SERVING = "mcp-gateway: serving on "
CONSOLE = "mcp-gateway: console on "
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
}


def _start(argv: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen[str], str, str]:
    """Start a gateway command; return it, the URL of its serving line and the rest of its console line."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert process.stderr is not None
    console = _read_line_with_prefix(process.stderr, CONSOLE, START_DEADLINE, process, log)
    serving = [line for line in log.read_text().splitlines() if line.startswith(SERVING)]
    assert serving, log.read_text()
    return process, serving[-1][len(SERVING) :].strip(), console


def test_the_start_up_lines_name_the_mcp_endpoint_the_console_and_how_to_stop(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    argv = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "http", "--port", "0"]
    process, url, console = _start(argv, gateway_env(tmp_path) | NO_EMBEDDINGS, tmp_path / "stderr.log")
    try:
        port = url.split(":")[2].split("/")[0]
        assert url == f"http://127.0.0.1:{port}/mcp"
        assert console == f"http://127.0.0.1:{port}/admin (Ctrl-C stops the gateway)"
        page = httpx2.get(console.split()[0], timeout=30)
        assert page.status_code == 200 and "<html" in page.text  # the console itself, open on loopback
    finally:
        stop_process(process)


def test_the_bare_address_answers_a_page_naming_the_endpoint_and_the_console_even_with_auth_on(
    tmp_path: Path,
) -> None:
    key = new_key()
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        auth:
          api_keys:
            - {{name: laptop, hash: "{hash_key(key)}"}}
        mcps: {{}}
        """,
    )
    argv = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "http", "--port", "0"]
    process, url, _ = _start(argv, gateway_env(tmp_path) | NO_EMBEDDINGS, tmp_path / "stderr.log")
    base = url.removesuffix("/mcp")
    try:
        with httpx2.Client(timeout=30) as client:
            index = client.get(base + "/")
            assert index.status_code == 200, index.text
            assert index.headers["content-type"].startswith("text/html")
            assert 'href="/mcp"' in index.text and 'href="/admin"' in index.text and 'href="/healthz"' in index.text
            # A client given the bare address instead of the endpoint is told where the endpoint is.
            misdirected = client.post(base + "/", json=INITIALIZE, headers=MCP_HEADERS)
            assert misdirected.status_code == 404
            assert "/mcp" in misdirected.json()["error"]
            # The page is all that is open: the endpoint still wants a key.
            assert client.post(url, json=INITIALIZE, headers=MCP_HEADERS).status_code == 401
            authorized = MCP_HEADERS | {"Authorization": f"Bearer {key}"}
            assert client.post(url, json=INITIALIZE, headers=authorized).status_code == 200
    finally:
        stop_process(process)


def test_serve_help_explains_each_option_with_its_default() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--help"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps to the terminal's width
    assert "--transport {stdio,http} stdio for a desktop client" in text
    assert "(default: stdio)" in text
    assert "(default: $GATEWAY_HTTP__HOST or 127.0.0.1)" in text
    assert "(default: $GATEWAY_HTTP__PORT or 8765; 0 picks a free one)" in text
    assert "foreground until Ctrl-C" in text and "http://HOST:PORT/admin" in text


def test_scripts_serve_starts_warm_without_installing_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    """`scripts/test` bootstraps .venv before the tests run, so `scripts/serve` must find it up to date."""
    _assert_venv_installed_for(REPO / "pyproject.toml")
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    env = gateway_env(tmp_path) | NO_EMBEDDINGS | {"GATEWAY_CONFIG": str(config)}
    log = tmp_path / "stderr.log"
    process, url, console = _start([str(REPO / "scripts" / "serve"), "--port", "0"], env, log)
    try:
        answer = httpx2.post(url, json=INITIALIZE, headers=MCP_HEADERS, timeout=30)
        assert answer.status_code == 200 and answer.json()["result"]["serverInfo"]
        assert console.endswith("/admin (Ctrl-C stops the gateway)")
        process.send_signal(signal.SIGINT)  # what Ctrl-C sends: serve runs in the foreground, exec'd by the script
        assert process.wait(timeout=60) == 0
        printed = log.read_text()
        for sign in ("Editable installation", "Successfully installed", "pip install", "Location '"):  # pip's output
            assert sign not in printed, printed
    finally:
        stop_process(process)  # closes its pipe too


def _bootstrap_copy(tmp_path: Path) -> tuple[Path, Path]:
    """scripts/bootstrap in a project of its own whose `.venv/bin/python` only records what it is asked
    to run, and on `pip install -e` makes what an install leaves (the command and the package metadata):
    the script's decision to install or not, without a real install. Returns the script and the record."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "bootstrap", project / "scripts" / "bootstrap")
    (project / "pyproject.toml").write_text('[project]\nname = "mcp-gateway"\nversion = "1"\n')
    venv = project / ".venv"
    (venv / "bin").mkdir(parents=True)
    record = tmp_path / "pip-calls"
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{record}"\n'
        'case "$*" in "-c import pip") exit 0 ;; esac\n'
        'case "$*" in *" -e "*)\n'
        f'  touch "{venv}/bin/mcp-gateway" && chmod +x "{venv}/bin/mcp-gateway"\n'
        f'  mkdir -p "{venv}/lib/python3.11/site-packages/mcp_gateway-1.dist-info" ;;\n'
        "esac\n"
    )
    python.chmod(0o755)
    return project / "scripts" / "bootstrap", record


def _installs(script: Path, record: Path, *args: str) -> bool:
    """Run the script; whether it ran `pip install -e` this time."""
    before = record.read_text() if record.exists() else ""
    subprocess.run([str(script), *args], check=True, timeout=60, env={**os.environ, "PYTHON": "false"})
    after = record.read_text() if record.exists() else ""
    return " -e " in after[len(before) :]


def test_bootstrap_installs_only_when_the_venv_or_pyproject_or_the_extras_asked_for_changed(tmp_path: Path) -> None:
    script, record = _bootstrap_copy(tmp_path)
    project = script.parent.parent
    assert _installs(script, record)  # no stamp yet: a first install
    assert not _installs(script, record)  # warm: nothing changed
    assert _installs(script, record, "test,bench")  # extras not installed yet
    assert not _installs(script, record)  # fewer extras than installed: nothing to do
    assert not _installs(script, record, "bench")
    (project / "pyproject.toml").write_text('[project]\nname = "mcp-gateway"\nversion = "2"\n')
    assert _installs(script, record)  # the package's metadata changed
    assert not _installs(script, record)
    shutil.rmtree(project / ".venv" / "lib")
    assert _installs(script, record)  # the installed package is gone from .venv
    assert _installs(script, record, "--force")


def _quick_start_blocks() -> list[tuple[str, str]]:
    """The README's quick start, as (language, body) of each fenced block, in order."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)


def _commands(body: str) -> list[str]:
    return [line for line in body.splitlines() if line.strip()]


def _assert_venv_installed_for(pyproject: Path) -> None:
    """The tests run scripts against this checkout's .venv: it must be up to date for `pyproject`, or the
    script would install into it while other tests use it. `scripts/test` bootstraps before the tests."""
    stamp = REPO / ".venv" / ".mcp-gateway-installed"
    digest = hashlib.sha256(pyproject.read_bytes()).hexdigest()
    assert stamp.exists() and stamp.read_text().split("\n", 1)[0] == digest, (
        f".venv was not installed by scripts/bootstrap for {pyproject}: run scripts/bootstrap first"
    )


def _shared_venv(clone: Path) -> None:
    """The clone uses this checkout's .venv (a real install would take minutes), so its scripts find it
    up to date; that holds only if the stamp was made for the clone's pyproject.toml, never reinstall."""
    _assert_venv_installed_for(clone / "pyproject.toml")
    (clone / ".venv").symlink_to(REPO / ".venv")


@pytest.mark.anyio
async def test_the_readme_quick_start_works_word_by_word_from_a_fresh_clone(tmp_path: Path) -> None:
    """Each command of the quick start, as written, from a `git clone` of this repository (HEAD, with
    its own external-mcps.yaml), and both client configs with the SDK's client. What differs from a
    user's first run, and why: `<repository URL>` is this checkout; the clone's .venv is this
    checkout's (so the gateway's code is this checkout's, editable-installed; the install itself is
    what `scripts/bootstrap` does, tested above); the environment names a free port for 8765 (the
    machine is shared), a data dir of the test's own, and no embedding model (BM25 ranks `search`)."""
    blocks = _quick_start_blocks()
    bash = [body for lang, body in blocks if lang == "bash"]
    expected_lines = next(body for lang, body in blocks if lang == "text")
    client_configs = [json.loads(body) for lang, body in blocks if lang == "json"]
    clone_command, serve_command = _commands(bash[0])
    assert clone_command == "git clone <repository URL> mcp-gateway && cd mcp-gateway"
    assert serve_command == "scripts/serve"

    subprocess.run(
        ["bash", "-c", clone_command.replace("<repository URL>", str(REPO))], cwd=tmp_path, check=True, timeout=120
    )
    clone = tmp_path / "mcp-gateway"
    _shared_venv(clone)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | NO_EMBEDDINGS
    env |= {"GATEWAY_DATA_DIR": str(tmp_path / "data"), "GATEWAY_HTTP__PORT": str(port)}

    log = tmp_path / "serve.log"
    serve = subprocess.Popen(
        ["bash", "-c", serve_command], cwd=clone, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert serve.stderr is not None
        _read_line_with_prefix(serve.stderr, CONSOLE, START_DEADLINE, serve, log)
        printed = [line for line in log.read_text().splitlines() if line.startswith("mcp-gateway: ")]
        assert printed == expected_lines.replace("8765", str(port)).splitlines()
        assert httpx2.get(f"http://127.0.0.1:{port}/admin", timeout=30).status_code == 200

        outputs = []
        for command in _commands(bash[1]):
            done = subprocess.run(
                ["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True, timeout=180
            )
            assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
            outputs.append(done.stdout)
        tools, search, call = outputs
        assert "clock__now" in tools and "sql__" in tools and "notes__" in tools
        assert "clock__" in search.splitlines()[1]  # the first ranked tool, under the heading
        assert "Asia/Tokyo" in call

        http_config, stdio_config = client_configs
        url = http_config["mcpServers"]["gateway"]["url"].replace("8765", str(port))
        stdio = stdio_config["mcpServers"]["gateway"]
        params = StdioServerParameters(
            command=stdio["command"].replace("/path/to/mcp-gateway", str(clone)),
            args=[arg.replace("/path/to/mcp-gateway", str(clone)) for arg in stdio["args"]],
            env=env,
            cwd=str(tmp_path),  # a desktop client starts it in a directory of its own
        )
        with anyio.fail_after(180):
            for target in (url, params):
                async with Client(target) as client:  # type: ignore[arg-type]
                    names = {tool.name for tool in (await client.list_tools()).tools}
                    assert "clock__now" in names
                    result = await client.call_tool("clock__now", {"timezone": "Asia/Tokyo"})
                    assert not result.is_error and "Asia/Tokyo" in result.content[0].text  # type: ignore[union-attr]

        serve.send_signal(signal.SIGINT)  # Ctrl-C
        assert serve.wait(timeout=60) == 0
    finally:
        stop_process(serve)
