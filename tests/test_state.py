"""The shared state of a deployment (`gateway/state/`) on a real PostgreSQL: two `SharedState`s stand for
two replicas. The end-to-end behaviour behind a load balancer is in test_shared_state.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from mcp import Client

from gateway.config.security import RateLimit
from gateway.security.integrity import StoredTool
from gateway.state.bus import ChangeBus
from gateway.state.database import SharedDatabase
from gateway.state.deployment import SharedState
from gateway.state.fingerprints import SharedIntegrityStore
from plugins.notes import create_server as create_notes
from plugins.sql import Config as SqlConfig
from plugins.sql import create_server as create_sql
from tests.sql_client import ok, refused

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]
pytestmark = pytest.mark.anyio


@pytest.fixture
def url(postgres_server: PostgresServer, postgres_database: str) -> str:
    return postgres_server.url_with_password(postgres_database)


@pytest.fixture
def replicas(url: str) -> Iterator[tuple[SharedState, SharedState]]:
    first, second = SharedState.connect(url, "a", resync_seconds=600), SharedState.connect(url, "b", 600)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


async def test_a_change_on_one_replica_reaches_the_others_handlers_by_notification(
    replicas: tuple[SharedState, SharedState],
) -> None:
    first, second = replicas
    heard = anyio.Event()

    async def disabled_tools_changed() -> None:
        if "x__t" in await anyio.to_thread.run_sync(second.switches.disabled, "tools"):
            heard.set()

    second.bus.subscribe("tools", disabled_tools_changed)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(second.bus.run)
            while second.bus.heard == 0:  # until the listener is listening: a probe it hears
                await anyio.to_thread.run_sync(first.bus.publish, "flush")
                await anyio.sleep(0.05)
            assert await anyio.to_thread.run_sync(first.switches.set_enabled, "tools", "x__t", False, "root")
            await heard.wait()  # the resync is 600 s away: the notification did it
            tg.cancel_scope.cancel()


async def test_a_change_whose_notification_was_lost_is_found_by_the_resync(url: str) -> None:
    database = SharedDatabase(url, "a")
    bus = ChangeBus(database, resync_seconds=0.1)
    heard = anyio.Event()

    async def handler() -> None:
        heard.set()

    bus.subscribe("servers", handler)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.run)
            while not heard.is_set():  # a change made behind the bus's back: revision moved, nothing notified
                await anyio.to_thread.run_sync(
                    database.run,
                    "INSERT INTO state_revisions VALUES ('servers', 1) ON CONFLICT (topic) "
                    "DO UPDATE SET revision = state_revisions.revision + 1",
                )
                with anyio.move_on_after(1):  # again, in case the bus read the revisions only after it
                    await heard.wait()
            tg.cancel_scope.cancel()
    database.close()


def test_two_replicas_share_one_bucket_per_caller(replicas: tuple[SharedState, SharedState]) -> None:
    first, second = replicas
    limit = RateLimit(per_minute=1, burst=4)
    waits = [(first if i % 2 else second).limiter.take("key", limit) for i in range(8)]
    assert waits[:4] == [0, 0, 0, 0]
    assert all(wait >= 50 for wait in waits[4:])  # one token a minute: about a minute to wait
    assert first.limiter.take("another key", limit) == 0  # buckets are per caller


def test_a_tool_changed_before_a_new_replica_started_is_changed_for_it_too(url: str) -> None:
    old, new = SharedIntegrityStore(SharedDatabase(url, "a")), SharedIntegrityStore(SharedDatabase(url, "b"))
    assert old.observe_all([("s", "t", "s__t", "fp1")]) == {("s", "t"): ("new", False)}
    assert new.observe_all([("s", "t", "s__t", "fp2")]) == {("s", "t"): ("changed", False)}
    [pending] = old.pending()
    assert pending == StoredTool("s", "t", "s__t", "fp1", "fp2", None)
    before = new.revision()
    old.approve(pending)
    assert new.revision() == before + 1
    assert new.observe_all([("s", "t", "s__t", "fp2")]) == {("s", "t"): ("same", True)}
    old.database.close()
    new.database.close()


def test_while_the_database_is_down_an_unknown_definition_is_withheld_not_trusted(url: str) -> None:
    store = SharedIntegrityStore(SharedDatabase(url, "a"))
    store.observe_all([("s", "known", "s__known", "fp1")])
    store.database.url = url.replace("@127.0.0.1:", "@127.0.0.1:1")  # nothing listens on that port
    store.database.close()
    seen = store.observe_all([("s", "known", "s__known", "fp1"), ("s", "new", "s__new", "fp9")])
    assert seen == {("s", "known"): ("same", False), ("s", "new"): ("changed", False)}
    store.database.close()


async def test_a_note_added_through_one_replica_is_read_and_deleted_through_another(url: str, tmp_path: Path) -> None:
    one, other = create_notes(tmp_path / "a", url), create_notes(tmp_path / "b", url)
    with anyio.fail_after(30):
        async with Client(one) as first, Client(other) as second:
            for _ in range(2):
                added = await first.call_tool("add_note", {"title": "Deploy plan", "text": "three replicas"})
                assert not added.is_error
            listed = await second.call_tool("list_notes", {})
            names = [note["name"] for note in (listed.structured_content or {})["notes"]]
            assert names == ["deploy-plan", "deploy-plan-2"]
            read = await second.read_resource("note://deploy-plan")
            assert "three replicas" in read.contents[0].text  # type: ignore[union-attr]
            assert not (await second.call_tool("delete_note", {"name": "deploy-plan"})).is_error
            listed = await first.call_tool("list_notes", {})
            assert [note["name"] for note in (listed.structured_content or {})["notes"]] == ["deploy-plan-2"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing in the data dirs


async def test_a_dry_runs_token_from_one_replica_runs_the_write_once_on_another(url: str, tmp_path: Path) -> None:
    config = SqlConfig(database=str(tmp_path / "shop.sqlite"), demo=True)  # one database both replicas reach
    sql = "DELETE FROM orders WHERE id = 1"
    with anyio.fail_after(30):
        async with (
            Client(create_sql(config, tmp_path, tokens_url=url)) as first,
            Client(create_sql(config, tmp_path, tokens_url=url)) as second,
        ):
            token = (await ok(first, "execute_sql", sql=sql))["confirmation_token"]
            other = (await ok(first, "execute_sql", sql="DELETE FROM orders WHERE id = 2"))["confirmation_token"]
            wrong = await refused(second, "execute_sql", sql=sql, dry_run=False, confirmation_token=other)
            assert "issued for another statement" in wrong
            done = await ok(second, "execute_sql", sql=sql, dry_run=False, confirmation_token=token)
            assert done["executed"] is True and done["effects"][0]["rows_affected"] == 1
            for replica in (first, second):
                again = await refused(replica, "execute_sql", sql=sql, dry_run=False, confirmation_token=token)
                assert "already used" in again
