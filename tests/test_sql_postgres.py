"""The sql plugin on a real PostgreSQL server on 127.0.0.1 (see tests/postgres.py), through the SDK's real client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mcp_types as types
import pytest
from mcp import Client

from plugins.sql import Config, create_server
from tests.sql_client import call, ok, refused, text_of

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]  # the postgres_server and postgres_database fixtures
pytestmark = pytest.mark.anyio

PASSWORD_ENV = "MCP_GATEWAY_TEST_PG_PASSWORD"
SHOP = """
CREATE TABLE customers (
    id serial PRIMARY KEY,
    name text NOT NULL,
    email text NOT NULL UNIQUE,
    country char(2) NOT NULL DEFAULT 'FR',
    vip boolean NOT NULL DEFAULT false
);
CREATE TABLE orders (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES customers (id) ON DELETE CASCADE,
    total numeric(10, 2) NOT NULL CHECK (total >= 0),
    details jsonb
);
CREATE INDEX orders_by_customer ON orders (customer_id);
INSERT INTO customers (name, email, country)
VALUES ('Ada', 'ada@example.com', 'GB'), ('Grace', 'grace@example.com', 'US');
INSERT INTO orders (customer_id, total) VALUES (1, 10.50), (1, 20), (2, 99.99);
"""


@pytest.fixture
def shop(postgres_server: PostgresServer, postgres_database: str, monkeypatch: pytest.MonkeyPatch) -> Config:
    with postgres_server.connect(postgres_database, autocommit=True) as db:
        db.execute(SHOP)  # type: ignore[arg-type]
    monkeypatch.setenv(PASSWORD_ENV, postgres_server.password)
    return Config(database=postgres_server.url(postgres_database), password_env=PASSWORD_ENV, timeout_ms_limit=5000)


async def test_describe_schema_reads_postgresql_catalogs(shop: Config, tmp_path: Any) -> None:
    async with Client(create_server(shop, tmp_path)) as client:
        schema = await ok(client, "describe_schema", format="json")
        ddl = text_of(await call(client, "describe_schema", format="sql"))
    tables = {t["name"]: t for t in schema["tables"]}
    assert set(tables) == {"customers", "orders"} and schema["backend"] == "postgresql"
    assert "password" not in schema["database"] and PASSWORD_ENV not in schema["database"]
    customers = {c["name"]: c for c in tables["customers"]["columns"]}
    assert customers["id"]["auto_increment"] and customers["id"]["primary_key"]
    assert customers["country"]["type"] == "character(2)" and customers["country"]["default"] == "'FR'::bpchar"
    orders = tables["orders"]
    assert orders["columns"][0]["auto_increment"] is True  # identity
    assert orders["foreign_keys"] == [
        {
            "columns": ["customer_id"],
            "references_table": "customers",
            "references_columns": ["id"],
            "on_delete": "CASCADE",
            "on_update": "NO ACTION",
        }
    ]
    assert {"name": "orders_by_customer", "columns": ["customer_id"], "unique": False} in orders["indexes"]
    assert 'CREATE TABLE "orders" (' in ddl and 'REFERENCES "customers" ("id") ON DELETE CASCADE' in ddl


async def test_reads_plans_and_writes_with_tokens_on_postgresql(shop: Config, tmp_path: Any) -> None:
    sql = "DELETE FROM customers WHERE country = 'GB'"
    async with Client(create_server(shop, tmp_path)) as client:
        plan = await ok(client, "execute_sql", sql="SELECT * FROM orders WHERE total > 15")
        assert "Seq Scan on orders" in str(plan["results"][0]["rows"])
        rows = await ok(client, "execute_sql", sql="SELECT id, total FROM orders ORDER BY id", dry_run=False)
        assert rows["results"][0]["rows"] == [[1, "10.50"], [2, "20.00"], [3, "99.99"]]
        dry = await ok(client, "execute_sql", sql=sql)
        assert dry["effects"][0]["rows_affected"] == 1 and dry["effects"][0]["target"] == "customers"
        assert "needs confirmation_token" in await refused(client, "execute_sql", sql=sql, dry_run=False)
        token = dry["confirmation_token"]
        other = "DELETE FROM customers"
        assert "another statement" in await refused(
            client, "execute_sql", sql=other, dry_run=False, confirmation_token=token
        )
        await ok(client, "execute_sql", sql=sql, dry_run=False, confirmation_token=token)
        left = await ok(client, "execute_sql", sql="SELECT count(*) FROM orders", dry_run=False)
        assert left["results"][0]["rows"] == [[1]]  # the cascade took Ada's two orders


async def test_a_read_cannot_write_even_through_a_function(shop: Config, tmp_path: Any) -> None:
    async with Client(create_server(shop, tmp_path)) as client:
        message = await refused(client, "execute_sql", sql="SELECT nextval('customers_id_seq')", dry_run=False)
    assert "read-only transaction" in message


async def test_statement_timeout_stops_a_long_postgresql_query(shop: Config, tmp_path: Any) -> None:
    async with Client(create_server(shop, tmp_path)) as client:
        message = await refused(client, "execute_sql", sql="SELECT pg_sleep(30)", dry_run=False, timeout_ms=300)
        assert "stopped after its time limit of 300 ms" in message
        assert (await ok(client, "execute_sql", sql="SELECT 1 AS one", dry_run=False))["results"][0]["rows"] == [[1]]


async def test_a_200_mb_postgresql_value_is_refused_by_the_server_and_big_rows_are_cut_by_bytes(
    shop: Config, tmp_path: Any
) -> None:
    """The server refuses a row longer than max_value_bytes before sending it (the plugin never holds
    200 MB), rows stop once they hold max_value_bytes, and the wrapping keeps what a read means."""
    async with Client(create_server(shop, tmp_path)) as client:
        message = await refused(client, "execute_sql", sql="SELECT repeat('x', 20000000) AS big", dry_run=False)
        assert "row of 20000028 bytes" in message and f"max_value_bytes ({shop.max_value_bytes})" in message
        rows = "SELECT g, repeat('y', 300000) AS filler FROM generate_series(1, 50) AS g"
        [cut] = (await ok(client, "execute_sql", sql=rows, dry_run=False))["results"]
        assert cut["truncated"] and cut["row_count"] == 3 and [r[0] for r in cut["rows"]] == [1, 2, 3]
        assert cut["columns"] == ["g", "filler"]  # the size columns the wrapping adds are not shown
        same = "SELECT name, name AS again FROM customers WHERE email LIKE '%@example.com' ORDER BY name DESC"
        [kept] = (await ok(client, "execute_sql", sql=same, dry_run=False))["results"]
        assert kept["rows"] == [["Grace", "Grace"], ["Ada", "Ada"]] and not kept["truncated"]
        both = await ok(client, "execute_sql", sql="VALUES (1, 'a'); TABLE customers", dry_run=False, max_rows=1)
        assert both["results"][0]["rows"] == [[1, "a"]] and both["results"][1]["truncated"]


async def test_add_records_on_postgresql_returns_ids_and_is_atomic(shop: Config, tmp_path: Any) -> None:
    async with Client(create_server(shop, tmp_path)) as client:
        added = await ok(
            client,
            "add_records",
            table="orders",
            records=[{"customer_id": 2, "total": 5, "details": {"gift": True}}, {"customer_id": 2, "total": 7.25}],
        )
        assert added["ids"] == [4, 5] and added["id_column"] == "id"
        bad = await refused(client, "add_records", table="customers", records=[{"name": "X", "email": 3, "vip": "y"}])
        assert "records[0].email: expected a string" in bad and "records[0].vip: expected true/false" in bad
        clash = [{"name": "New", "email": "new@example.com"}, {"name": "Dup", "email": "ada@example.com"}]
        assert "duplicate key value" in await refused(client, "add_records", table="customers", records=clash)
        count = await ok(client, "execute_sql", sql="SELECT count(*) FROM customers", dry_run=False)
        assert count["results"][0]["rows"] == [[2]]


async def test_a_wrong_password_is_a_clear_error_that_never_shows_the_password(
    shop: Config, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "not-the-Secret-42")
    async with Client(create_server(shop, tmp_path)) as client:
        message = await refused(client, "execute_sql", sql="SELECT 1", dry_run=False)
    assert "cannot connect to postgresql://postgres@127.0.0.1" in message
    assert "password authentication failed" in message and "not-the-Secret-42" not in message


def test_a_password_in_the_url_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="database URL contains a password") as raised:
        Config(database="postgresql://app:hunter2@127.0.0.1/shop")
    assert "hunter2" not in str(raised.value).split("input_value")[0]


async def test_generate_sql_validates_with_postgresql_explain(shop: Config, tmp_path: Any) -> None:
    replies = iter(["```sql\nSELECT totl FROM orders\n```", "```sql\nSELECT sum(total) FROM orders\n```"])

    async def model(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=next(replies)), model="scripted"
        )

    async with Client(create_server(shop, tmp_path), sampling_callback=model) as client:
        result = await ok(client, "generate_sql", prompt="total of all orders")
    assert result["sql"] == "SELECT sum(total) FROM orders" and result["attempts"] == 2
    assert 'column "totl" does not exist' in result["rejected"][0]
