"""The records on a real PostgreSQL server on 127.0.0.1 (tests/postgres.py): calls, feedback, usage
signals, migrations by two replicas at once, `stats`, and the server going away under the gateway."""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from mcp import Client

from gateway.cli.main import run
from gateway.records.migrations import MIGRATIONS
from gateway.records.postgres import PostgresStore
from gateway.urls import redact_url
from tests.records_client import (
    check_cut_records,
    check_usage_signals,
    recorded_gateway,
    records_of,
    table,
    text_of,
    token_of,
)

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]  # the postgres_server and postgres_database fixtures
pytestmark = pytest.mark.anyio


def url_of(server: PostgresServer, database: str) -> str:
    return f"postgresql://{server.user}:{server.password}@127.0.0.1:{server.port}/{database}"


@pytest.fixture
def database_url(postgres_server: PostgresServer, postgres_database: str) -> str:
    return url_of(postgres_server, postgres_database)


async def test_calls_and_feedback_are_recorded_in_postgresql(tmp_path: Path, database_url: str) -> None:
    async with recorded_gateway(tmp_path, database_url=database_url) as gw, Client(gw.server) as client:
        ok = await client.call_tool("mem__add", {"a": 2, "b": 3})
        slow = await client.call_tool("mem__sleep", {"seconds": 5})
        rated = await client.call_tool("submit_feedback", {"token": token_of(ok), "score": 5})
        again = await client.call_tool("submit_feedback", {"token": token_of(ok), "score": 1})
        rows = {row["id"]: row for row in await table(gw, "executions")}
        [feedback] = await table(gw, "feedback")
    assert rows[token_of(ok)]["status"] == "success" and rows[token_of(slow)]["status"] == "timeout"
    assert rows[token_of(slow)]["error_code"] == "upstream_timeout"
    assert not rated.is_error and again.is_error and "already rated" in text_of(again)
    assert (feedback["token"], feedback["score"]) == (token_of(ok), 5)
    assert not (tmp_path / "data" / "records.sqlite3").exists()


async def test_large_arguments_and_results_are_stored_cut_in_postgresql(tmp_path: Path, database_url: str) -> None:
    async with recorded_gateway(tmp_path, database_url=database_url) as gw, Client(gw.server) as client:
        await check_cut_records(gw, client)


async def test_usage_signals_on_postgresql(tmp_path: Path, database_url: str) -> None:
    async with recorded_gateway(tmp_path, database_url=database_url, mode="search", search=True) as gw:
        async with Client(gw.server) as client:
            await check_usage_signals(gw, client)


def test_replicas_starting_together_apply_each_migration_once(database_url: str) -> None:
    stores = [PostgresStore(database_url) for _ in range(4)]
    versions: list[int] = []
    threads = [threading.Thread(target=lambda s=s: versions.append(s.schema_version())) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    latest = MIGRATIONS[-1].version
    assert versions == [latest] * 4
    with stores[0]._using() as cursor:
        cursor.execute("SELECT count(*) FROM schema_version")
        assert cursor.fetchone()[0] == latest
    for store in stores:
        store.close()


def test_stats_reads_postgresql_and_never_shows_the_password(
    tmp_path: Path, database_url: str, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def record_calls() -> None:
        async with recorded_gateway(tmp_path, database_url=database_url) as gw, Client(gw.server) as client:
            await client.call_tool("mem__add", {"a": 1, "b": 1})
            await client.call_tool("mem__fail", {"message": "x"})

    anyio.run(record_calls)
    monkeypatch.setenv("GATEWAY_DATABASE_URL", database_url)
    capture = tmp_path / "out.json"
    with pytest.MonkeyPatch.context() as patch:
        import sys

        with capture.open("w") as out:
            patch.setattr(sys, "stdout", out)
            assert run(["stats", "--json"]) == 0
    report = json.loads(capture.read_text())
    assert postgres_server.password not in capture.read_text()
    assert report["store"] == "records store " + redact_url(database_url)
    [mem] = report["servers"]
    assert (mem["calls"], mem["errors"]) == (2, 1)


async def test_calls_still_work_when_postgresql_is_down_or_goes_away(tmp_path: Path) -> None:
    """A dedicated server (the shared one must stay up), stopped while the gateway runs."""
    from tests.postgres import start_postgres, stop_postgres

    server = start_postgres(Path(tempfile.mkdtemp(prefix="mcp-gateway-records-")))
    url = url_of(server, "postgres")
    try:
        async with recorded_gateway(tmp_path, database_url=url) as gw, Client(gw.server) as client:
            records = records_of(gw)
            await client.call_tool("mem__add", {"a": 1, "b": 1})
            await records.flush()
            assert records.writer.written == 1 and records.writer.dropped == 0
            await anyio.to_thread.run_sync(stop_postgres, server)
            results = [await client.call_tool("mem__add", {"a": i, "b": 1}) for i in range(3)]
            await records.flush()
            assert records.writer.dropped == 3
            refused = await client.call_tool("submit_feedback", {"token": token_of(results[0]), "rating": "up"})
        assert [r.structured_content for r in results] == [{"result": 1}, {"result": 2}, {"result": 3}]
        assert refused.is_error and "could not be saved" in text_of(refused)
        assert server.password not in text_of(refused)
    finally:
        stop_postgres(server)


async def test_calls_work_when_postgresql_was_never_reachable(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://gateway:not-the-password@127.0.0.1:{port}/records"
    async with recorded_gateway(tmp_path, database_url=url) as gw, Client(gw.server) as client:
        result = await client.call_tool("mem__add", {"a": 1, "b": 1})
        await records_of(gw).flush()
        assert records_of(gw).writer.dropped == 1
    assert result.structured_content == {"result": 2}


async def test_the_console_reads_calls_and_writes_its_audit_in_postgresql(tmp_path: Path, database_url: str) -> None:
    from gateway.records.audit import AuditRow, audit_rows, write_audit
    from gateway.records.queries import CallFilter, call_detail, call_rows

    async with recorded_gateway(tmp_path, database_url=database_url) as gw, Client(gw.server) as client:
        ok = await client.call_tool("mem__add", {"a": 2, "b": 3})
        failed = await client.call_tool("mem__fail", {"message": "no"})
        await client.call_tool("submit_feedback", {"token": token_of(ok), "score": 5})
        await gw.records.flush()  # type: ignore[union-attr]
        store = gw.records.store  # type: ignore[union-attr]
        listed = await anyio.to_thread.run_sync(call_rows, store, CallFilter(server="mem", status="error"))
        detail = await anyio.to_thread.run_sync(call_detail, store, token_of(ok))
        await anyio.to_thread.run_sync(write_audit, store, AuditRow("root", "restart", "mem", "ok", {"why": "test"}))
        audit = await anyio.to_thread.run_sync(audit_rows, store, 10)
    assert [row["id"] for row in listed] == [token_of(failed)]
    assert detail is not None and detail["response_summary"] == "5" and detail["feedback"][0]["score"] == 5
    assert [(a["principal"], a["action"], a["target"], a["details"]) for a in audit] == [
        ("root", "restart", "mem", {"why": "test"})
    ]
