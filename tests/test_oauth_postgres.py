"""The OAuth token store in PostgreSQL (tests/postgres.py, a real server): what one replica stores,
another reads; only sealed bytes reach the table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest
from cryptography.fernet import Fernet

from gateway.config.servers import OAuthConfig
from gateway.config.settings import Settings
from gateway.upstreams.oauth import Grant, OAuthBinding, OAuthVaultError, vault_from_settings
from gateway.upstreams.oauth.vault import TABLE

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]  # the postgres_server and postgres_database fixtures
pytestmark = pytest.mark.anyio

URL = "http://127.0.0.1:1/mcp"


def replica(database_url: str, key: str) -> OAuthBinding:
    """One gateway replica's view of server `web`, with the settings a deployment would give it."""
    settings = Settings(database_url=database_url, oauth={"key": key, "poll_interval": 0.05})
    return OAuthBinding("web", URL, OAuthConfig(), vault_from_settings(settings), poll_interval=0.05)


async def test_a_grant_one_replica_stores_is_seen_by_another_and_only_sealed(
    postgres_server: PostgresServer, postgres_database: str
) -> None:
    url = postgres_server.url_with_password(postgres_database)
    key = Fernet.generate_key().decode()
    first, second = replica(url, key), replica(url, key)
    grant = Grant(
        access_token="at-in-postgres", refresh_token="rt-in-postgres", token_endpoint="http://x/token", client_id="gw"
    )
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            stop = anyio.Event()

            async def store_later() -> None:
                await anyio.sleep(0.2)
                await first.save(None, grant)

            tg.start_soon(store_later)
            await second.wait_for_grant(None, stop)  # the waiting replica picks it up
        seen = await second.grant(None)
        assert seen is not None and seen.access_token == "at-in-postgres"
        await first.save("key:ada", grant.model_copy(update={"access_token": "at-ada"}))
        with postgres_server.connect(postgres_database) as connection:
            rows = connection.execute(f"SELECT server, slot, sealed FROM {TABLE}").fetchall()
        assert len(rows) == 2 and {row[0] for row in rows} == {"web"}
        assert not any(b"in-postgres" in bytes(row[2]) or b"ada" in bytes(row[2]) or "ada" in row[1] for row in rows)
        assert await second.forget(None) and await first.grant(None) is None
        with pytest.raises(OAuthVaultError, match="cannot be decrypted with the configured key"):
            await replica(url, Fernet.generate_key().decode()).grant("key:ada")


async def test_an_unreachable_database_is_a_clear_error_without_its_password() -> None:
    binding = replica("postgresql://gw:hunter2@127.0.0.1:1/none", Fernet.generate_key().decode())
    with anyio.fail_after(30), pytest.raises(OAuthVaultError, match="the OAuth token store at") as raised:
        await binding.grant(None)
    assert "hunter2" not in str(raised.value)
