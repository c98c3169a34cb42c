"""Upstreams as they are in the wild: handshake-era servers, several clients, dying and shutting down."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    gateway_env,
    gateway_over_stdio,
    start_gateway_http,
    stop_process,
    write_config,
)

pytestmark = pytest.mark.anyio


def legacy_child_config(tmp_path: Path, *, pid_file: Path | None = None) -> Path:
    extra = f', --pid-file, "{pid_file}"' if pid_file is not None else ""
    return write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          old:
            description: the demo server, spoken to with the initialize handshake only
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, old{extra}]
            protocol: legacy
        """,
    )


def _sampler(name: str) -> Any:
    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=f"answer for {name}"), model="m"
        )

    return sample


async def test_a_handshake_era_upstream_is_served_and_its_sampling_request_reaches_the_one_client(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with gateway_over_stdio(
            legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS, sampling_callback=_sampler("A")
        ) as client:
            result = await client.call_tool("old__add", {"a": 20, "b": 22})
            assert result.structured_content == {"result": 42}
            result = await client.call_tool("old__ask_llm_after", {"question": "q", "delay": 0})
            assert result.content[0].text == "LLM said: answer for A"  # type: ignore[union-attr]


async def test_a_sampling_request_is_never_relayed_to_another_clients_session(tmp_path: Path) -> None:
    """Two clients call the same handshake-era stdio server at once: its sampling request
    cannot say which call it belongs to, so the gateway refuses rather than guess."""
    process, url = start_gateway_http(legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS)
    outcomes: dict[str, str] = {}

    async def one_client(name: str) -> None:
        async with Client(url, mode="legacy", sampling_callback=_sampler(name)) as client:
            try:
                result = await client.call_tool("old__ask_llm_after", {"question": name, "delay": 1.0})
                outcomes[name] = result.content[0].text  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the refusal arrives as the upstream's JSON-RPC error
                outcomes[name] = f"error: {exc}"

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one_client, "A")
                tg.start_soon(one_client, "B")
    finally:
        stop_process(process)
    for name, other in (("A", "B"), ("B", "A")):
        assert f"answer for {other}" not in outcomes[name]
        assert outcomes[name] == f"LLM said: answer for {name}" or "several clients" in outcomes[name]
    assert any("several clients" in text for text in outcomes.values()), outcomes


async def test_resource_links_in_a_tool_result_point_at_readable_namespaced_uris(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with gateway_over_stdio(legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS) as client:
            result = await client.call_tool("old__link_readme", {})
            link, embedded = result.content
            assert isinstance(link, types.ResourceLink) and link.uri == "old+demo://readme"
            assert isinstance(embedded, types.EmbeddedResource) and embedded.resource.uri == "old+demo://readme"
            readme = await client.read_resource(link.uri)
            assert readme.contents[0].text == "old readme"  # type: ignore[union-attr]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_sigterm_stops_the_gateway_and_reaps_its_stdio_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    process, _url = start_gateway_http(legacy_child_config(tmp_path, pid_file=pid_file), tmp_path, NO_EMBEDDINGS)
    try:
        with anyio.fail_after(30):
            while not pid_file.exists() or not pid_file.read_text():  # the child writes it on start
                await anyio.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        with anyio.fail_after(10):
            while _alive(child):
                await anyio.sleep(0.05)
    finally:
        stop_process(process)


def test_a_busy_port_is_one_clear_line_and_exit_code_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "--config", str(write_config(tmp_path / "gw.yaml", "mcps: {}\n"))]
            + ["serve", "--transport", "http", "--port", str(port)],
            capture_output=True,
            text=True,
            env=gateway_env(tmp_path),
            cwd=REPO,
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr.strip() == f"mcp-gateway: cannot listen on 127.0.0.1:{port}: Address already in use"


async def test_the_servers_instructions_reach_the_client_under_their_names(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with gateway_over_stdio(legacy_child_config(tmp_path), tmp_path, NO_EMBEDDINGS, mode="legacy") as client:
            instructions = client.instructions or ""
    assert "aggregates several MCP servers" in instructions
    assert "## old (tools 'old__*')\nThe old test server." in instructions
