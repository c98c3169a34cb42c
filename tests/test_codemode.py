"""Code mode in process: the model's program over real servers (the bundled clock, notes and sql
plugins, the demo server, and third-party servers from npm), the tool API, the write gate, what
the model gets back, the records of a run, and a sandbox worker that dies.

The sandbox battery over real HTTP, with scopes and a concurrent client, is `test_codemode_sandbox.py`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.server import MCPServer

import plugins.sql
from gateway.config.routing_settings import CodeModeSettings, EmbeddingSettings, RoutingSettings
from gateway.config.settings import Settings
from gateway.errors import ERROR_META_KEY
from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.records.queries import call_detail
from gateway.records.service import Records, open_store
from gateway.registry import Registry
from gateway.router.service import RouterService, build_router
from gateway.serving.server import GatewayServer
from gateway.upstreams.upstream import UpstreamSpec
from plugins.clock import create_server as create_clock
from plugins.notes import create_server as create_notes
from tests.records_client import records_settings
from tests.servers.demo_server import create_server as create_demo

pytestmark = pytest.mark.anyio

TIMEOUT = 60


@asynccontextmanager
async def code_gateway(
    tmp_path: Path, extra: list[UpstreamSpec] | None = None, **codemode: Any
) -> AsyncIterator[GatewayServer]:
    """A gateway in process in code mode, records on, in front of clock, notes, sql and the demo server."""
    settings = Settings(
        data_dir=tmp_path / "data",
        routing=RoutingSettings(mode="code"),
        embedding=EmbeddingSettings(enabled=False),
        records=records_settings(),
        codemode=CodeModeSettings(**({"cpu_seconds": 5.0, "wall_seconds": 30.0} | codemode)),
    )
    specs = [
        UpstreamSpec(id="clock", prefix="clock", transport="memory", target=create_clock()),
        UpstreamSpec(id="notes", prefix="notes", transport="memory", target=create_notes(tmp_path / "notes")),
        UpstreamSpec(
            id="sql",
            prefix="sql",
            transport="memory",
            target=plugins.sql.create_server(plugins.sql.Config(), tmp_path / "data"),
        ),
        UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_demo("mem")),
        *(extra or []),
    ]
    registry = Registry(specs, settings)
    records = Records(settings.records, open_store(settings), registry.redact)
    registry.record_calls(records.recorder)
    with anyio.fail_after(TIMEOUT):
        async with registry.running(), records.running():
            router = RouterService(registry, settings, lambda: build_router(settings, None))
            registry.task_group.start_soon(router.run)
            await registry.wait_settled()
            yield GatewayServer(registry, settings, router, records=records)


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def execute(client: Client, code: str) -> types.CallToolResult:
    with anyio.fail_after(TIMEOUT):
        return await client.call_tool("execute", {"code": code})


async def value_of(client: Client, code: str) -> Any:
    """Run a program that must succeed; its return value."""
    result = await execute(client, code)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content["result"]


async def test_code_mode_lists_search_describe_and_execute_only(tmp_path: Path) -> None:
    async with code_gateway(tmp_path) as gw, Client(gw.server) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == ["search_tools", "describe_tools", "execute", "submit_feedback"]
        found = await client.call_tool("search_tools", {"query": "search my notes for words"})
        assert not found.is_error
        tools = (found.structured_content or {})["tools"]
        assert "notes__search_notes" in [t["name"] for t in tools]
        assert all("inputSchema" not in t for t in tools)  # signatures come from describe_tools, on demand


async def test_describe_tools_gives_typed_signatures_and_says_which_a_program_may_call(tmp_path: Path) -> None:
    async with code_gateway(tmp_path) as gw, Client(gw.server) as client:
        result = await client.call_tool("describe_tools", {"names": ["notes__search_notes", "notes__add_note", "x"]})
        text = text_of(result)
        assert "async def tools.notes__search_notes(*, query: str, limit: int | None = None) -> {" in text
        assert "query: Words to look for" in text
        assert "# no tool named: x" in text
        assert "# not callable from a program (not read-only, not allowed): notes__add_note" in text
        assert (result.structured_content or {})["read_only"] == {"notes__search_notes": True, "notes__add_note": False}


async def test_a_program_over_the_bundled_plugins_returns_the_right_answers(tmp_path: Path) -> None:
    allowed = ["notes__add_note", "sql__execute_sql"]
    async with code_gateway(tmp_path, allow_writes=allowed) as gw, Client(gw.server) as client:
        program = """
import asyncio
for title, tags in [("Budget 2026", ["money"]), ("Trip to Lyon", ["travel"]), ("Budget review", ["money"])]:
    await tools.notes__add_note(title=title, text="about " + title, tags=tags)
found = await tools.notes__search_notes(query="budget")
rows = (await tools.sql__execute_sql(
    sql="SELECT c.name, COUNT(o.id) FROM customers c JOIN orders o ON o.customer_id = c.id "
        "GROUP BY c.name ORDER BY COUNT(o.id) DESC, c.name LIMIT 3",
    dry_run=False,
))["results"][0]["rows"]
span, later = await asyncio.gather(
    tools.clock__date_difference(start="2026-01-01", end="2026-03-01"),
    tools.clock__add_duration(start="2026-01-30", days=3),
)
{"budget": sorted(h["title"] for h in found["hits"]), "top": rows, "days": span["days"], "later": later}
"""
        value = await value_of(client, program)
        assert value["budget"] == ["Budget 2026", "Budget review"]
        database = sqlite3.connect(tmp_path / "data" / "sql" / "demo.sqlite")
        expected = database.execute(
            "SELECT c.name, COUNT(o.id) FROM customers c JOIN orders o ON o.customer_id = c.id "
            "GROUP BY c.name ORDER BY COUNT(o.id) DESC, c.name LIMIT 3"
        ).fetchall()
        database.close()
        assert [tuple(row) for row in value["top"]] == expected
        assert value["days"] == 59
        assert str(value["later"]["result"]).startswith("2026-02-02")


async def test_a_failing_tool_call_raises_an_exception_the_program_can_catch(tmp_path: Path) -> None:
    async with code_gateway(tmp_path, allow_writes=["mem__fail"]) as gw, Client(gw.server) as client:
        program = """
try:
    await tools.mem__fail(message="the disk is full")
    outcome = "no exception"
except RuntimeError as error:
    outcome = str(error)
try:
    await call_tool("mem__nope", {})
except RuntimeError as error:
    missing = str(error)
[outcome, missing, (await tools.mem__echo(text="still here"))["result"]]
"""
        outcome, missing, echoed = await value_of(client, program)
        assert outcome.startswith("mem__fail failed:") and "the disk is full" in outcome
        assert missing.startswith("mem__nope refused (tool_not_found): There is no tool named 'mem__nope'")
        assert echoed == "still here"


async def test_an_uncaught_failure_names_the_program_line_and_the_inner_call_that_failed(tmp_path: Path) -> None:
    async with code_gateway(tmp_path, allow_writes=["mem__fail"]) as gw, Client(gw.server) as client:
        program = 'first = await tools.mem__echo(text="a")\nprint("before")\nawait tools.mem__fail(message="boom")\n'
        result = await execute(client, program)
        assert result.is_error
        text = text_of(result)
        assert 'The program failed at line 3: await tools.mem__fail(message="boom")' in text
        assert "RuntimeError: mem__fail failed:" in text and "boom" in text
        assert "The inner call that failed: call 2, mem__fail" in text
        assert "Printed output:\nbefore" in text
        assert (result.meta or {})[ERROR_META_KEY]["code"] == "program_error"
        error = (result.structured_content or {})["error"]
        assert error["line"] == 3 and error["failed_call"]["tool"] == "mem__fail"


async def test_a_write_tool_is_refused_in_a_program_saying_how_to_allow_it(tmp_path: Path) -> None:
    async with code_gateway(tmp_path) as gw, Client(gw.server) as client:
        result = await execute(client, 'await tools.notes__add_note(title="x", text="y")')
        text = text_of(result)
        assert result.is_error and "PermissionError: notes__add_note refused (write_not_allowed)" in text
        assert "GATEWAY_CODEMODE__ALLOW_WRITES" in text and '["notes__*"]' in text
        listed = await value_of(client, "await tools.notes__list_notes()")
        assert listed["notes"] == []  # nothing was written


WRITE_TWICE = """
answers = []
for title in ["first", "second"]:
    try:
        answers.append((await tools.notes__add_note(title=title, text="about " + title))["name"])
    except PermissionError as error:
        answers.append(str(error))
answers
"""
ASKED = "The program wants to call write tools: notes__add_note (and any others in this run). Allow?"


def answering(answer: types.ElicitResult) -> tuple[list[str], Any]:
    """An elicitation callback giving `answer`, and the messages it was asked."""
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return answer

    return asked, on_elicit


async def note_titles(client: Client) -> list[str]:
    return [note["title"] for note in (await value_of(client, "await tools.notes__list_notes()"))["notes"]]


async def test_a_client_that_allows_writes_is_asked_once_per_run_and_the_program_writes(tmp_path: Path) -> None:
    asked, on_elicit = answering(types.ElicitResult(action="accept", content={"allow": True}))
    async with (
        code_gateway(tmp_path) as gw,
        Client(gw.server, mode="legacy", elicitation_callback=on_elicit) as client,
    ):
        assert await value_of(client, WRITE_TWICE) == ["first", "second"]
        assert asked == [ASKED]  # once for the run's two write calls
        assert sorted(await note_titles(client)) == ["first", "second"]
        assert await value_of(client, WRITE_TWICE) == ["first-2", "second-2"]
        assert asked == [ASKED, ASKED]  # a new run asks again


@pytest.mark.parametrize(
    "answer",
    [
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="cancel"),
        types.ElicitResult(action="accept", content={"allow": False}),
    ],
    ids=["decline", "cancel", "accept-no"],
)
async def test_a_client_that_does_not_allow_writes_leaves_the_program_a_permission_error_and_nothing_written(
    tmp_path: Path, answer: types.ElicitResult
) -> None:
    asked, on_elicit = answering(answer)
    async with (
        code_gateway(tmp_path) as gw,
        Client(gw.server, mode="legacy", elicitation_callback=on_elicit) as client,
    ):
        first, second = await value_of(client, WRITE_TWICE)
        assert asked == [ASKED]
        for refusal in (first, second):
            assert refusal.startswith("notes__add_note refused (write_not_allowed)")
            assert "GATEWAY_CODEMODE__ALLOW_WRITES" in refusal
            assert "The client was asked once for this run and did not allow write tools." in refusal
        assert await note_titles(client) == []


async def test_a_client_that_does_not_answer_in_time_is_a_no(tmp_path: Path) -> None:
    asked: list[str] = []

    async def never_answers(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with (
        code_gateway(tmp_path, confirm_seconds=0.5) as gw,
        Client(gw.server, mode="legacy", elicitation_callback=never_answers) as client,
    ):
        first, second = await value_of(client, WRITE_TWICE)
        assert asked == [ASKED]
        assert "did not allow write tools" in first and "did not allow write tools" in second
        assert await note_titles(client) == []


async def test_a_client_that_cannot_be_asked_gets_the_refusal_saying_how_to_allow_writes(tmp_path: Path) -> None:
    asked, on_elicit = answering(types.ElicitResult(action="accept", content={"allow": True}))
    async with code_gateway(tmp_path) as gw:
        async with Client(gw.server, mode="legacy") as client:  # no elicitation declared
            first, _ = await value_of(client, WRITE_TWICE)
            assert "Or use a client that supports elicitation" in first
        async with Client(gw.server, elicitation_callback=on_elicit) as modern:  # 2026-07-28: no request mid-call
            first, _ = await value_of(modern, WRITE_TWICE)
            assert "Or use a client that supports elicitation" in first
            assert await note_titles(modern) == []
    async with (
        code_gateway(tmp_path / "off", confirm_writes=False) as gw,
        Client(gw.server, mode="legacy", elicitation_callback=on_elicit) as client,
    ):
        first, _ = await value_of(client, WRITE_TWICE)
        assert "GATEWAY_CODEMODE__ALLOW_WRITES" in first and "elicitation" not in first
    assert asked == []


async def test_records_link_the_inner_calls_to_the_program_run(tmp_path: Path) -> None:
    async with code_gateway(tmp_path) as gw, Client(gw.server) as client:
        program = 'a = await tools.mem__echo(text="one")\nb = await tools.clock__now(timezone="UTC")\n[a, b]'
        result = await execute(client, program)
        run_id = (result.meta or {})[FEEDBACK_TOKEN_META_KEY]
        direct = await client.call_tool("execute", {"code": "1 + 1"})
        assert gw.records is not None
        await gw.records.flush()
        detail = await anyio.to_thread.run_sync(call_detail, gw.records.store, run_id)
        assert detail is not None and (detail["server"], detail["tool"]) == ("gateway", "execute")
        assert "mem__echo" in json.loads(detail["arguments"])["code"]
        assert [(c["tool"], c["status"]) for c in detail["inner_calls"]] == [
            ("mem__echo", "ok"),
            ("clock__now", "ok"),
        ]
        inner = await anyio.to_thread.run_sync(call_detail, gw.records.store, detail["inner_calls"][0]["id"])
        assert inner is not None and inner["parent_id"] == run_id
        direct_id = (direct.meta or {})[FEEDBACK_TOKEN_META_KEY]
        other = await anyio.to_thread.run_sync(call_detail, gw.records.store, direct_id)
        assert other is not None and other["inner_calls"] == []


def _monty_workers() -> list[int]:
    """The pids of this process's sandbox workers (children running the monty binary)."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except FileNotFoundError:
                continue
            if command.endswith(b"monty"):
                found.append(int(pid))
    return found


async def test_a_sandbox_worker_that_dies_fails_its_run_only_and_the_gateway_keeps_serving(tmp_path: Path) -> None:
    started = anyio.Event()
    probe = MCPServer("probe")

    @probe.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def running() -> str:
        """Says the program is running."""
        started.set()
        return "ok"

    spec = UpstreamSpec(id="probe", prefix="probe", transport="memory", target=probe)
    async with (
        code_gateway(tmp_path, extra=[spec], cpu_seconds=60.0, wall_seconds=60.0) as gw,
        Client(gw.server) as client,
    ):
        killed: list[int] = []

        async def kill_the_workers() -> None:
            await started.wait()
            for pid in _monty_workers():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_the_workers)
            result = await execute(client, "await tools.probe__running()\nwhile True:\n    pass")
        assert killed
        assert result.is_error and "SandboxCrashed" in text_of(result), text_of(result)
        assert await value_of(client, '(await tools.mem__echo(text="after"))["result"]') == "after"


async def test_execute_is_refused_outside_code_mode_and_bad_arguments_name_the_parameter(tmp_path: Path) -> None:
    async with code_gateway(tmp_path) as gw, Client(gw.server) as client:
        empty = await client.call_tool("execute", {"code": "  "})
        assert empty.is_error and "execute needs `code`" in text_of(empty)
        extra = await client.call_tool("execute", {"code": "1", "language": "js"})
        assert extra.is_error and "unknown argument(s): language" in text_of(extra)
        names = await client.call_tool("describe_tools", {"names": "notes__add_note"})
        assert names.is_error and "describe_tools needs `names`" in text_of(names)
        gw.settings.routing.mode = "all"
        refused = await client.call_tool("execute", {"code": "1"})
        assert refused.is_error and "is a code-mode tool" in text_of(refused)


async def test_a_return_value_over_the_output_limit_is_cut_with_a_note_naming_it(tmp_path: Path) -> None:
    async with code_gateway(tmp_path, max_output_bytes=1000) as gw, Client(gw.server) as client:
        result = await execute(client, "'x' * 100000")
        assert not result.is_error
        text = text_of(result)
        assert len(text.encode()) < 1400
        note = "[return value cut from 100002 to 1000 bytes: output size limit (GATEWAY_CODEMODE__MAX_OUTPUT_BYTES)"
        assert note in text


# ---- third-party servers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def npm_servers() -> Mapping[str, Path]:
    """The filesystem and memory servers of the compatibility matrix, installed from npm (pinned)."""
    from bench.compat import install
    from bench.compat.servers import SERVERS

    chosen = [s for s in SERVERS if s.id in ("filesystem", "memory")]
    cache = install.install_servers(chosen)
    return {s.id: Path(install.server_command(s, cache)) for s in chosen}


def _stdio(server_id: str, command: Path, args: list[str], env: dict[str, str] | None = None) -> UpstreamSpec:
    parameters = StdioServerParameters(command=str(command), args=args, env={**os.environ, **(env or {})})
    return UpstreamSpec(id=server_id, prefix=server_id, transport="stdio", target=parameters)


async def test_a_program_reads_the_three_largest_files_of_a_directory_through_the_filesystem_server(
    tmp_path: Path, npm_servers: Mapping[str, Path]
) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    for index, size in enumerate([10, 500, 40, 3000, 200, 1200]):
        (folder / f"f{index}.txt").write_text(chr(ord("a") + index) * size)
    fs = _stdio("fs", npm_servers["filesystem"], [str(folder)])
    async with code_gateway(tmp_path, extra=[fs]) as gw, Client(gw.server) as client:
        program = f"""
listing = await tools.fs__list_directory_with_sizes(path={str(folder)!r}, sortBy="size")
text = listing if isinstance(listing, str) else listing["content"]
names = [line.split()[1] for line in text.splitlines() if line.startswith("[FILE]")][:3]
contents = [await tools.fs__read_text_file(path={str(folder)!r} + "/" + name) for name in names]
[[name, len(c if isinstance(c, str) else c["content"])] for name, c in zip(names, contents)]
"""
        assert await value_of(client, program) == [["f3.txt", 3000], ["f5.txt", 1200], ["f1.txt", 500]]


async def test_a_program_creates_entities_in_the_memory_server_and_queries_them_back(
    tmp_path: Path, npm_servers: Mapping[str, Path]
) -> None:
    memory = _stdio("memory", npm_servers["memory"], [], {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")})
    gateway = code_gateway(tmp_path, extra=[memory], allow_writes=["memory__create_*"])
    async with gateway as gw, Client(gw.server) as client:
        program = """
people = [("Ada", "mathematician"), ("Grace", "admiral"), ("Alan", "mathematician")]
await tools.memory__create_entities(entities=[
    {"name": name, "entityType": "person", "observations": [job]} for name, job in people
])
await tools.memory__create_relations(relations=[{"from": "Ada", "to": "Alan", "relationType": "inspired"}])
found = await tools.memory__search_nodes(query="mathematician")
graph = found if isinstance(found, dict) else json.loads(found)
{"found": sorted(e["name"] for e in graph["entities"]),
 "relations": [[r["from"], r["to"]] for r in graph["relations"]]}
"""
        value = await value_of(client, "import json\n" + program)
        assert value == {"found": ["Ada", "Alan"], "relations": [["Ada", "Alan"]]}


async def test_serve_mode_code_over_stdio_lists_the_code_tools_and_runs_a_program(tmp_path: Path) -> None:
    from tests.conftest import REPO, gateway_env, write_config

    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio", "--mode", "code"],
        env=gateway_env(tmp_path) | {"GATEWAY_EMBEDDING__ENABLED": "false"},
        cwd=str(REPO),
    )
    with anyio.fail_after(TIMEOUT):
        async with Client(parameters) as client:  # type: ignore[arg-type]
            names = [t.name for t in (await client.list_tools()).tools]
            assert names[:3] == ["search_tools", "describe_tools", "execute"]
            assert await value_of(client, "print('hi')\n6 * 7") == 42


async def test_serve_mode_code_over_stdio_asks_the_client_once_before_a_program_writes(tmp_path: Path) -> None:
    from tests.conftest import REPO, gateway_env, write_config

    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio", "--mode", "code"],
        env=gateway_env(tmp_path, plugins_dir=REPO / "plugins") | {"GATEWAY_EMBEDDING__ENABLED": "false"},
        cwd=str(REPO),
    )
    asked, on_elicit = answering(types.ElicitResult(action="accept", content={"allow": True}))
    with anyio.fail_after(TIMEOUT):
        async with Client(parameters, mode="legacy", elicitation_callback=on_elicit) as client:  # type: ignore[arg-type]
            assert await value_of(client, WRITE_TWICE) == ["first", "second"]
            assert asked == [ASKED]
            assert sorted(await note_titles(client)) == ["first", "second"]


def test_a_signature_is_typed_from_the_schema_and_a_name_python_cannot_spell_is_called_by_name() -> None:
    from gateway.codemode import signature

    tool = types.Tool(
        name="x",
        description="Find rows.",
        input_schema={
            "type": "object",
            "properties": {
                "table": {"type": "string", "description": "The table."},
                "limit": {"type": "integer"},
                "order": {"enum": ["asc", "desc"]},
                "ids": {"type": "array", "items": {"type": ["integer", "null"]}},
            },
            "required": ["table"],
        },
        output_schema={"type": "object", "properties": {"rows": {"type": "array"}}, "required": ["rows"]},
    )
    head = (
        "async def tools.db__find(*, table: str, limit: int | None = None, "
        'order: Literal["asc", "desc"] | None = None, ids: list[int | None] | None = None) -> {"rows": list[Any]}:'
    )
    assert signature("db__find", tool).splitlines()[:3] == [head, '    """Find rows.', '    table: The table."""']
    hyphenated = signature("my-db__find", tool).splitlines()
    assert hyphenated[0] == '# not a Python name: await call_tool("my-db__find", {...}) with the arguments below'
    assert hyphenated[1].startswith('async def call_tool("my-db__find", {table: str, limit: int | None = None')


async def test_a_program_waiting_on_a_slow_tool_is_stopped_by_the_wall_time_limit(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    async with code_gateway(tmp_path, wall_seconds=2.0) as gw, Client(gw.server) as client:
        program = f"await tools.mem__slow_lookup(seconds=600, marker={str(marker)!r})"
        result = await execute(client, program)
        assert result.is_error and marker.read_text() == "start\n"  # the call was made, then cancelled
        assert (result.meta or {})[ERROR_META_KEY]["limit"] == "wall time (GATEWAY_CODEMODE__WALL_SECONDS)"
        assert "wall time limit: the program ran for more than 2 s, tool calls included" in text_of(result)
        slept = await execute(client, "import time\ntime.sleep(600)")
        assert (slept.meta or {})[ERROR_META_KEY]["limit"] in {
            "wall time (GATEWAY_CODEMODE__WALL_SECONDS)",
            "sleep time (GATEWAY_CODEMODE__WALL_SECONDS)",
        }
        assert await value_of(client, "1 + 1") == 2
