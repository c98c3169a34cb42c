"""generate_sql with a real sampling callback on the SDK's client, in memory on both protocol eras and through
the gateway (a `python -m gateway serve` child over stdio, which relays the plugin's sampling requests)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from plugins.sql import Config, create_server
from plugins.sql.generate import extract_sql
from tests.conftest import REPO, gateway_over_stdio, write_config

pytestmark = pytest.mark.anyio

TIMEOUT = 15.0


class ScriptedModel:
    """A sampling callback that answers with the next scripted reply and keeps every request it got."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.requests: list[types.CreateMessageRequestParams] = []

    async def __call__(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.requests.append(params)
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=reply), model="scripted"
        )

    def said(self, request: int, message: int) -> str:
        content = self.requests[request].messages[message].content
        assert isinstance(content, types.TextContent)
        return content.text


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    """`auto` negotiates 2026-07-28 (input-required rounds); `legacy` gets mid-call sampling requests."""
    return request.param


def sql_server(tmp_path: Path, **settings: Any) -> Any:
    return create_server(Config(database="shop.sqlite", demo=True, **settings), tmp_path)


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def generate(client: Client, prompt: str) -> types.CallToolResult:
    with anyio.fail_after(TIMEOUT):
        return await client.call_tool("generate_sql", {"prompt": prompt})


@pytest.mark.parametrize(
    ("reply", "sql"),
    [
        ("```sql\nSELECT name FROM customers;\n```", "SELECT name FROM customers"),
        ("Here you go:\n```\nSELECT 1\n```\nEnjoy.", "SELECT 1"),
        ("  SELECT 2;  ", "SELECT 2"),
    ],
)
def test_the_sql_is_taken_from_a_fenced_block_or_the_whole_reply(reply: str, sql: str) -> None:
    assert extract_sql(reply) == sql


async def test_valid_sql_on_the_first_answer_comes_back_with_its_plan_unexecuted(tmp_path: Path, mode: str) -> None:
    (tmp_path / "shop-notes.md").write_text("Revenue means sum(quantity * unit_price) over paid orders.\n")
    model = ScriptedModel("```sql\nDELETE FROM orders WHERE status = 'cancelled'\n```")
    server = sql_server(tmp_path, context_file="shop-notes.md")
    async with Client(server, sampling_callback=model, mode=mode) as client:
        result = await generate(client, "remove the cancelled orders")
    assert not result.is_error, text_of(result)
    content = result.structured_content
    assert content is not None
    assert content["sql"] == "DELETE FROM orders WHERE status = 'cancelled'"
    assert content["kind"] == "write" and content["attempts"] == 1 and content["rejected"] == []
    assert any("orders" in str(step) for step in content["plan"])
    assert "Not executed" in text_of(result) and "dry run first" in content["note"]
    question = model.said(0, 0)
    assert "## order_items" in question and "→ orders.id" in question  # the schema
    assert "Revenue means sum(quantity * unit_price)" in question  # the context file
    assert question.endswith("remove the cancelled orders")
    assert model.requests[0].system_prompt is not None and "SQLite" in model.requests[0].system_prompt
    with sqlite3.connect(tmp_path / "shop.sqlite") as db:
        assert db.execute("SELECT count(*) FROM orders WHERE status = 'cancelled'").fetchone()[0] == 2


async def test_invalid_sql_is_retried_with_the_error_fed_back(tmp_path: Path, mode: str) -> None:
    model = ScriptedModel(
        "```sql\nSELECT nme FROM customers\n```",
        "```sql\nSELECT name FROM customers WHERE\n```",
        "```sql\nSELECT name FROM customers ORDER BY name\n```",
    )
    async with Client(sql_server(tmp_path, max_retries=2), sampling_callback=model, mode=mode) as client:
        result = await generate(client, "customer names in order")
    assert not result.is_error, text_of(result)
    content = result.structured_content
    assert content is not None
    assert content["sql"] == "SELECT name FROM customers ORDER BY name" and content["attempts"] == 3
    assert content["rejected"][0] == "no such column: nme"
    assert "could not be parsed" in content["rejected"][1]
    second, third = model.requests[1], model.requests[2]
    assert [m.role for m in second.messages] == ["user", "assistant", "user"]
    assert "SELECT nme FROM customers" in model.said(1, 1)
    assert "That SQL is not valid: no such column: nme" in model.said(1, 2)
    assert len(third.messages) == 5 and "could not be parsed" in model.said(2, 4)


async def test_after_max_retries_the_error_is_exceeded_retries_with_the_last_sql(tmp_path: Path, mode: str) -> None:
    model = ScriptedModel("```sql\nSELECT * FROM invoices\n```", "```sql\nATTACH DATABASE 'x' AS y\n```")
    async with Client(sql_server(tmp_path, max_retries=1), sampling_callback=model, mode=mode) as client:
        result = await generate(client, "all invoices")
    assert result.is_error
    assert text_of(result).startswith("EXCEEDED_RETRIES: no valid SQL after 2 attempts (max_retries=1)")
    assert "Last SQL: ATTACH DATABASE 'x' AS y" in text_of(result)
    details = result.structured_content
    assert details is not None
    assert (details["code"], details["last_sql"], details["attempts"]) == (
        "EXCEEDED_RETRIES",
        "ATTACH DATABASE 'x' AS y",
        2,
    )
    assert details["errors"][0] == "no such table: invoices" and "ATTACH is refused" in details["errors"][1]
    assert (result.meta or {})["mcp-gateway/error"]["code"] == "EXCEEDED_RETRIES"
    assert len(model.requests) == 2


async def test_a_client_without_sampling_gets_a_clear_error(tmp_path: Path, mode: str) -> None:
    async with Client(sql_server(tmp_path), mode=mode) as client:
        result = await generate(client, "anything")
    assert result.is_error
    assert "this client does not support sampling" in text_of(result)


async def test_the_context_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("First version.\n")
    model = ScriptedModel("SELECT 1")
    async with Client(sql_server(tmp_path, context_file=str(notes)), sampling_callback=model) as client:
        await generate(client, "one")
        notes.write_text("Second version.\n")
        os.utime(notes, (notes.stat().st_atime, notes.stat().st_mtime + 5))
        await generate(client, "two")
    assert "First version." in model.said(0, 0)
    assert "Second version." in model.said(1, 0) and "First version." not in model.said(1, 0)


async def test_the_sql_tools_work_through_the_gateway_with_sampling_relayed(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "gateway.yaml",
        """
        plugins:
          sql:
            database: shop.sqlite
            demo: true
            max_retries: 1
        """,
    )
    env = {"GATEWAY_PLUGINS__DIRECTORY": str(REPO / "plugins"), "GATEWAY_PLUGINS__ALLOW": json.dumps(["sql"])}
    model = ScriptedModel("```sql\nSELECT nope FROM products\n```", "```sql\nSELECT count(*) FROM products\n```")
    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path, env=env, sampling_callback=model) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"sql__describe_schema", "sql__execute_sql", "sql__add_records", "sql__generate_sql"} <= tools
            generated = await client.call_tool("sql__generate_sql", {"prompt": "how many products?"})
            assert not generated.is_error, text_of(generated)
            assert generated.structured_content is not None
            assert generated.structured_content["sql"] == "SELECT count(*) FROM products"
            assert "no such column: nope" in model.said(1, 2)
            sql = "UPDATE products SET stock = 1 WHERE stock = 0"
            dry = await client.call_tool("sql__execute_sql", {"sql": sql})
            assert dry.structured_content is not None
            token = dry.structured_content["confirmation_token"]
            done = await client.call_tool(
                "sql__execute_sql", {"sql": sql, "dry_run": False, "confirmation_token": token}
            )
            assert not done.is_error and done.structured_content is not None
            assert done.structured_content["effects"][0]["rows_affected"] == 1
            again = await client.call_tool(
                "sql__execute_sql", {"sql": sql, "dry_run": False, "confirmation_token": token}
            )
            assert again.is_error and "already used" in text_of(again)
    assert (tmp_path / "data" / "shop.sqlite").is_file()  # relative paths are resolved against the data dir
