"""An idle gateway keeps out of memory what only a feature it is not using needs: the console's
templates (Jinja2), code mode's sandbox (pydantic-monty), JWT auth (PyJWT), the MCP SDK's rich log
handler (never used once the gateway's logging is set up), WebSockets (no route takes them), and,
with the router on, the Rust tokenizer (the bundled model's word pieces come from
`gateway.router.wordpiece` for the example's texts). Each is imported where that feature first
runs; a real gateway on the example config, asked over HTTP, shows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2

from tests.conftest import NO_EMBEDDINGS, REPO, _read_line_with_prefix, example_config, stop_process, write_config
from tests.test_first_run import INITIALIZE, MCP_HEADERS

LAZY = ("jinja2", "jwt", "pydantic_monty", "rich", "websockets")
"""Top-level packages a gateway that serves MCP (no console page, no program, no `auth.jwt`) never imports."""

# `python -m gateway`, with the names of its loaded modules written to a file when it exits (after
# it has served: shutdown imports count too, which only makes the check stricter).
RUN_AND_REPORT = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
import runpy
runpy.run_module("gateway", run_name="__main__", alter_sys=True)
"""


def _served_modules(tmp_path: Path, config: Path, env: dict[str, str], wait_for: str | None = None) -> set[str]:
    """Start a gateway on `config` over HTTP, initialize and list tools through it, wait for a log line
    with `wait_for` if given (bounded), stop it; its modules."""
    out = tmp_path / "modules.json"
    argv = [sys.executable, "-c", RUN_AND_REPORT, str(out), "--config", str(config), "serve", "--transport", "http"]
    process = subprocess.Popen(
        [*argv, "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        assert process.stderr is not None
        url = _read_line_with_prefix(process.stderr, "mcp-gateway: serving on ", 120, process, tmp_path / "log").strip()
        with httpx2.Client(timeout=30, headers=MCP_HEADERS) as http:
            answer = http.post(url, json=INITIALIZE)
            assert answer.status_code == 200, answer.text
            session = {"Mcp-Session-Id": answer.headers["mcp-session-id"]}
            http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
            listed = http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session)
            assert listed.status_code == 200 and "sql__" in listed.text  # the example config's plugins serve
        deadline = time.monotonic() + 120
        while wait_for is not None and wait_for not in (tmp_path / "log").read_text():
            assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "log").read_text()
            time.sleep(0.2)
    finally:
        stop_process(process)
    assert process.returncode == 0, (tmp_path / "log").read_text()
    return set(json.loads(out.read_text()))


def _env(tmp_path: Path, embeddings: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env |= {"GATEWAY_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    return env if embeddings else env | NO_EMBEDDINGS


def test_a_gateway_serving_the_example_config_imports_no_feature_it_does_not_use(tmp_path: Path) -> None:
    modules = _served_modules(tmp_path, example_config(tmp_path / "config"), _env(tmp_path))
    assert "gateway.serving.admin.ui" in modules and "gateway.codemode.sandbox" in modules  # the check can fail
    assert "gateway.security.auth" in modules
    loaded = sorted(m for m in modules if m.split(".")[0] in LAZY)
    assert loaded == []


def test_with_the_router_on_the_example_config_is_embedded_without_the_rust_tokenizer(tmp_path: Path) -> None:
    config, env = example_config(tmp_path / "config"), _env(tmp_path, embeddings=True)
    modules = _served_modules(tmp_path, config, env, wait_for="full texts embedded")  # the cold index is done
    assert "onnxruntime" in modules and "gateway.router.wordpiece" in modules  # the model ran
    loaded = sorted(m for m in modules if m.split(".")[0] in (*LAZY, "tokenizers", "fastembed"))
    assert loaded == []


def test_a_broken_jwks_file_is_still_an_error_at_start_though_pyjwt_is_imported_late(tmp_path: Path) -> None:
    (tmp_path / "jwks.json").write_text("{not json")
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        auth:
          jwt:
            jwks_file: "{tmp_path / "jwks.json"}"
            issuer: https://id.example.com
            audience: gw
            default_profile: ro
          profiles: {{ro: {{}}}}
        mcps: {{}}
        """,
    )
    argv = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "http", "--port", "0"]
    done = subprocess.run(argv, env=_env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot read the JWKS file" in done.stderr, done.stderr
