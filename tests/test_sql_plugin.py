"""The built-in sql plugin on real SQLite files, through the SDK's real client in memory.

generate_sql and the gateway path are in test_sql_generate.py, PostgreSQL in test_sql_postgres.py.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from plugins.sql import Config, create_server
from plugins.sql.classify import SqlRefused, classify
from plugins.sql.demo import create_demo_database
from tests.conftest import NO_EMBEDDINGS, REPO, start_gateway_http, stop_process, write_config
from tests.sql_client import call, ok, refused, text_of

pytestmark = pytest.mark.anyio

RECURSIVE_FOREVER = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"


class FakeClock:
    """Seconds since the epoch, moved by the test instead of by sleeping."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return tmp_path / "shop.sqlite"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def sql_server(tmp_path: Path, database: Path, clock: Callable[[], float] | None = None, **settings: Any) -> Any:
    return create_server(Config(database=str(database), demo=True, **settings), tmp_path, clock=clock)


def count(database: Path, table: str) -> int:
    with sqlite3.connect(database) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


# --- classification ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "kinds"),
    [
        ("SELECT * FROM customers WHERE id = 1 -- ; DROP TABLE customers", ["read"]),
        ("SELECT 1 /* ; DROP TABLE customers; */", ["read"]),
        ("/*/ DROP TABLE customers /*/ SELECT 1", ["read"]),
        ("SELECT ';DROP TABLE customers;' AS s, 'it''s; fine' AS t", ["read"]),
        ("SELECT 1; SELECT 2;", ["read", "read"]),
        ("SELECT 1; -- trailing comment", ["read"]),
        ("WITH gone AS (DELETE FROM orders RETURNING id) SELECT * FROM gone", ["write"]),
        ("UPDATE products SET stock = 0 WHERE name = 'x; DROP TABLE y'", ["write"]),
        ("DELETE FROM orders; DROP TABLE customers", ["write", "ddl"]),
        ("REPLACE INTO products (id, name, category, price) VALUES (1, 'a', 'b', 1)", ["write"]),
        ("INSERT INTO customers (name, email) VALUES ('a', 'b') ON CONFLICT DO NOTHING", ["write"]),
        ("CREATE TABLE t (id INTEGER PRIMARY KEY)", ["ddl"]),
        ("PRAGMA table_info(customers)", ["read"]),
        ("PRAGMA user_version", ["read"]),
    ],
)
def test_statements_are_classified_by_the_parser_not_by_their_text(sql: str, kinds: list[str]) -> None:
    assert [s.kind for s in classify(sql, "sqlite").statements] == kinds


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT * FROM customers WHERE id = 1; DROP TABLE customers", "mix reads and writes"),
        ("SELECT 1; ATTACH DATABASE 'other.db' AS other", "statement 2 (ATTACH) is refused"),
        ("BEGIN; DELETE FROM orders; COMMIT", "transaction control is not allowed"),
        ("PRAGMA foreign_keys = OFF", "PRAGMA foreign_keys with a value is refused"),
        ("PRAGMA writable_schema", "PRAGMA writable_schema is refused"),
        ("VACUUM", "VACUUM is refused"),
        ("EXPLAIN SELECT 1", "use dry_run to see a plan"),
        ("SELEC * FROM customers", "could not be parsed"),
        ("SELECT 'unterminated", "could not be parsed"),
        ("-- only a comment", "holds no statement"),
    ],
)
def test_refused_and_unparsable_inputs_say_why(sql: str, reason: str) -> None:
    with pytest.raises(SqlRefused, match=re.escape(reason)):
        classify(sql, "sqlite")


@pytest.mark.parametrize("sql", ["SET statement_timeout = 0", "COPY customers FROM STDIN", "PRAGMA user_version"])
def test_postgresql_session_settings_copy_and_pragmas_are_refused(sql: str) -> None:
    with pytest.raises(SqlRefused, match="is refused"):
        classify(sql, "postgresql")


def test_the_token_binds_the_normalized_statement_so_spacing_and_case_do_not_matter() -> None:
    one = classify("delete  from orders\n where id=1", "sqlite")
    assert one.digest == classify("DELETE FROM orders WHERE id = 1", "sqlite").digest
    assert one.digest != classify("DELETE FROM orders WHERE id = 2", "sqlite").digest


# --- execute_sql: tokens and read-only mode ------------------------------------------------------------


async def test_a_write_without_a_valid_token_is_refused_and_changes_nothing(tmp_path: Path, database: Path) -> None:
    async with Client(sql_server(tmp_path, database)) as client:
        message = await refused(client, "execute_sql", sql="DELETE FROM order_items", dry_run=False)
        assert "needs confirmation_token" in message and "dry_run=true" in message
        forged = await refused(
            client, "execute_sql", sql="DELETE FROM order_items", dry_run=False, confirmation_token="abc.123.def"
        )
        assert "confirmation_token is unknown" in forged
        garbage = await refused(
            client, "execute_sql", sql="DELETE FROM order_items", dry_run=False, confirmation_token="nonsense"
        )
        assert "not a token this server issued" in garbage
    assert count(database, "order_items") == 30


async def test_a_lone_surrogate_in_sql_or_a_record_is_refused_naming_where(tmp_path: Path, database: Path) -> None:
    """No driver can send `\\ud800` (not valid UTF-8): a clear refusal, not a traceback and "Error executing tool"."""
    async with Client(sql_server(tmp_path, database)) as client:
        in_sql = await refused(client, "execute_sql", sql="SELECT '\ud800'", dry_run=False)
        before = count(database, "customers")
        in_record = await refused(client, "add_records", table="customers", records=[{"name": "a\udfff"}])
    assert "sql holds a lone UTF-16 surrogate (\\ud800) at character 8" in in_sql, in_sql
    assert "records[0].name holds a lone UTF-16 surrogate (\\udfff)" in in_record, in_record
    assert count(database, "customers") == before


async def test_a_dry_run_counts_the_rows_changes_nothing_and_its_token_works_once(
    tmp_path: Path, database: Path
) -> None:
    sql = "DELETE FROM orders WHERE id IN (1, 2)"
    async with Client(sql_server(tmp_path, database)) as client:
        dry = await ok(client, "execute_sql", sql=sql)
        assert dry["executed"] is False and dry["dry_run"] is True
        assert dry["effects"] == [
            {"statement": sql, "kind": "write", "label": "DELETE", "target": "orders", "rows_affected": 2}
        ]
        assert dry["total_changes"] == 2 + 5  # their order_items go too (ON DELETE CASCADE)
        assert count(database, "orders") == 15
        token = dry["confirmation_token"]
        done = await ok(client, "execute_sql", sql=sql, dry_run=False, confirmation_token=token)
        assert done["executed"] is True and done["effects"][0]["rows_affected"] == 2
        assert count(database, "orders") == 13 and count(database, "order_items") == 25
        again = await refused(client, "execute_sql", sql=sql, dry_run=False, confirmation_token=token)
        assert "already used" in again


async def test_a_token_for_one_statement_does_not_run_another(tmp_path: Path, database: Path) -> None:
    async with Client(sql_server(tmp_path, database)) as client:
        token = (await ok(client, "execute_sql", sql="DELETE FROM orders WHERE id = 1"))["confirmation_token"]
        message = await refused(
            client, "execute_sql", sql="DELETE FROM orders WHERE id > 0", dry_run=False, confirmation_token=token
        )
        assert "issued for another statement (DELETE orders)" in message
        assert count(database, "orders") == 15
        # The refusal did not burn the token: the statement it was issued for still runs.
        await ok(client, "execute_sql", sql="delete from orders where id=1", dry_run=False, confirmation_token=token)
    assert count(database, "orders") == 14


async def test_a_token_expires(tmp_path: Path, database: Path, clock: FakeClock) -> None:
    sql = "UPDATE products SET stock = stock + 1"
    async with Client(sql_server(tmp_path, database, clock, token_lifetime_s=60)) as client:
        token = (await ok(client, "execute_sql", sql=sql))["confirmation_token"]
        clock.now += 61
        message = await refused(client, "execute_sql", sql=sql, dry_run=False, confirmation_token=token)
        assert "confirmation_token expired" in message and "tokens live 60 s" in message
        fresh = (await ok(client, "execute_sql", sql=sql))["confirmation_token"]
        clock.now += 30
        await ok(client, "execute_sql", sql=sql, dry_run=False, confirmation_token=fresh)


async def test_read_only_mode_refuses_writes_outright_and_still_answers_queries(tmp_path: Path, database: Path) -> None:
    create_demo_database(database)
    async with Client(sql_server(tmp_path, database, read_only=True)) as client:
        for sql in ("DELETE FROM orders", "CREATE TABLE t (x)"):
            assert "configured read_only" in await refused(client, "execute_sql", sql=sql)
        message = await refused(client, "add_records", table="customers", records=[{"name": "A", "email": "a@b"}])
        assert "configured read_only" in message
        rows = await ok(client, "execute_sql", sql="SELECT count(*) AS n FROM customers", dry_run=False)
        assert rows["results"][0]["rows"] == [[8]]
    assert count(database, "orders") == 15


async def test_stacked_writes_are_confirmed_as_one_unit_and_run_atomically(tmp_path: Path, database: Path) -> None:
    script = "UPDATE products SET stock = stock - 1 WHERE id = 1; DELETE FROM order_items WHERE order_id = 3"
    failing = "UPDATE products SET stock = 0 WHERE id = 1; UPDATE products SET price = -1 WHERE id = 2"
    async with Client(sql_server(tmp_path, database)) as client:
        assert "CHECK constraint failed" in await refused(client, "execute_sql", sql=failing)
        dry = await ok(client, "execute_sql", sql=script)
        assert [e["rows_affected"] for e in dry["effects"]] == [1, 1]
        single = "UPDATE products SET stock = stock - 1 WHERE id = 1"
        message = await refused(
            client, "execute_sql", sql=single, dry_run=False, confirmation_token=dry["confirmation_token"]
        )
        assert "another statement" in message
        await ok(client, "execute_sql", sql=script, dry_run=False, confirmation_token=dry["confirmation_token"])
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT stock, price FROM products WHERE id IN (1, 2) ORDER BY id").fetchall() == [
            (24, 89.0),
            (80, 24.5),
        ]


async def test_ddl_needs_a_token_and_the_schema_cache_sees_the_new_table(tmp_path: Path, database: Path) -> None:
    ddl = "CREATE TABLE reviews (id INTEGER PRIMARY KEY, product_id INTEGER REFERENCES products (id), stars INTEGER)"
    async with Client(sql_server(tmp_path, database)) as client:
        before = await ok(client, "describe_schema", format="json")
        assert "needs confirmation_token" in await refused(client, "execute_sql", sql=ddl, dry_run=False)
        dry = await ok(client, "execute_sql", sql=ddl)
        assert dry["effects"][0]["label"] == "CREATE TABLE" and dry["effects"][0]["rows_affected"] is None
        assert "reviews" not in {t["name"] for t in (await ok(client, "describe_schema"))["tables"]}
        await ok(client, "execute_sql", sql=ddl, dry_run=False, confirmation_token=dry["confirmation_token"])
        after = await ok(client, "describe_schema", format="json")
    assert {t["name"] for t in after["tables"]} - {t["name"] for t in before["tables"]} == {"reviews"}


# --- execute_sql: reads, limits, timeouts -----------------------------------------------------------------


async def test_a_read_dry_run_shows_the_plan_and_a_real_run_a_table_with_a_truncation_note(
    tmp_path: Path, database: Path
) -> None:
    sql = "SELECT id, name FROM customers WHERE id > 2 ORDER BY id"
    async with Client(sql_server(tmp_path, database, max_rows=3)) as client:
        plan = await call(client, "execute_sql", sql="SELECT * FROM orders WHERE customer_id = 3")
        assert "USING INDEX orders_by_customer" in text_of(plan)
        assert plan.structured_content is not None and plan.structured_content["executed"] is False
        rows = await call(client, "execute_sql", sql=sql, dry_run=False)
        content = rows.structured_content
        assert content is not None and content["results"][0]["truncated"] is True
        assert content["results"][0]["rows"] == [[3, "Grace Hopper"], [4, "Marie Curie"], [5, "Emmy Noether"]]
        assert text_of(rows).startswith("3 rows shown; more rows exist (cut at max_rows=3")
        assert "| 3 | Grace Hopper |" in text_of(rows)
        whole = await ok(client, "execute_sql", sql=sql, dry_run=False, max_rows=10)
        assert whole["results"][0]["row_count"] == 6 and whole["results"][0]["truncated"] is False
        assert "max_rows must be between 1 and 1000" in await refused(
            client, "execute_sql", sql=sql, dry_run=False, max_rows=5000
        )


async def test_a_long_query_is_stopped_by_its_time_limit(tmp_path: Path, database: Path) -> None:
    async with Client(sql_server(tmp_path, database, timeout_ms=1000, timeout_ms_limit=2000)) as client:
        message = await refused(client, "execute_sql", sql=RECURSIVE_FOREVER, dry_run=False, timeout_ms=200)
        assert "stopped after its time limit of 200 ms" in message
        too_long = await refused(client, "execute_sql", sql="SELECT 1", dry_run=False, timeout_ms=10_000)
        assert "timeout_ms must be between 1 and 2000" in too_long
        # The connection is not left busy: the next statement runs.
        assert (await ok(client, "execute_sql", sql="SELECT 42 AS x", dry_run=False))["results"][0]["rows"] == [[42]]


async def test_safe_pragmas_read_and_side_effect_functions_cannot_write_from_a_query(
    tmp_path: Path, database: Path
) -> None:
    async with Client(sql_server(tmp_path, database)) as client:
        info = await ok(client, "execute_sql", sql="PRAGMA table_info(customers)", dry_run=False)
        assert [row[1] for row in info["results"][0]["rows"]][:2] == ["id", "name"]
        message = await refused(client, "execute_sql", sql="PRAGMA foreign_keys = OFF", dry_run=False)
        assert "only PRAGMAs that report are allowed" in message


# --- add_records ----------------------------------------------------------------------------------------


async def test_add_records_names_every_problem_with_the_closest_column_and_inserts_nothing(
    tmp_path: Path, database: Path
) -> None:
    records = [
        {"name": "Ada", "emial": "ada2@example.com"},
        {"name": "Bob", "email": "bob@example.com", "country": 33},
        {"name": None, "email": "c@example.com"},
    ]
    async with Client(sql_server(tmp_path, database)) as client:
        message = await refused(client, "add_records", table="customers", records=records)
        assert "records[0]: unknown field 'emial' (did you mean 'email'?)" in message
        assert "records[0]: missing email (NOT NULL, no default)" in message
        assert "records[1].country: expected a string for column country (TEXT), got 33" in message
        assert "records[2].name: is NOT NULL and has no default" in message
        assert "did you mean 'customers'" in await refused(client, "add_records", table="customer", records=[{}])
    assert count(database, "customers") == 8


async def test_add_records_is_all_or_nothing_and_reports_the_new_ids(tmp_path: Path, database: Path) -> None:
    async with Client(sql_server(tmp_path, database)) as client:
        clash = [{"name": "New", "email": "new@example.com"}, {"name": "Dup", "email": "ada@example.com"}]
        assert "UNIQUE constraint failed: customers.email" in await refused(
            client, "add_records", table="customers", records=clash
        )
        assert count(database, "customers") == 8
        added = await ok(
            client,
            "add_records",
            table="products",
            records=[
                {"name": "Webcam", "category": "hardware", "price": 49},
                {"name": "Mug", "category": "kitchen", "price": 7.5, "stock": 12},
            ],
        )
    assert added == {"table": "products", "inserted": 2, "ids": [11, 12], "id_column": "id"}
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT name, stock FROM products WHERE id > 10").fetchall() == [("Webcam", 0), ("Mug", 12)]


# --- describe_schema ------------------------------------------------------------------------------------


async def test_describe_schema_in_markdown_json_and_sql_with_keys_relations_and_indexes(
    tmp_path: Path, database: Path
) -> None:
    async with Client(sql_server(tmp_path, database)) as client:
        markdown = text_of(await call(client, "describe_schema"))
        assert "## orders" in markdown and "| customer_id | INTEGER | NOT NULL |  | → customers.id |" in markdown
        assert "| id | INTEGER | NOT NULL |  | PK, auto |" in markdown
        assert "Primary key: (order_id, product_id)" in markdown
        assert "Index orders_by_customer: (customer_id)" in markdown
        schema = await ok(client, "describe_schema", format="json")
        items = next(t for t in schema["tables"] if t["name"] == "order_items")
        assert items["primary_key"] == ["order_id", "product_id"]
        assert {"columns": ["order_id"], "references_table": "orders", "references_columns": ["id"]}.items() <= next(
            fk for fk in items["foreign_keys"] if fk["references_table"] == "orders"
        ).items()
        country = next(c for c in schema["tables"][0]["columns"] if c["name"] == "country")
        assert country == {
            "name": "country",
            "type": "TEXT",
            "nullable": False,
            "default": "'FR'",
            "primary_key": False,
            "auto_increment": False,
        }
        ddl = text_of(await call(client, "describe_schema", format="sql"))
        assert "CREATE TABLE order_items (" in ddl and "CREATE INDEX orders_by_customer ON orders" in ddl
        with sqlite3.connect(database) as db:
            db.execute("CREATE TABLE added_behind_its_back (x)")
        cached = await ok(client, "describe_schema")
        assert cached["read_at"] == schema["read_at"]
        assert "added_behind_its_back" not in {t["name"] for t in cached["tables"]}
        fresh = await ok(client, "describe_schema", refresh=True)
        assert "added_behind_its_back" in {t["name"] for t in fresh["tables"]}


def test_the_demo_database_is_the_same_every_time(tmp_path: Path) -> None:
    first, second = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    assert create_demo_database(first) and create_demo_database(second)
    assert not create_demo_database(first)  # an existing file is left alone
    with sqlite3.connect(first) as a, sqlite3.connect(second) as b:
        assert list(a.iterdump()) == list(b.iterdump())
        assert a.execute("PRAGMA foreign_key_check").fetchall() == []
    assert [count(first, t) for t in ("customers", "products", "orders", "order_items")] == [8, 10, 15, 30]


async def test_a_missing_sqlite_file_is_a_clear_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.sqlite"
    async with Client(create_server(Config(database=str(missing)), tmp_path)) as client:
        message = await refused(client, "execute_sql", sql="SELECT 1", dry_run=False)
        assert f"the SQLite database file {missing} does not exist" in message
        assert "does not exist" in await refused(client, "describe_schema")
    assert not missing.exists()


def test_relative_paths_are_resolved_against_the_data_directory(tmp_path: Path) -> None:
    from plugins.sql import open_database

    database = open_database(Config(database="nested/shop.sqlite", demo=True), tmp_path / "data")
    assert database.label == str(tmp_path / "data" / "nested" / "shop.sqlite")
    assert (tmp_path / "data" / "nested" / "shop.sqlite").is_file()
    assert open_database(Config(), tmp_path / "data").label == str(tmp_path / "data" / "sql" / "demo.sqlite")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"timeout_ms": 9000, "timeout_ms_limit": 1000}, "timeout_ms (9000) is above timeout_ms_limit (1000)"),
        ({"max_rows": 50, "max_rows_limit": 10}, "max_rows (50) is above max_rows_limit (10)"),
        ({"database": "mysql://db/shop"}, "scheme 'mysql' is not supported"),
        ({"database": "postgresql://127.0.0.1/shop", "demo": True}, "demo creates a SQLite file"),
        ({"databse": "x.sqlite"}, "Extra inputs are not permitted"),
    ],
)
def test_inconsistent_settings_are_refused_when_the_config_is_read(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Config(**settings)


# --- big values, bounded while reading ----------------------------------------------------------------


def _peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


async def test_a_200_mb_value_is_refused_as_sqlite_builds_it_and_big_rows_are_cut_by_bytes(tmp_path: Path) -> None:
    """Over real HTTP, as the probe sent it: `SELECT zeroblob(200000000)` built 200 MB (1.39 GB peak) before
    the reply was cut; now SQLite refuses the value as it makes it, and rows stop at max_value_bytes."""
    config = write_config(tmp_path / "gateway.yaml", "plugins:\n  sql:\n    database: shop.sqlite\n    demo: true\n")
    env = NO_EMBEDDINGS | {
        "GATEWAY_PLUGINS__DIRECTORY": str(REPO / "plugins"),
        "GATEWAY_PLUGINS__ALLOW": json.dumps(["sql"]),
    }
    process, url = start_gateway_http(config, tmp_path, env)
    try:
        with anyio.fail_after(60):
            async with Client(url) as client:
                assert not (await client.call_tool("sql__execute_sql", {"sql": "SELECT 1", "dry_run": False})).is_error
                baseline = _peak_rss_mb(process.pid)
                for sql in ("SELECT zeroblob(200000000)", "SELECT hex(zeroblob(100000000))"):
                    result = await client.call_tool("sql__execute_sql", {"sql": sql, "dry_run": False})
                    assert result.is_error and "max_value_bytes" in text_of(result), text_of(result)
                rows = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n LIMIT 50) "
                big = await client.call_tool(
                    "sql__execute_sql", {"sql": rows + "SELECT x, randomblob(300000) FROM n", "dry_run": False}
                )
                assert not big.is_error and big.structured_content is not None, text_of(big)
                [result_set] = big.structured_content["results"]
                assert result_set["truncated"] and result_set["row_count"] == 2  # 2 x 400 kB of base64 fit in 1 MiB
                grown = _peak_rss_mb(process.pid) - baseline
    finally:
        stop_process(process)
    assert grown < 300, f"peak RSS grew by {grown:.0f} MB"
