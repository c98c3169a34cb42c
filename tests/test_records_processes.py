"""Records of a real `python -m gateway serve` process: POST /feedback behind authentication,
SIGKILL in the middle of a burst, the flush on a clean shutdown, and `mcp-gateway stats`."""

from __future__ import annotations

import csv
import json
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.cli.main import run
from gateway.errors import ERROR_META_KEY
from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.records.service import SQLITE_FILE
from gateway.security.auth import hash_key, new_key
from tests.conftest import DEMO_SERVER, gateway_over_stdio, start_gateway_http, stop_process, write_config

pytestmark = pytest.mark.anyio

KEYS = {name: new_key() for name in ("admin", "alpha")}


def token_of(result: types.CallToolResult) -> str:
    token = (result.meta or {}).get(FEEDBACK_TOKEN_META_KEY)
    assert isinstance(token, str)
    return token


@asynccontextmanager
async def client_for(url: str, key: str) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def records_rows(data_dir: Path, table: str) -> list[dict[str, Any]]:
    with sqlite3.connect(data_dir / SQLITE_FILE) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(f"SELECT * FROM {table}")]  # noqa: S608 - a fixed table name


async def test_feedback_over_http_post_behind_the_same_auth_and_scopes_as_mcp(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "gw.yaml",
        f"""
        mcps:
          alpha: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, alpha]}}
        auth:
          api_keys:
            - {{name: admin, hash: "{hash_key(KEYS["admin"])}"}}
            - {{name: alpha-only, hash: "{hash_key(KEYS["alpha"])}", profile: alpha}}
          profiles:
            alpha: {{servers: [alpha]}}
        """,
    )
    process, url = start_gateway_http(config, tmp_path, {"GATEWAY_RECORDS__FLUSH_INTERVAL": "60"})
    feedback = url.removesuffix("/mcp") + "/feedback"

    def post(body: Any, key: str | None) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx2.post(feedback, json=body, headers=headers, timeout=30)

    try:
        with anyio.fail_after(60):
            async with client_for(url, KEYS["admin"]) as client:
                on_mem = token_of(await client.call_tool("mem__add", {"a": 1, "b": 2}))
                on_alpha = token_of(await client.call_tool("alpha__fail", {"message": "no"}))
            assert post({"token": on_mem, "rating": "up"}, None).status_code == 401
            hidden = post({"token": on_mem, "rating": "up"}, KEYS["alpha"])  # mem is not in its profile
            assert hidden.status_code == 404 and "Unknown feedback token" in hidden.json()["error"]
            rated = post({"token": on_mem, "rating": "up", "score": 5, "comment": "good"}, KEYS["admin"])
            assert rated.status_code == 200, rated.text
            assert rated.json() == {"recorded": True, "token": on_mem, "tool": "mem__add"}
            again = post({"token": on_mem, "rating": "down"}, KEYS["admin"])
            assert again.status_code == 409 and "already rated" in again.json()["error"]
            assert post({"token": on_alpha, "rating": "down"}, KEYS["alpha"]).status_code == 200
            assert post({"token": "f" * 32, "rating": "up"}, KEYS["admin"]).status_code == 404
            bad = post({"token": on_alpha, "score": 9}, KEYS["admin"])
            assert bad.status_code == 400 and "`score`" in bad.json()["error"]
            assert post([1], KEYS["admin"]).status_code == 400
            foreign = httpx2.post(
                feedback, json={}, timeout=30, headers={"Authorization": f"Bearer {KEYS['admin']}", "Host": "evil.test"}
            )
            assert foreign.status_code == 403
            metrics = httpx2.get(
                url.removesuffix("/mcp") + "/metrics", headers={"Authorization": f"Bearer {KEYS['admin']}"}, timeout=30
            )
            assert "mcp_gateway_records_dropped_total 0.0" in metrics.text  # the writer's count, read at scrape time
    finally:
        stop_process(process)
    rows = {row["token"]: row for row in records_rows(tmp_path / "data", "feedback")}
    assert set(rows) == {on_mem, on_alpha}
    assert (rows[on_mem]["rating"], rows[on_mem]["score"], rows[on_mem]["client_id"]) == ("up", 5, "admin")
    assert rows[on_alpha]["client_id"] == "alpha-only"


BUFFER = 40


async def test_sigkill_during_a_burst_loses_at_most_the_buffer(tmp_path: Path) -> None:
    """Four clients call as fast as they can; the gateway is killed after 300 answers."""
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    env = {
        "GATEWAY_RECORDS__BUFFER_SIZE": str(BUFFER),
        "GATEWAY_RECORDS__BATCH_SIZE": "10",
        "GATEWAY_RECORDS__FLUSH_INTERVAL": "30",  # only full batches are written: the kill finds a buffer
    }
    process, url = start_gateway_http(config, tmp_path, env)
    answered: list[str] = []
    enough = anyio.Event()

    async def burst() -> None:
        async with Client(url) as client:
            while True:
                result = await client.call_tool("mem__add", {"a": 1, "b": 2})
                answered.append(token_of(result))
                if len(answered) >= 300:
                    enough.set()

    try:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(burst)
                await enough.wait()
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=10)
                tg.cancel_scope.cancel()
    except* (httpx2.HTTPError, OSError, anyio.EndOfStream, anyio.BrokenResourceError):
        pass  # clients whose gateway died under them
    finally:
        stop_process(process)
    stored = {row["id"] for row in records_rows(tmp_path / "data", "executions")}
    lost = set(answered) - stored
    assert len(answered) >= 300
    assert len(lost) <= BUFFER, f"{len(lost)} answered calls have no record; the buffer holds {BUFFER}"
    assert len(stored) >= len(answered) - BUFFER


async def test_a_clean_shutdown_flushes_every_record_and_stats_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    env = {"GATEWAY_RECORDS__FLUSH_INTERVAL": "600", "GATEWAY_RECORDS__BATCH_SIZE": "1000"}
    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path, env) as client:
            for i in range(4):
                await client.call_tool("mem__add", {"a": i, "b": 1})
            await client.call_tool("mem__fail", {"message": "broken"})
            await client.call_tool("mem__echo", {"text": "x", "password": "p"})
    rows = records_rows(tmp_path / "data", "executions")
    assert len(rows) == 6  # nothing was due before the shutdown: the final flush wrote them all

    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    capsys.readouterr()
    assert run(["stats", "--json", "--since", "1h", "--csv", str(tmp_path / "export")]) == 0
    report = json.loads(capsys.readouterr().out)
    [mem] = report["servers"]
    assert (mem["name"], mem["calls"], mem["errors"]) == ("mem", 6, 1)
    tools = {tool["name"]: tool for tool in mem["tools"]}
    assert tools["mem__add"]["calls"] == 4 and tools["mem__add"]["error_rate"] == 0
    assert tools["mem__fail"]["top_errors"] == [{"code": "tool_error", "count": 1}]
    assert tools["mem__add"]["p50_ms"] <= tools["mem__add"]["p95_ms"]
    with (tmp_path / "export" / "executions.csv").open() as exported:
        lines = list(csv.DictReader(exported))
    assert len(lines) == 6 and {line["tool"] for line in lines} == {"mem__add", "mem__fail", "mem__echo"}
    assert [line for line in lines if line["tool"] == "mem__echo"][0]["arguments"] == '{"text":"x","password":"***"}'
    assert (tmp_path / "export" / "failures.csv").read_text().count("\n") == 2
    assert (tmp_path / "export" / "feedback.csv").read_text().startswith("token,execution_id,at,rating")

    assert run(["stats"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("SERVER / TOOL") and "  mem__fail" in table and "tool_error x1" in table
    assert run(["stats", "--since", "2999-01-01"]) == 0
    assert "No calls recorded" in capsys.readouterr().out
    assert run(["stats", "--since", "yesterday"]) == 2
    assert "--since takes a duration" in capsys.readouterr().err


async def test_stats_counts_a_callers_mistakes_apart_from_the_servers_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One good call, one with a bad argument, one to a tool that does not exist, one the server fails:
    the server's error rate counts only its own failure."""
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path) as client:
            assert not (await client.call_tool("mem__add", {"a": 1, "b": 1})).is_error
            assert (await client.call_tool("mem__add", {"a": "one", "b": 1})).is_error
            assert (await client.call_tool("nonexistent__tool", {})).is_error
            assert (await client.call_tool("mem__fail", {"message": "broken"})).is_error

    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    capsys.readouterr()
    assert run(["stats", "--json"]) == 0
    servers = {server["name"]: server for server in json.loads(capsys.readouterr().out)["servers"]}
    assert set(servers) == {"mem", "(no server)"}, "no row without a name"
    mem = servers["mem"]
    assert (mem["calls"], mem["errors"], mem["caller_errors"]) == (3, 1, 1)
    assert (mem["upstream_errors"], mem["gateway_errors"], mem["error_rate"]) == (1, 0, round(1 / 3, 4))
    unknown = servers["(no server)"]
    assert (unknown["calls"], unknown["errors"], unknown["caller_errors"]) == (1, 0, 1)
    assert unknown["tools"][0]["name"] == "nonexistent__tool"

    assert run(["stats"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:9] == ["SERVER", "/", "TOOL", "CALLS", "ERRORS", "UPSTREAM", "GATEWAY", "CALLER", "P50"]
    assert rows[0].split()[:6] == ["mem", "3", "33.3%", "1", "0", "1"]
    assert [row for row in rows if row.startswith("(no server)")][0].split()[2:7] == ["1", "0.0%", "0", "0", "1"]


async def test_thirty_refused_4_mb_calls_grow_the_records_by_less_than_1_mb(tmp_path: Path) -> None:
    """Over stdio (no HTTP body limit): each call reaches the gateway and is refused by its argument limit."""
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    data = tmp_path / "data"

    def stored_bytes() -> int:
        return sum(path.stat().st_size for path in data.glob(SQLITE_FILE + "*"))  # the file, its WAL and index

    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path) as client:
            await client.call_tool("mem__add", {"a": 1, "b": 1})  # the store exists, migrated
    before = stored_bytes()
    text = "x" * 4_000_000
    with anyio.fail_after(300):
        async with gateway_over_stdio(config, tmp_path) as client:
            refused = [await client.call_tool("mem__echo", {"text": text}) for _ in range(30)]
    grown = stored_bytes() - before
    assert [(r.meta or {})[ERROR_META_KEY]["code"] for r in refused] == ["invalid_arguments"] * 30
    assert grown < 1_000_000, f"30 refused calls grew the records by {grown} bytes"
    rows = [row for row in records_rows(data, "executions") if row["tool"] == "mem__echo"]
    assert len(rows) == 30 and {row["id"] for row in rows} == {token_of(r) for r in refused}
    summary = {"_truncated": True, "original_bytes": len(text) + len('{"text":""}'), "names": ["text"]}
    assert all(json.loads(row["arguments"]) == summary for row in rows)
