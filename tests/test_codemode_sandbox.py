"""The code-mode sandbox battery over real HTTP: each hostile or runaway program is refused or cut
with a named limit, while a concurrent client's calls succeed through the same gateway.

One gateway (`python -m gateway serve --transport http`, code mode, API keys with scopes) in front
of two demo servers as stdio children. `test_the_battery_programs_do_their_harm_on_an_unguarded_runtime`
shows what the same programs do in plain CPython: each check here fails on an unguarded runtime.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.errors import ERROR_META_KEY
from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.security.auth import hash_key, new_key
from tests.conftest import DEMO_SERVER, start_gateway_http, stop_process, write_config

pytestmark = pytest.mark.anyio

KEYS = {name: new_key() for name in ("full", "alpha", "admin")}
TIMEOUT = 90
MAX_TOOL_CALLS = 50


@dataclass
class Deployment:
    url: str
    scratch: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("codemode")
    config = write_config(
        tmp / "gateway.yaml",
        f"""
        mcps:
          alpha: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, alpha]}}
          beta: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, beta]}}
        auth:
          api_keys:
            # The concurrent client calls as fast as it is answered, through every case of the
            # battery: the default limit (burst 60, 10 a second) would refuse it on a quick machine.
            - {{name: full, hash: "{hash_key(KEYS["full"])}", rate_limit: {{per_minute: 1000000, burst: 100000}}}}
            - {{name: admin, hash: "{hash_key(KEYS["admin"])}", admin: true}}
            - {{name: alpha-only, hash: "{hash_key(KEYS["alpha"])}", profile: alpha}}
          profiles:
            alpha: {{servers: [alpha]}}
        """,
    )
    env = {
        "GATEWAY_ROUTING__MODE": "code",
        "GATEWAY_EMBEDDING__ENABLED": "false",
        "GATEWAY_CODEMODE__CPU_SECONDS": "2",
        "GATEWAY_CODEMODE__WALL_SECONDS": "30",
        "GATEWAY_CODEMODE__MEMORY_MB": "64",
        "GATEWAY_CODEMODE__MAX_RECURSION_DEPTH": "100",
        "GATEWAY_CODEMODE__MAX_TOOL_CALLS": str(MAX_TOOL_CALLS),
        "GATEWAY_CODEMODE__MAX_OUTPUT_BYTES": "2000",
    }
    process, url = start_gateway_http(config, tmp, env, log=tmp / "gateway.log")
    try:
        yield Deployment(url, tmp)
    finally:
        stop_process(process)


@asynccontextmanager
async def client_for(url: str, key: str) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def run_beside_a_concurrent_client(gateway: Deployment, program: str, key: str = "full") -> types.CallToolResult:
    """Run `program` in code mode while another client (all mode) calls a tool again and again: every
    one of its calls must succeed, and at least one must finish while the program runs."""
    done = anyio.Event()
    answered: list[str] = []

    async def other_client() -> None:
        async with client_for(gateway.url + "?mode=all", KEYS["full"]) as other:
            while not done.is_set() or not answered:
                result = await other.call_tool("alpha__echo", {"text": f"ping {len(answered)}"})
                assert not result.is_error, text_of(result)
                answered.append(text_of(result))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg, client_for(gateway.url, KEYS[key]) as client:
            tg.start_soon(other_client)
            result = await client.call_tool("execute", {"code": program})
            done.set()
    assert answered and answered[0] == "ping 0"
    return result


def refusal(result: types.CallToolResult) -> str:
    assert result.is_error, text_of(result)
    return text_of(result)


def limit_of(result: types.CallToolResult) -> str:
    assert result.is_error, text_of(result)
    error = (result.meta or {})[ERROR_META_KEY]
    assert error["code"] == "program_limit"
    return str(error["limit"])


HARMFUL = {
    "file_read": "open('/etc/hostname').read()",
    "file_write": "f = open('{scratch}/written.txt', 'w')\nf.write('pwned')\nf.close()",
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', 9))",
    "os_listdir": "import os\nos.listdir('/')",
    "os_system": "import os\nos.system('true')",
    "subprocess": "import subprocess\nsubprocess.run(['true'])",
    "ctypes": "import ctypes\nctypes.CDLL(None)",
    "environ": "import os\nos.environ['PATH']",
    "getenv": "import os\nos.getenv('PATH')",
}
"""Programs that would reach the host: the file system, the network, processes, native code, the
environment. Each raises inside the sandbox, before anything happens."""

EXPECTED = {
    "file_read": "PermissionError: Permission denied: '/etc/hostname'",
    "file_write": "PermissionError: Permission denied",
    "socket": "ModuleNotFoundError: No module named 'socket'",
    "os_listdir": "PermissionError: Permission denied: '/'",
    "os_system": "AttributeError",
    "subprocess": "ModuleNotFoundError: No module named 'subprocess'",
    "ctypes": "ModuleNotFoundError: No module named 'ctypes'",
    "environ": "'os.environ' is not supported",
    "getenv": "'os.getenv' is not supported",
}


@pytest.mark.parametrize("case", list(HARMFUL))
async def test_a_program_cannot_reach_files_network_processes_native_code_or_the_environment(
    gateway: Deployment, case: str
) -> None:
    result = await run_beside_a_concurrent_client(gateway, HARMFUL[case].format(scratch=gateway.scratch))
    assert EXPECTED[case] in refusal(result)
    assert not (gateway.scratch / "written.txt").exists()


def test_the_battery_programs_do_their_harm_on_an_unguarded_runtime(tmp_path: Path) -> None:
    """The same programs in plain CPython succeed: the checks above test the sandbox, not Python."""
    for case, program in HARMFUL.items():
        if case == "os_system":
            program = "import os\nassert os.system('true') == 0"
        done = subprocess.run(
            [sys.executable, "-c", program.format(scratch=tmp_path)], capture_output=True, timeout=60, check=False
        )
        harmless = case == "socket" and b"ConnectionRefusedError" in done.stderr  # it did open a socket
        assert done.returncode == 0 or harmless, (case, done.stderr)
    assert (tmp_path / "written.txt").read_text() == "pwned"


async def test_an_infinite_loop_is_stopped_by_the_cpu_time_limit(gateway: Deployment) -> None:
    result = await run_beside_a_concurrent_client(gateway, "n = 0\nwhile True:\n    n += 1")
    assert limit_of(result) == "CPU time (GATEWAY_CODEMODE__CPU_SECONDS)"
    assert "CPU time limit: the program computed for more than 2 s" in text_of(result)


async def test_a_memory_bomb_is_stopped_by_the_memory_limit(gateway: Deployment) -> None:
    program = "blocks = []\nwhile True:\n    blocks.append('x' * 1000000 + str(len(blocks)))"
    result = await run_beside_a_concurrent_client(gateway, program)
    assert limit_of(result) == "memory (GATEWAY_CODEMODE__MEMORY_MB)"
    assert "memory limit: the program needed more than 64 MiB" in text_of(result)


async def test_deep_recursion_is_stopped_by_the_recursion_limit(gateway: Deployment) -> None:
    result = await run_beside_a_concurrent_client(gateway, "def down(n):\n    return down(n + 1)\ndown(0)")
    assert limit_of(result) == "recursion depth (GATEWAY_CODEMODE__MAX_RECURSION_DEPTH)"
    assert "at line 2: return down(n + 1)" in text_of(result)


async def test_huge_printed_output_is_cut_at_the_output_limit_with_a_note(gateway: Deployment) -> None:
    program = "for i in range(20000):\n    print('line', i, 'x' * 50)\n'finished'"
    result = await run_beside_a_concurrent_client(gateway, program)
    assert not result.is_error, text_of(result)
    text = text_of(result)
    assert text.startswith('"finished"\nPrinted output:\nline 0 ')
    assert len(text.encode()) < 3000
    assert "more bytes not kept, output size limit (GATEWAY_CODEMODE__MAX_OUTPUT_BYTES)" in text


async def test_ten_thousand_tool_calls_stop_at_the_tool_call_limit(gateway: Deployment) -> None:
    program = "for i in range(10000):\n    await tools.alpha__echo(text=str(i))\n'all done'"
    result = await run_beside_a_concurrent_client(gateway, program)
    assert limit_of(result) == "tool calls (GATEWAY_CODEMODE__MAX_TOOL_CALLS)"
    assert (result.structured_content or {})["tool_calls"] == MAX_TOOL_CALLS


async def test_a_program_cannot_catch_its_way_past_the_tool_call_limit(gateway: Deployment) -> None:
    program = (
        "made = 0\nfor i in range(200):\n    try:\n        await tools.alpha__echo(text='x')\n"
        "        made += 1\n    except RuntimeError:\n        pass\nmade"
    )
    result = await run_beside_a_concurrent_client(gateway, program)
    assert limit_of(result) == "tool calls (GATEWAY_CODEMODE__MAX_TOOL_CALLS)"


async def test_a_tool_the_callers_scopes_hide_does_not_exist_in_the_program(gateway: Deployment) -> None:
    hidden = await run_beside_a_concurrent_client(gateway, "await tools.beta__echo(text='x')", key="alpha")
    assert "AttributeError: module 'tools' has no attribute 'beta__echo'" in refusal(hidden)
    by_name = await run_beside_a_concurrent_client(gateway, "await call_tool('beta__echo', {'text': 'x'})", key="alpha")
    assert "beta__echo refused (tool_not_found): There is no tool named 'beta__echo'" in refusal(by_name)
    seen = await run_beside_a_concurrent_client(gateway, "(await tools.alpha__echo(text='mine'))['result']", "alpha")
    assert (seen.structured_content or {})["result"] == "mine"
    full = await run_beside_a_concurrent_client(gateway, "(await tools.beta__echo(text='b'))['result']")
    assert (full.structured_content or {})["result"] == "b"


async def test_a_write_tool_without_permission_is_refused_saying_how_to_allow_it(gateway: Deployment) -> None:
    result = await run_beside_a_concurrent_client(gateway, "await tools.alpha__add(a=1, b=2)")
    text = refusal(result)
    assert "PermissionError: alpha__add refused (write_not_allowed)" in text
    assert "GATEWAY_CODEMODE__ALLOW_WRITES" in text and '["alpha__*"]' in text


async def test_the_admin_api_and_the_console_show_a_run_with_the_calls_it_made(gateway: Deployment) -> None:
    program = "a = await tools.alpha__echo(text='one')\nb = await tools.beta__echo(text='two')\n[a, b]"
    result = await run_beside_a_concurrent_client(gateway, program)
    assert not result.is_error, text_of(result)
    run_id = (result.meta or {})[FEEDBACK_TOKEN_META_KEY]
    admin = {"Authorization": f"Bearer {KEYS['admin']}"}
    base = gateway.url.removesuffix("/mcp") + "/admin"
    detail = httpx2.get(f"{base}/api/v1/calls/{run_id}", headers=admin, timeout=30).json()
    assert (detail["server"], detail["tool"], detail["status"]) == ("gateway", "execute", "ok")
    assert [c["tool"] for c in detail["inner_calls"]] == ["alpha__echo", "beta__echo"]
    inner_id = detail["inner_calls"][0]["id"]
    inner = httpx2.get(f"{base}/api/v1/calls/{inner_id}", headers=admin, timeout=30).json()
    assert inner["parent_id"] == run_id and inner["arguments"] == {"text": "one"}
    page = httpx2.get(f"{base}/calls/{run_id}", headers=admin, timeout=30)
    assert page.status_code == 200
    assert "Calls the program made" in page.text and f"/calls/{inner_id}" in page.text
    child = httpx2.get(f"{base}/calls/{inner_id}", headers=admin, timeout=30)
    assert f'href="/admin/calls/{run_id}" id="call-parent"' in child.text


async def test_a_traced_run_shows_each_inner_call_as_a_span_nested_under_the_execute_request(tmp_path: Path) -> None:
    from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
    from tests.test_tracing import CLIENT_SPAN, CLIENT_TRACE, child_config, gateway_tracing_env, traceparent

    config = child_config(tmp_path)
    with OtlpReceiver().running() as receiver:
        env = gateway_tracing_env(receiver) | {"GATEWAY_ROUTING__MODE": "code"}
        process, url = start_gateway_http(config, tmp_path, env, log=tmp_path / "gateway.log")
        try:
            with anyio.fail_after(TIMEOUT):
                async with Client(url) as client:
                    program = "[await tools.child__echo(text='a'), await tools.child__echo(text='b')]"
                    meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
                    result = await client.call_tool("execute", {"code": program}, meta=meta)
                    assert not result.is_error, text_of(result)

                def complete(spans: list[ReceivedSpan]) -> bool:
                    return sum(s.name == "tools/call child__echo" for s in spans) >= 2 and any(
                        s.kind == "SERVER" and s.trace_id == CLIENT_TRACE for s in spans
                    )

                spans = await anyio.to_thread.run_sync(receiver.wait_for, complete, 30)
        finally:
            stop_process(process)
    server = next(s for s in spans if s.kind == "SERVER" and s.trace_id == CLIENT_TRACE)
    assert server.name == "tools/call execute" and server.attributes["gen_ai.tool.name"] == "execute"
    inner = [s for s in spans if s.name == "tools/call child__echo"]
    assert len(inner) == 2 and all(s.parent_id == server.span_id for s in inner)
    assert all(s.attributes["gen_ai.tool.name"] == "child__echo" for s in inner)
    assert {s.attributes["mcp_gateway.codemode.run_id"] for s in inner} == {
        (result.meta or {})[FEEDBACK_TOKEN_META_KEY]
    }
    for span in inner:  # each went upstream as its own request
        assert any(s.parent_id == span.span_id or s.parent_id in _descendants(spans, span) for s in spans)


def _descendants(spans: list[Any], root: Any) -> set[str]:
    found, frontier = set(), {root.span_id}
    while frontier:
        found |= frontier
        frontier = {s.span_id for s in spans if s.parent_id in frontier} - found
    return found
