"""Execution records, feedback and searches, on a gateway in process in front of real in-memory servers.

Every test talks to the gateway with the SDK's real client; the records are read back
from the real store (SQLite in the test's data dir; PostgreSQL in test_records_postgres.py).
"""

from __future__ import annotations

import json
import sqlite3
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.calls import ToolCall, compose
from gateway.calls.retry import Retries
from gateway.config.runtime_settings import RecordsSettings
from gateway.config.settings import Settings
from gateway.errors import ERROR_META_KEY, UpstreamUnavailable
from gateway.records.audit import AuditRow, audit_rows, write_audit
from gateway.records.cut import truncated_arguments
from gateway.records.feedback import FeedbackError, parse_feedback
from gateway.records.migrations import MIGRATIONS
from gateway.records.model import FEEDBACK_TOKEN_META_KEY, PendingExecution
from gateway.records.recorder import CallRecorder
from gateway.records.redaction import Redactor, no_mask
from gateway.records.rows import StoredLimits, execution_rows
from gateway.records.service import FEEDBACK_MARGIN, Records, open_store
from gateway.records.sqlite import SqliteStore
from gateway.records.store import Batch, RecordStore
from gateway.records.trail import SearchTrail
from gateway.records.writer import RecordWriter
from gateway.registry import Registry
from gateway.router.service import RouterService, build_router
from gateway.serving.server import GatewayServer
from gateway.sizes import cut_bytes
from gateway.upstreams.upstream import UpstreamSpec
from tests.conftest import NO_EMBEDDINGS, start_gateway_http, stop_process, write_config
from tests.records_client import (
    SECRET,
    check_cut_records,
    check_usage_signals,
    recorded_gateway,
    records_of,
    records_settings,
    table,
    text_of,
    token_of,
)
from tests.servers.demo_server import create_server

pytestmark = pytest.mark.anyio

# ---- what is recorded -------------------------------------------------------------------------


class Poisoning(httpx2.AsyncBaseTransport):
    """An HTTP transport that writes `POISON` in a request's JSON as a lone UTF-16 surrogate, `\\ud800`:
    JSON allows it, UTF-8 does not (the SDK's client cannot send one; a hand-written client can)."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        if b"POISON" in body:
            headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-length"]
            body = body.replace(b"POISON", b"\\ud800 and \\u0000")  # and a NUL, which PostgreSQL refuses
            request = httpx2.Request(request.method, request.url, headers=headers, content=body)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_result_holding_a_lone_surrogate_costs_no_other_callers_record(tmp_path: Path) -> None:
    """Over real HTTP: a caller has a lone surrogate echoed between a real SDK client's calls, in the same
    batches; every call of the good client is on record, and the poisoned ones are stored escaped."""
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    process, url = start_gateway_http(config, tmp_path, NO_EMBEDDINGS | {"GATEWAY_RECORDS__FLUSH_INTERVAL": "0.2"})
    good: list[str] = []
    try:
        with anyio.fail_after(60):
            async with (
                Client(url) as client,
                httpx2.AsyncClient(transport=Poisoning(), timeout=20) as http,
                Client(streamable_http_client(url, http_client=http)) as poisoner,
            ):
                for i in range(20):
                    good.append(token_of(await client.call_tool("mem__echo", {"text": f"good {i}"})))
                    with pytest.raises(MCPError):  # the answer holds the surrogate: the SDK cannot parse it
                        await poisoner.call_tool("mem__echo", {"text": "POISON"})
                    await anyio.sleep(0.02)
    finally:
        stop_process(process)  # a clean stop flushes what is buffered
    store = SqliteStore(tmp_path / "data" / "records.sqlite3")
    names, rows = store.rows("executions")
    store.close()
    stored = {row[names.index("id")]: row for row in rows}
    assert [token for token in good if token not in stored] == []
    poisoned = [row for token, row in stored.items() if token not in good]
    assert len(poisoned) == 20
    summary = poisoned[0][names.index("response_summary")]
    assert "\\ud800 and \\u0000" in summary, summary


def test_a_record_the_store_refuses_is_stored_as_its_summary_and_the_others_of_its_batch_as_they_are(
    tmp_path: Path,
) -> None:
    store = RefusingStore(tmp_path / "r.sqlite3")
    records = Records(records_settings(batch_size=100), store)
    kept = [records.record_search(f"q{i}", ["a"], 1.0, session_id=None, client_id=None) for i in range(3)]
    refused = records.record_search("refuse me", ["a"], 1.0, session_id=None, client_id=None)
    kept.append(records.record_search("q3", ["a"], 1.0, session_id=None, client_id=None))
    records.writer.flush()
    assert (records.writer.written, records.writer.summarized, records.writer.dropped) == (4, 1, 0)
    names, rows = SqliteStore(tmp_path / "r.sqlite3").rows("searches")
    queries = {row[names.index("id")]: row[names.index("query")] for row in rows}
    assert sorted(queries) == sorted([*kept, refused])
    assert queries[refused].startswith("[not stored: ValueError: a query the test refuses")


class RefusingStore(SqliteStore):
    """A real SQLite store that refuses any batch holding the query 'refuse me' (as a database refuses bad text)."""

    def write(self, batch: Any) -> None:
        if any(search.query == "refuse me" for search in batch.searches):
            raise ValueError("a query the test refuses")
        super().write(batch)


def pending_call(
    number: int, arguments: dict[str, Any], result: types.CallToolResult, parent_id: str | None = None
) -> PendingExecution:
    """A call of `s__t` as the recorder hands it over, its id made of `number`."""
    return PendingExecution(
        id=f"{number:032x}",
        at=1.0,
        server="s",
        tool="s__t",
        session_id=None,
        client_id=None,
        arguments=arguments,
        latency_ms=1.0,
        attempts=1,
        search_id=None,
        result=result,
        parent_id=parent_id,
    )


class RefusingCallStore(SqliteStore):
    """A real SQLite store that refuses any batch holding a call whose arguments name 'refuse me'."""

    def write(self, batch: Any) -> None:
        if any(row[6] is not None and "refuse me" in row[6] for row in batch.executions):
            raise ValueError("arguments the test refuses")
        super().write(batch)


def test_a_call_the_store_refuses_is_stored_as_its_summary_with_its_status_and_parent(tmp_path: Path) -> None:
    records = Records(records_settings(batch_size=100), RefusingCallStore(tmp_path / "r.sqlite3"))
    for i, text in enumerate(["fine", "refuse me", "fine too"]):
        result = types.CallToolResult(content=[types.TextContent(type="text", text=f"said {text}")], is_error=i == 1)
        records.submit_execution(pending_call(i, {"text": text}, result, parent_id="p" * 32))
    records.writer.flush()
    assert (records.writer.written, records.writer.summarized, records.writer.dropped) == (2, 1, 0)
    names, rows = SqliteStore(tmp_path / "r.sqlite3").rows("executions")
    by_id = {row[names.index("id")]: dict(zip(names, row, strict=True)) for row in rows}
    refused = by_id[f"{1:032x}"]
    assert refused["response_summary"].startswith("[not stored: ValueError: arguments the test refuses")
    assert (refused["arguments"], refused["status"], refused["error_code"]) == (None, "error", "tool_error")
    assert refused["parent_id"] == "p" * 32
    assert by_id[f"{2:032x}"]["response_summary"] == "said fine too"


async def test_every_call_is_recorded_with_its_status_error_code_and_attempts(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        ok = await client.call_tool("mem__add", {"a": 2, "b": 3})
        failed = await client.call_tool("mem__fail", {"message": "it broke"})
        invalid = await client.call_tool("mem__add", {"a": "two", "b": 1})
        slow = await client.call_tool("mem__sleep", {"seconds": 5})
        rows = {row["id"]: row for row in await table(gw, "executions")}
        failures = await table(gw, "failures")

    assert not ok.is_error and failed.is_error and invalid.is_error and slow.is_error
    assert len(rows) == 4
    expected = [
        (ok, "mem__add", "success", None, 1),
        (failed, "mem__fail", "error", "tool_error", 1),
        (invalid, "mem__add", "error", "invalid_arguments", 0),
        (slow, "mem__sleep", "timeout", "upstream_timeout", 1),
    ]
    for result, tool, status, code, attempts in expected:
        row = rows[token_of(result)]
        assert (row["server"], row["tool"], row["status"], row["error_code"], row["attempts"]) == (
            "mem",
            tool,
            status,
            code,
            attempts,
        )
        assert row["latency_ms"] >= 0 and row["at"] > 0
    assert rows[token_of(ok)]["response_summary"] == "5" and rows[token_of(ok)]["response_size"] > 0
    assert json.loads(rows[token_of(ok)]["arguments"]) == {"a": 2, "b": 3}
    assert rows[token_of(slow)]["latency_ms"] >= 300
    by_execution = {f["execution_id"]: f for f in failures}
    assert set(by_execution) == {token_of(failed), token_of(invalid), token_of(slow)}
    assert by_execution[token_of(failed)]["details"].endswith("it broke")
    assert by_execution[token_of(slow)]["error_type"] == "UpstreamTimeout"
    assert "parameter 'a'" in by_execution[token_of(invalid)]["details"]


async def test_calls_refused_before_reaching_a_server_are_recorded_too(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        unknown = await client.call_tool("mem__no_such_tool", {"password": SECRET})
        no_server = await client.call_tool("nowhere__tool", {})
        rows = {row["id"]: row for row in await table(gw, "executions")}
        failures = {f["execution_id"]: f for f in await table(gw, "failures")}
    assert unknown.is_error and no_server.is_error
    for result, server, tool in [(unknown, "mem", "mem__no_such_tool"), (no_server, "", "nowhere__tool")]:
        row = rows[token_of(result)]
        assert (row["server"], row["tool"], row["status"], row["error_code"], row["attempts"]) == (
            server,
            tool,
            "error",
            "tool_not_found",
            0,
        )
        assert failures[token_of(result)]["code"] == "tool_not_found"
    sent = len(json.dumps({"password": SECRET}, separators=(",", ":")))
    assert json.loads(rows[token_of(unknown)]["arguments"]) == {
        "_truncated": True,
        "original_bytes": sent,
        "names": ["password"],
    }
    assert json.loads(rows[token_of(no_server)]["arguments"]) == {"_truncated": True, "original_bytes": 2, "names": []}


async def test_arguments_are_redacted_by_key_at_any_depth_and_configured_secrets_are_masked(tmp_path: Path) -> None:
    arguments = {
        "user": "ada",
        "password": SECRET,
        "options": {"API_KEY": "k-123", "nested": [{"Authorization": "Bearer abc"}], "note": f"mine is {SECRET}"},
    }
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        result = await client.call_tool("vault__login", arguments)
        [row] = await table(gw, "executions")
    assert text_of(result) == "welcome ada"
    stored = json.loads(row["arguments"])
    assert stored == {
        "user": "ada",
        "password": "***",
        "options": {"API_KEY": "***", "nested": [{"Authorization": "***"}], "note": "mine is ***"},
    }
    assert SECRET not in json.dumps(row)


def test_redaction_globs_are_case_insensitive_and_leave_the_input_alone() -> None:
    redactor = Redactor(RecordsSettings().redact_keys)
    data = {
        "Token": "t",
        "session_token": "s",
        "github-key": "g",
        "keyboard": "k",
        "max_tokens": 5,
        "list": [1, {"x": 2}],
    }
    assert redactor.redact(data) == {
        "Token": "***",
        "session_token": "***",
        "github-key": "***",
        "keyboard": "k",
        "max_tokens": 5,
        "list": [1, {"x": 2}],
    }
    assert data["Token"] == "t"
    assert Redactor(["ssn"]).redact({"SSN": 1, "password": 2}) == {"SSN": "***", "password": 2}


async def test_retried_attempts_are_each_recorded_as_a_failure() -> None:
    """The recorder outermost, the real retry layer inside it: two refused attempts, then an answer."""
    submitted: list[PendingExecution] = []
    errors = [UpstreamUnavailable("refused 1"), UpstreamUnavailable("refused 2")]

    async def send(arguments: dict[str, Any] | None) -> types.CallToolResult:
        if errors:
            raise errors.pop(0)
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    async def no_wait(server: str, seconds: float) -> None:
        return None

    retries = Retries(3, 10, eta=lambda server: 0.0, wait_ready=no_wait, initial_wait=0, max_wait=0)
    refused: list[BaseException] = []
    recorder = CallRecorder(submitted.append, SearchTrail(), lambda call, error, execution_id: refused.append(error))
    chain = compose([recorder, retries])
    tool = types.Tool(name="t", input_schema={"type": "object"})
    call = ToolCall("s", "s__t", "t", tool, {}, send, timeout=5, idempotent=False)
    await chain(call)
    [pending] = submitted
    assert pending.attempts == 3 and pending.result is not None and pending.error is None and not refused
    assert [(attempt, str(error)) for attempt, error in pending.attempt_errors] == [(1, "refused 1"), (2, "refused 2")]
    from gateway.records.rows import StoredLimits, execution_rows

    values, failures = execution_rows(pending, Redactor([]), lambda text: text, StoredLimits(1024, 1024))
    assert values[10:13] == ("success", None, 3)
    assert [(f.attempt, f.code) for f in failures] == [(1, "upstream_unavailable"), (2, "upstream_unavailable")]


# ---- feedback over MCP ----------------------------------------------------------------------------


async def test_feedback_round_trip_over_mcp_right_after_the_call(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        result = await client.call_tool("mem__add", {"a": 1, "b": 1})
        token = token_of(result)
        assert records_of(gw).writer.pending == 1  # not written yet: the lookup must make it so
        rated = await client.call_tool("submit_feedback", {"token": token, "rating": "up", "comment": "spot on"})
        again = await client.call_tool("submit_feedback", {"token": token, "score": 2})
        unknown = await client.call_tool("submit_feedback", {"token": "0" * 32, "rating": "down"})
        [feedback] = await table(gw, "feedback")
    assert not rated.is_error and rated.structured_content == {"recorded": True, "tool": "mem__add"}
    assert again.is_error and "already rated" in text_of(again)
    assert (again.meta or {})[ERROR_META_KEY]["code"] == "invalid_arguments"
    assert unknown.is_error and "Unknown feedback token" in text_of(unknown)
    assert (feedback["token"], feedback["execution_id"], feedback["rating"], feedback["score"]) == (
        token,
        token,
        "up",
        None,
    )
    assert feedback["comment"] == "spot on"


async def test_error_results_carry_a_feedback_token_too_and_can_be_rated(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        failed = await client.call_tool("mem__fail", {"message": "no"})
        invalid = await client.call_tool("mem__add", {})
        rated = await client.call_tool("submit_feedback", {"token": token_of(failed), "rating": "down", "score": 1})
        assert token_of(invalid) != token_of(failed)
    assert not rated.is_error


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({}, "`token`"),
        ({"token": "abc", "rating": "up"}, "`token`"),
        ({"token": "a" * 32}, "`rating`"),
        ({"token": "a" * 32, "rating": "meh"}, "`rating`"),
        ({"token": "a" * 32, "score": 6}, "`score`"),
        ({"token": "a" * 32, "score": True}, "`score`"),
        ({"token": "a" * 32, "score": 3, "comment": 5}, "`comment`"),
        ({"token": "a" * 32, "score": 3, "comment": "x" * 2001}, "`comment`"),
        ({"token": "a" * 32, "score": 3, "stars": 5}, "stars"),
    ],
)
def test_bad_feedback_is_refused_naming_the_field(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(FeedbackError) as refused:
        parse_feedback(arguments)
    assert named in refused.value.message and refused.value.status == 400


@pytest.mark.parametrize("mode", ["all", "search", "dynamic"])
async def test_submit_feedback_is_listed_in_every_exposure_mode(tmp_path: Path, mode: str) -> None:
    async with recorded_gateway(tmp_path, mode=mode) as gw, Client(gw.server) as client:
        names = [t.name for t in (await client.list_tools()).tools]
    assert "submit_feedback" in names
    if mode != "all":
        assert names[:3] == ["search_tools", "call_tool", "submit_feedback"]


async def test_without_records_there_is_no_feedback_tool_and_no_token(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    registry = Registry(
        [UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"))], settings
    )
    with anyio.fail_after(30):
        async with registry.running():
            await registry.wait_settled()
            async with Client(GatewayServer(registry, settings).server) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                result = await client.call_tool("mem__add", {"a": 1, "b": 2})
                refused = await client.call_tool("submit_feedback", {"token": "a" * 32, "rating": "up"})
    assert "submit_feedback" not in names
    assert FEEDBACK_TOKEN_META_KEY not in (result.meta or {})
    assert refused.is_error and "keeps no records" in text_of(refused)


# ---- searches ------------------------------------------------------------------------------------------


async def test_searches_are_recorded_and_a_call_is_tied_to_the_search_that_returned_its_tool(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path, mode="search", search=True) as gw, Client(gw.server) as client:
        found = await client.call_tool("search_tools", {"query": "add two integers", "limit": 3})
        names = [t["name"] for t in (found.structured_content or {})["tools"]]
        tied = await client.call_tool("call_tool", {"name": "mem__add", "arguments": {"a": 1, "b": 2}})
        untied = await client.call_tool("vault__login", {"user": "a", "password": "b", "options": {}})
        async with Client(gw.server, mode="legacy") as other:  # another session: no search of its own
            other_call = await other.call_tool("mem__add", {"a": 1, "b": 2})
        [search] = await table(gw, "searches")
        rows = {row["id"]: row for row in await table(gw, "executions")}
    assert "mem__add" in names and "vault__login" not in names
    assert search["query"] == "add two integers" and json.loads(search["results"]) == names
    assert search["latency_ms"] >= 0 and search["session_id"]
    assert rows[token_of(tied)]["search_id"] == search["id"]
    assert rows[token_of(tied)]["session_id"] == search["session_id"]
    assert rows[token_of(untied)]["search_id"] is None
    assert rows[token_of(other_call)]["search_id"] is None
    assert rows[token_of(other_call)]["session_id"] != search["session_id"]


async def test_search_text_is_not_kept_when_store_queries_is_off(tmp_path: Path) -> None:
    settings = records_settings(store_queries=False)
    async with recorded_gateway(tmp_path, mode="search", search=True, records=settings) as gw, Client(gw.server) as c:
        await c.call_tool("search_tools", {"query": "add two integers private words", "limit": 2})
        [search] = await table(gw, "searches")
    assert search["query"] is None and "mem__add" in json.loads(search["results"])


def test_the_search_trail_is_bounded_in_keys_searches_and_time() -> None:
    now = [0.0]
    trail = SearchTrail(max_keys=2, per_key=2, window=10, clock=lambda: now[0])
    trail.add(["s:a"], "s1", ["t1"])
    trail.add(["s:a"], "s2", ["t2"])
    trail.add(["s:a"], "s3", ["t3"])
    assert trail.find(["s:a"], "t1") is None and trail.find(["s:a"], "t3") == "s3"  # per_key
    trail.add(["s:b", "c:x"], "s4", ["t1"])
    assert len(trail) == 2 and trail.find(["s:a"], "t3") is None  # max_keys: the least recent key went
    assert trail.find(["s:zzz", "c:x"], "t1") == "s4"  # falls back to the caller's key
    now[0] = 11
    assert trail.find(["c:x"], "t1") is None  # window


# ---- bounded in bytes ----------------------------------------------------------------------------


async def test_a_large_argument_and_a_large_result_are_stored_cut_with_their_size_noted(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        await check_cut_records(gw, client)


async def test_a_cut_never_leaves_a_piece_of_a_configured_secret(tmp_path: Path) -> None:
    """The secret is moved across every cut point: of the arguments' JSON, of the long string inside it, and
    of the result's text; not even its first character may be stored."""
    settings = records_settings(max_argument_bytes=256, max_result_bytes=256)
    pads = range(150, 262)
    async with recorded_gateway(tmp_path, records=settings) as gw, Client(gw.server) as client:
        for pad in pads:
            result = await client.call_tool(
                "vault__login", {"user": "a" * pad + SECRET, "password": "p", "options": {}}
            )
            assert not result.is_error
        rows = await table(gw, "executions")
    assert len(rows) == len(pads)
    assert SECRET[0] == "h"
    for row in rows:
        arguments, summary = row["arguments"], row["response_summary"]
        assert len(arguments.encode()) <= 256 and len(summary.encode()) <= 256
        assert "h" not in arguments and "h" not in summary, (arguments, summary)
    assert any(json.loads(row["arguments"]).get("_truncated") for row in rows)
    assert any(row["response_summary"].endswith("a…") for row in rows)  # the secret was past the cut


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 17, 100, 101, 102, 103])
def test_cut_bytes_keeps_whole_characters_within_the_limit(limit: int) -> None:
    text = "aé€😀" * 40
    kept = cut_bytes(text, limit)
    assert text.startswith(kept) and len(kept.encode()) <= limit
    assert len(text[: len(kept) + 1].encode()) > limit  # the longest such prefix


def test_stored_arguments_stay_within_the_limit_even_when_escaping_doubles_them() -> None:
    for arguments in [{"q": '"' * 10_000}, {"q": "\x01" * 5_000}, {"rows": [{"a": i} for i in range(100_000)]}]:
        stored = truncated_arguments(arguments, 1024, lambda key: False, lambda text: text)
        assert len(stored.encode()) <= 1024
        marker = json.loads(stored)
        assert marker["_truncated"] is True and marker["original_bytes"] == len(json.dumps(arguments).replace(" ", ""))
        assert marker["preview"].startswith('{"')
    assert truncated_arguments({"a": 1}, 1024, lambda key: False, lambda text: text) == '{"a":1}'


@pytest.mark.parametrize("budget", [0, 1, 5, 8, 11, 12, 13, 20, 23, 24, 25, 40, 1000])
def test_a_flat_object_of_strings_and_numbers_is_copied_as_the_walk_copies_it(budget: int) -> None:
    """`shrink`'s short way for flat arguments gives the walk's copy and verdict, at every budget, with
    secret keys and configured secrets masked; anything else takes the walk."""
    from gateway.records import cut

    def is_secret(key: str) -> bool:
        return "key" in key

    def mask(text: str) -> str:
        return text.replace("hunter2", "***")

    cases: list[dict[Any, Any]] = [
        {},
        {"text": "hello"},
        {"q": "a hunter2 b", "limit": 10, "api_key": "zzzzzzzzzz", "deep": True, "none": None, "f": 1.5},
        {"hunter2": "x", "n": -1},
        {"nested": {"a": 1}},
        {"list": [1, 2]},
        {1: "non-string key"},
        {"s": "é" * 9},
    ]
    for arguments in cases:
        walked = cut._walked(arguments, budget, is_secret, mask)
        flat = cut._flat(arguments, budget, is_secret, mask)
        if flat is not None:
            assert (flat, False) == walked, (arguments, budget)
        slow_way = [v for v in arguments.values() if not isinstance(v, str | int | float | type(None))]
        if slow_way or any(not isinstance(k, str) for k in arguments):
            assert flat is None
        elif budget >= 1000:
            assert flat is not None  # what fits takes the short way


def test_the_writer_bound_in_bytes_drops_and_counts_and_holds_large_calls_as_cut_rows(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "r.sqlite3")
    records = Records(records_settings(buffer_bytes=128 * 1024, batch_size=1000), store)
    writer = records.writer
    huge = "x" * 4_000_000
    result = types.CallToolResult(content=[types.TextContent(type="text", text=huge)])
    for i in range(10):
        records.submit_execution(pending_call(i, {"text": huge}, result))
    kept = writer.pending
    assert 2 <= kept < 10 and writer.dropped == 10 - kept  # each held as its cut rows, about 33 kB
    assert writer.pending_bytes <= 128 * 1024
    writer.flush()
    assert writer.pending == 0 and writer.pending_bytes == 0
    records.record_search("after the flush", ["s__t"], 1.0, session_id=None, client_id=None)
    assert writer.pending == 1 and writer.dropped == 10 - kept
    writer.close()
    names, rows = SqliteStore(tmp_path / "r.sqlite3").rows("executions")
    assert len(rows) == kept
    for row in rows:
        stored = dict(zip(names, row, strict=True))
        assert json.loads(stored["arguments"])["original_bytes"] == len(huge) + len('{"text":""}')
        assert stored["response_size"] > len(huge) and len(stored["response_summary"].encode()) <= 16 * 1024


# ---- usage signals -------------------------------------------------------------------------------


async def test_usage_signals_come_from_calls_and_feedback_with_the_search_they_followed(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path, mode="search", search=True) as gw, Client(gw.server) as client:
        await check_usage_signals(gw, client)


async def test_the_signal_horizon_is_the_oldest_call_under_way_or_record_not_yet_written(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        records = gw.records
        assert records is not None
        assert time.time() - FEEDBACK_MARGIN - 5 < records.signal_horizon() <= time.time() - FEEDBACK_MARGIN

        old = time.time() - 100  # a record written late: buffered (the flush interval is long)
        records.submit_execution(
            PendingExecution(
                id="0" * 32,
                at=old,
                server="mem",
                tool="mem__add",
                session_id=None,
                client_id=None,
                arguments={},
                latency_ms=100_000.0,
                attempts=1,
                search_id=None,
            )
        )
        assert records.signal_horizon() == old
        await records.flush()
        assert records.signal_horizon() > time.time() - FEEDBACK_MARGIN - 5

        async with anyio.create_task_group() as tg:
            started = time.time()
            tg.start_soon(client.call_tool, "mem__sleep", {"seconds": 5.0})  # times out after 0.3 s
            with anyio.fail_after(10):
                while not records.recorder.started:
                    await anyio.sleep(0.01)
            oldest = records.recorder.oldest()  # the call under way
            assert oldest is not None and started <= oldest <= time.time()
        assert records.recorder.oldest() is None and records.writer.pending == 1
        buffered = records.writer.oldest(lambda record: record.at)  # handed from the one to the other
        assert buffered is not None and started <= buffered <= time.time()


async def test_the_router_re_reads_signals_only_from_the_records_horizon(tmp_path: Path) -> None:
    async with recorded_gateway(tmp_path) as gw, Client(gw.server) as client:
        records = gw.records
        assert records is not None
        for _ in range(3):
            await client.call_tool("mem__add", {"a": 1, "b": 2})
        await records.flush()
        settings = gw.settings
        service = RouterService(gw.registry, settings, lambda: build_router(settings, None), signals=records)
        gw.registry.task_group.start_soon(service.run)
        with anyio.fail_after(30):
            await service.complete.wait()
        await service.refresh_signals()  # the service's own loop may have read them first
        assert service.learnt == 3
        # before: the next read started two minutes before the newest signal, whatever was written since
        assert service._cursor.since is not None and service._cursor.since > time.time() - FEEDBACK_MARGIN - 5
        await client.call_tool("mem__add", {"a": 1, "b": 2})
        await records.flush()
        assert await service.refresh_signals() == 1 and service.learnt == 4


# ---- the store down, the buffer full, retention ----------------------------------------------------------


async def test_calls_work_and_drops_are_counted_when_the_sqlite_file_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the data directory should be")
    async with recorded_gateway(blocker, records=records_settings()) as gw, Client(gw.server) as client:
        results = [await client.call_tool("mem__add", {"a": i, "b": 1}) for i in range(3)]
        token = token_of(results[0])
        rated = await client.call_tool("submit_feedback", {"token": token, "rating": "up"})
        records = records_of(gw)
        await records.flush()
        assert records.writer.dropped == 3 and records.writer.pending == 0
    assert [r.structured_content for r in results] == [{"result": 1}, {"result": 2}, {"result": 3}]
    assert rated.is_error and "could not be saved" in text_of(rated)
    assert (rated.meta or {})[ERROR_META_KEY]["code"] == "execution_error"


class FailingStore(SqliteStore):
    """A real SQLite store that refuses writes while `down` is set."""

    down = False

    def write(self, batch: Any) -> None:
        if self.down:
            from gateway.records.store import StoreUnavailable

            raise StoreUnavailable("down for the test")
        super().write(batch)


def test_a_full_buffer_drops_and_counts_and_a_failed_batch_is_counted_too(tmp_path: Path) -> None:
    store = FailingStore(tmp_path / "r.sqlite3")
    records = Records(records_settings(buffer_size=3, batch_size=100), store)
    for i in range(5):
        records.record_search(f"q{i}", ["a"], 1.0, session_id=None, client_id=None)
    assert records.writer.pending == 3 and records.writer.dropped == 2
    store.down = True
    records.writer.flush()
    assert records.writer.dropped == 5 and records.writer.pending == 0
    store.down = False
    submit_row = records.record_search("kept", ["a"], 1.0, session_id="s", client_id="c")
    records.writer.close()
    names, rows = SqliteStore(tmp_path / "r.sqlite3").rows("searches")
    assert [row[names.index("id")] for row in rows] == [submit_row]


def test_the_writer_flushes_on_its_own_when_a_batch_is_full(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "r.sqlite3")
    records = Records(records_settings(buffer_size=100, batch_size=5), store)
    records.writer.start()
    try:
        for i in range(5):
            records.record_search(f"q{i}", [], 1.0, session_id=None, client_id=None)
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(_wait_written, records.writer, 5)
    finally:
        records.writer.close()
    assert len(store.rows("searches")[1]) == 5


def test_the_writer_flushes_on_its_own_when_half_its_bytes_wait(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "r.sqlite3")
    records = Records(records_settings(buffer_bytes=128 * 1024, batch_size=1000), store)
    records.writer.start()
    try:
        for i in range(4):  # each query is cut to 16 KiB: four are more than 64 KiB
            records.record_search(f"{i}" * 100_000, [], 1.0, session_id=None, client_id=None)
        assert records.writer.dropped == 0
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(_wait_written, records.writer, 4)
    finally:
        records.writer.close()
    names, rows = store.rows("searches")
    assert sorted(len(row[names.index("query")]) for row in rows) == [16 * 1024] * 4


async def _wait_written(writer: RecordWriter, count: int) -> None:
    with anyio.fail_after(10):
        while writer.written < count:
            await anyio.sleep(0.01)


def test_retention_deletes_old_records_with_their_failures_and_feedback(tmp_path: Path) -> None:
    store: RecordStore = SqliteStore(tmp_path / "r.sqlite3")
    from gateway.records.model import FailureRow, FeedbackRow, SearchRow
    from gateway.records.store import Batch

    def execution(id_: str, at: float) -> tuple[Any, ...]:
        return (id_, at, "s", "s__t", None, None, "{}", "ok", 2, 1.0, "error", "tool_error", 1, None, None, None)

    batch = Batch(
        executions=[execution("old", 100.0), execution("new", 10_000.0)],
        failures=[FailureRow("old", 0, 1, "ErrorResult", "tool_error", "x"), FailureRow("new", 0, 1, "E", "c", "y")],
        searches=[SearchRow("s-old", 100.0, None, None, "q", (), 1.0)],
    )
    store.write(batch)
    store.add_feedback(FeedbackRow("old", "old", 9_000.0, "up", None, None, None))
    assert store.delete_before(5_000.0) == 1
    assert [row[0] for row in store.rows("executions")[1]] == ["new"]
    assert [row[0] for row in store.rows("failures")[1]] == ["new"]
    assert store.rows("feedback")[1] == [] and store.rows("searches")[1] == []
    store.close()


def test_migrations_run_once_and_are_versioned(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    first = SqliteStore(path)
    assert first.schema_version() == MIGRATIONS[-1].version
    first.close()
    again = SqliteStore(path)
    assert again.schema_version() == MIGRATIONS[-1].version
    names, rows = again.rows("executions")
    assert rows == [] and names[:4] == ["id", "at", "server", "tool"]
    again.close()


def test_a_records_file_from_before_tracing_gains_the_trace_id_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    with sqlite3.connect(path) as old:  # the schema as migration 1 left it, with one execution
        old.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
            "applied_at DOUBLE PRECISION NOT NULL)"
        )
        for statement in MIGRATIONS[0].statements():
            old.execute(statement)
        old.execute("INSERT INTO schema_version VALUES (1, 'v1', 0)")
        old.execute(
            "INSERT INTO executions (id, at, server, tool, latency_ms, status, attempts) "
            "VALUES ('e1', 1.0, 's', 's__t', 1.0, 'success', 1)"
        )
    old.close()
    store = SqliteStore(path)
    assert store.schema_version() == MIGRATIONS[-1].version
    names, rows = store.rows("executions")
    assert names[-3:] == ["trace_id", "replica", "parent_id"] and [row[0] for row in rows] == ["e1"]
    assert rows[0][-3:] == (None, None, None)
    store.close()


def test_each_execution_and_audit_row_names_the_replica_that_wrote_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "r.sqlite3")
    store.replica = "replica-7"
    record = PendingExecution(
        id="e1", at=1.0, server="s", tool="s__t", session_id=None, client_id=None, arguments={},
        latency_ms=1.0, attempts=1, search_id=None, result=types.CallToolResult(content=[]),
    )  # fmt: skip
    values, failures = execution_rows(record, Redactor(()), partial(no_mask, "s"), StoredLimits(1000, 1000))
    store.write(Batch(executions=[values], failures=failures))
    write_audit(store, AuditRow("root", "restart", "s", "ok"))
    names, rows = store.rows("executions")
    assert rows[0][names.index("replica")] == "replica-7"
    assert [row["replica"] for row in audit_rows(store)] == ["replica-7"]
    store.close()


def test_a_database_url_that_is_not_postgresql_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"must be a postgresql:// URL, or unset .* got mysql:\.\.\."):
        Settings(data_dir=tmp_path, database_url="mysql://u:secret@h/db")
    bypassing = Settings(data_dir=tmp_path).model_copy(update={"database_url": "mysql://u:secret@h/db"})
    with pytest.raises(ValueError, match=r"must be a postgresql:// URL .* got mysql:") as refused:
        open_store(bypassing)
    assert "secret" not in str(refused.value)


def test_execution_ids_are_random_uuid4s_as_uuid4_hex_makes_them() -> None:
    import uuid

    from gateway.records.recorder import new_execution_id

    ids = [new_execution_id() for _ in range(1000)]  # across the random pool's refills (256 ids each)
    assert len(set(ids)) == len(ids)
    for made in ids:
        parsed = uuid.UUID(hex=made)
        assert (parsed.hex, parsed.version, parsed.variant) == (made, 4, uuid.RFC_4122)
