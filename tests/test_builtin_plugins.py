"""The built-in clock and notes plugins, driven through the SDK's real client in memory.

Every MCP feature the gateway proxies is seen working here end to end: tools with
annotations and structured output, tool errors, resources, templates, prompts,
completion, progress and resources list-changed on both protocol eras.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pluggy
import pytest
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.client.subscriptions import ResourcesListChanged
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolResult,
    PromptReference,
    ResourceListChangedNotification,
    ResourceTemplateReference,
    TextContent,
    TextResourceContents,
)

import gateway.hookspecs
import plugins.clock
import plugins.notes
from gateway.config.settings import Settings
from plugins.clock import create_server as create_clock
from plugins.notes import create_server as create_notes

TIMEOUT = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def notes_dir(tmp_path: Path) -> Path:
    return tmp_path / "notes"


def text_of(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def call(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    with anyio.fail_after(TIMEOUT):
        return await client.call_tool(tool, arguments)


async def structured(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await call(client, tool, **arguments)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


async def add(client: Client, title: str, text: str, tags: list[str] | None = None) -> str:
    """Add a note and return its name."""
    content = await structured(client, "add_note", title=title, text=text, tags=tags or [])
    return str(content["name"])


# --- clock -----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_clock_tools_are_listed_as_read_only_and_idempotent_with_output_schemas() -> None:
    async with Client(create_clock()) as client:
        with anyio.fail_after(TIMEOUT):
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"now", "convert_time", "date_difference", "add_duration"}
    for tool in tools.values():
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is True
        assert tool.annotations.idempotent_hint is True
        assert tool.output_schema is not None
        assert tool.description
    timezone = tools["now"].input_schema["properties"]["timezone"]
    assert "IANA" in timezone["description"]
    assert timezone["default"] == "UTC"


@pytest.mark.anyio
async def test_now_returns_the_time_in_a_timezone_as_text_and_structured_content() -> None:
    async with Client(create_clock()) as client:
        result = await call(client, "now", timezone="Europe/Paris")
    assert not result.is_error
    content = result.structured_content
    assert content is not None
    assert content["timezone"] == "Europe/Paris"
    assert content["utc_offset"] in {"+01:00", "+02:00"}
    moment = datetime.fromisoformat(content["iso"])
    assert moment.strftime("%A") == content["weekday"]
    assert abs(content["unix_timestamp"] - time.time()) < 60
    assert abs(moment.timestamp() - content["unix_timestamp"]) < 1
    assert content["iso"] in text_of(result)


@pytest.mark.anyio
async def test_now_accepts_a_timezone_name_in_any_case() -> None:
    async with Client(create_clock()) as client:
        content = await structured(client, "now", timezone="asia/tokyo")
    assert content["timezone"] == "Asia/Tokyo"
    assert content["utc_offset"] == "+09:00"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("now", {"timezone": "Mars/Olympus"}, "timezone 'Mars/Olympus' is not an IANA timezone name"),
        (
            "convert_time",
            {"time": "12:00", "from_timezone": "UTC", "to_timezone": "Europe/Pari"},
            "to_timezone 'Europe/Pari' is not an IANA timezone name",
        ),
        (
            "convert_time",
            {"time": "noon", "from_timezone": "UTC", "to_timezone": "UTC"},
            "time 'noon' is neither 'HH:MM' nor an ISO 8601 date-time",
        ),
        (
            "convert_time",
            {"time": "25:00", "from_timezone": "UTC", "to_timezone": "UTC"},
            "time '25:00' is not a valid wall-clock time",
        ),
        (
            "date_difference",
            {"start": "2025-01-01", "end": "next week"},
            "end 'next week' is not an ISO 8601",
        ),
        ("add_duration", {"start": "yesterday", "days": 1}, "start 'yesterday' is not an ISO 8601"),
    ],
)
async def test_bad_input_is_a_tool_error_naming_the_parameter_and_what_is_accepted(
    tool: str, arguments: dict[str, Any], expected: str
) -> None:
    async with Client(create_clock()) as client:
        result = await call(client, tool, **arguments)
    assert result.is_error
    assert expected in text_of(result)
    assert "such as" in text_of(result) or "use 'HH:MM'" in text_of(result)


@pytest.mark.anyio
async def test_a_misspelt_timezone_error_suggests_the_real_name() -> None:
    async with Client(create_clock()) as client:
        result = await call(client, "now", timezone="Europe/Pari")
    assert result.is_error
    assert "did you mean 'Europe/Paris'" in text_of(result)


@pytest.mark.anyio
async def test_convert_time_converts_an_iso_date_time_and_reports_the_offset_difference() -> None:
    async with Client(create_clock()) as client:
        content = await structured(
            client,
            "convert_time",
            time="2025-01-15T09:00",
            from_timezone="Europe/Paris",
            to_timezone="America/New_York",
        )
    assert content["source"]["iso"] == "2025-01-15T09:00:00+01:00"
    assert content["target"]["iso"] == "2025-01-15T03:00:00-05:00"
    assert content["target"]["weekday"] == "Wednesday"
    assert content["time_difference_hours"] == -6.0


@pytest.mark.anyio
async def test_convert_time_reads_hh_mm_as_today_in_the_source_zone() -> None:
    async with Client(create_clock()) as client:
        content = await structured(
            client, "convert_time", time="14:30", from_timezone="Asia/Tokyo", to_timezone="Asia/Kolkata"
        )
    assert content["source"]["iso"].endswith("T14:30:00+09:00")
    assert content["target"]["iso"].endswith("T11:00:00+05:30")
    assert content["time_difference_hours"] == -3.5


@pytest.mark.anyio
async def test_convert_time_rejects_a_wall_time_skipped_by_daylight_saving() -> None:
    async with Client(create_clock()) as client:
        result = await call(
            client, "convert_time", time="2025-03-30T02:30", from_timezone="Europe/Paris", to_timezone="UTC"
        )
    assert result.is_error
    assert "does not exist in Europe/Paris" in text_of(result)


@pytest.mark.anyio
async def test_date_difference_counts_days_hours_minutes_and_business_days() -> None:
    async with Client(create_clock()) as client:
        content = await structured(client, "date_difference", start="2025-03-03", end="2025-03-17T06:30:00")
    assert (content["days"], content["hours"], content["minutes"], content["seconds"]) == (14, 6, 30, 0)
    assert content["total_hours"] == 342.5
    assert content["business_days"] == 10


@pytest.mark.anyio
async def test_date_difference_is_negative_when_end_is_before_start() -> None:
    async with Client(create_clock()) as client:
        content = await structured(
            client, "date_difference", start="2025-03-10T12:00:00+01:00", end="2025-03-07T11:00:00Z"
        )
    assert content["total_hours"] == -72.0
    assert content["days"] == -3
    assert content["business_days"] == -1


@pytest.mark.anyio
async def test_add_duration_skips_weekends_for_business_days_and_keeps_the_offset() -> None:
    async with Client(create_clock()) as client:
        friday_plus_one = await structured(client, "add_duration", start="2025-03-07", business_days=1)
        back_a_week = await structured(
            client, "add_duration", start="2025-03-07T10:00:00+01:00", business_days=-5, hours=3
        )
        plain = await structured(client, "add_duration", start="2024-02-28", days=1)
    assert friday_plus_one["result"] == "2025-03-10"
    assert friday_plus_one["weekday"] == "Monday"
    assert back_a_week["result"] == "2025-02-28T13:00:00+01:00"
    assert plain["result"] == "2024-02-29"


@pytest.mark.anyio
async def test_add_duration_past_year_9999_is_a_tool_error() -> None:
    async with Client(create_clock()) as client:
        result = await call(client, "add_duration", start="9999-12-31", days=2)
    assert result.is_error
    assert "outside the years 1-9999" in text_of(result)


# --- notes: tools ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_notes_tools_are_annotated_by_their_effects(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        with anyio.fail_after(TIMEOUT):
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"add_note", "search_notes", "delete_note", "list_notes"}
    annotations = {name: tool.annotations for name, tool in tools.items()}
    assert all(a is not None for a in annotations.values())
    assert annotations["add_note"].read_only_hint is False  # type: ignore[union-attr]
    assert annotations["add_note"].idempotent_hint is False  # type: ignore[union-attr]
    assert annotations["delete_note"].destructive_hint is True  # type: ignore[union-attr]
    assert annotations["search_notes"].read_only_hint is True  # type: ignore[union-attr]
    assert annotations["list_notes"].read_only_hint is True  # type: ignore[union-attr]
    assert "ctx" not in tools["add_note"].input_schema["properties"]


@pytest.mark.anyio
async def test_adding_a_note_writes_a_markdown_file_named_after_the_title(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        content = await structured(
            client,
            "add_note",
            title="Grocery List!",
            text="Milk and *eggs*",
            tags=["#Food", "weekly", "food"],
        )
    assert content["name"] == "grocery-list"
    assert content["uri"] == "note://grocery-list"
    assert content["tags"] == ["food", "weekly"]
    file = notes_dir / "grocery-list.md"
    assert "title: Grocery List!" in file.read_text()
    assert file.read_text().endswith("Milk and *eggs*\n")
    assert [p.name for p in notes_dir.iterdir()] == ["grocery-list.md"]


@pytest.mark.anyio
async def test_a_second_note_with_the_same_title_gets_a_numbered_name(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        first = await add(client, "Standup", "Monday")
        second = await add(client, "Standup", "Tuesday")
        untitled = await add(client, "日本語", "no ASCII in the title")
    assert (first, second, untitled) == ("standup", "standup-2", "note")


@pytest.mark.anyio
async def test_an_empty_title_is_a_tool_error_naming_the_parameter(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        result = await call(client, "add_note", title="  ", text="body")
    assert result.is_error
    assert "title must not be empty" in text_of(result)


@pytest.mark.anyio
async def test_a_lone_surrogate_in_a_note_is_a_tool_error_naming_the_parameter_and_writes_nothing(
    notes_dir: Path,
) -> None:
    """JSON allows `\\udfff`, a UTF-8 file does not: a clear refusal, not a traceback and "Error executing tool"."""
    async with Client(create_notes(notes_dir)) as client:
        in_text = await call(client, "add_note", title="fine", text="x\udfffy")
        in_title = await call(client, "add_note", title="poison\ud800", text="body")
        in_tag = await call(client, "add_note", title="fine", text="body", tags=["ok", "\ud800"])
    assert all(result.is_error for result in (in_text, in_title, in_tag))
    assert "text holds a lone UTF-16 surrogate (\\udfff) at character 1" in text_of(in_text)
    assert "title holds a lone UTF-16 surrogate (\\ud800) at character 6" in text_of(in_title)
    assert "tags[1] holds a lone UTF-16 surrogate" in text_of(in_tag)
    assert not notes_dir.exists() or list(notes_dir.iterdir()) == []


@pytest.mark.anyio
async def test_concurrent_adds_get_distinct_names_and_leave_no_temp_files(notes_dir: Path) -> None:
    names: list[str] = []
    async with Client(create_notes(notes_dir)) as client:

        async def add_one(index: int) -> None:
            names.append(await add(client, "Same title", f"body {index}"))

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as group:
                for index in range(12):
                    group.start_soon(add_one, index)
    assert len(set(names)) == 12
    assert sorted(p.name for p in notes_dir.iterdir()) == sorted(f"{name}.md" for name in names)


@pytest.mark.anyio
async def test_hand_written_markdown_files_are_listed_and_readable_as_notes(notes_dir: Path) -> None:
    notes_dir.mkdir()
    (notes_dir / "recipes.md").write_text("# Pancakes\n\nFlour, milk, eggs.\n")
    (notes_dir / "windows.md").write_bytes(b"---\r\ntitle: From Windows\r\ntags: [Work]\r\n---\r\nBody\r\n")
    (notes_dir / "README.txt").write_text("not a note")
    (notes_dir / ".half-written.tmp").write_text("not a note either")
    async with Client(create_notes(notes_dir)) as client:
        content = await structured(client, "list_notes")
        recipe = await read_text(client, "note://recipes")
    assert [(n["name"], n["title"], n["tags"]) for n in content["notes"]] == [
        ("recipes", "Pancakes", []),
        ("windows", "From Windows", ["work"]),
    ]
    assert recipe.text.startswith("---\ntitle: Pancakes\n")
    assert recipe.text.endswith("# Pancakes\n\nFlour, milk, eggs.\n")


@pytest.mark.anyio
async def test_search_ranks_notes_by_matching_words_and_reports_progress(notes_dir: Path) -> None:
    updates: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total))

    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Groceries", "Milk, eggs and bread", ["food"])
        await add(client, "Bakery", "Sourdough BREAD on Fridays")
        await add(client, "Car", "Change the oil")
        with anyio.fail_after(TIMEOUT):
            result = await client.call_tool("search_notes", {"query": "bread milk"}, progress_callback=on_progress)
    assert not result.is_error
    assert result.structured_content is not None
    hits = result.structured_content["hits"]
    assert [hit["name"] for hit in hits] == ["groceries", "bakery"]
    assert hits[0]["matched_words"] == 2
    assert "BREAD" in hits[1]["snippet"]
    assert result.structured_content["scanned"] == 3
    assert updates, "no progress notification arrived"
    assert updates[-1] == (3, 3)
    assert all(total == 3 for _, total in updates)


@pytest.mark.anyio
async def test_search_matches_tags_and_honours_the_limit(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        for index in range(4):
            await add(client, f"Entry {index}", "nothing special", ["journal"])
        content = await structured(client, "search_notes", query="JOURNAL", limit=2)
        empty = await call(client, "search_notes", query="   ")
    assert len(content["hits"]) == 2
    assert empty.is_error
    assert "query must not be empty" in text_of(empty)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("groceris", "name 'groceris' is not an existing note; close matches: 'groceries'"),
        ("Groceries!", "name 'Groceries!' is not a valid note name (lowercase letters"),
    ],
)
async def test_deleting_an_unknown_or_invalid_name_is_a_tool_error_listing_close_matches(
    notes_dir: Path, name: str, expected: str
) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Groceries", "milk")
        result = await call(client, "delete_note", name=name)
    assert result.is_error
    assert expected in text_of(result)
    assert "'groceries'" in text_of(result)


# --- notes: resources ------------------------------------------------------------------------------


async def resource_uris(client: Client) -> list[str]:
    with anyio.fail_after(TIMEOUT):
        return [str(resource.uri) for resource in (await client.list_resources()).resources]


async def read_text(client: Client, uri: str) -> TextResourceContents:
    with anyio.fail_after(TIMEOUT):
        contents = (await client.read_resource(uri)).contents
    assert len(contents) == 1
    assert isinstance(contents[0], TextResourceContents)
    return contents[0]


@pytest.mark.anyio
async def test_adding_a_note_lists_it_as_a_resource(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        assert await resource_uris(client) == ["notes://index"]
        await add(client, "Groceries", "milk", ["food"])
        with anyio.fail_after(TIMEOUT):
            resources = (await client.list_resources()).resources
    assert [str(r.uri) for r in resources] == ["notes://index", "note://groceries"]
    note = resources[1]
    assert (note.name, note.title, note.mime_type) == ("groceries", "Groceries", "text/markdown")


@pytest.mark.anyio
async def test_deleting_a_note_removes_it_from_resources_and_disk(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Groceries", "milk")
        await add(client, "Bakery", "bread")
        deleted = await structured(client, "delete_note", name="groceries")
        assert deleted["title"] == "Groceries"
        assert await resource_uris(client) == ["notes://index", "note://bakery"]
    assert [p.name for p in notes_dir.iterdir()] == ["bakery.md"]


@pytest.mark.anyio
async def test_reading_a_note_resource_returns_its_markdown(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Groceries", "- milk\n- eggs", ["food"])
        contents = await read_text(client, "note://groceries")
    assert contents.mime_type == "text/markdown"
    assert "title: Groceries" in contents.text
    assert "tags: [food]" in contents.text
    assert contents.text.endswith("- milk\n- eggs\n")


@pytest.mark.anyio
async def test_reading_an_unknown_note_resource_is_an_error_listing_close_matches(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Groceries", "milk")
        with anyio.fail_after(TIMEOUT), pytest.raises(MCPError) as caught:
            await client.read_resource("note://grocery")
    assert "name 'grocery' is not an existing note; close matches: 'groceries'" in str(caught.value)


@pytest.mark.anyio
async def test_the_note_template_is_listed_and_the_index_links_every_note(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        with anyio.fail_after(TIMEOUT):
            templates = (await client.list_resource_templates()).resource_templates
        empty_index = await read_text(client, "notes://index")
        await add(client, "Groceries", "milk", ["food", "weekly"])
        index = await read_text(client, "notes://index")
    assert [(t.uri_template, t.mime_type) for t in templates] == [("note://{name}", "text/markdown")]
    assert "No notes yet" in empty_index.text
    assert index.mime_type == "text/markdown"
    assert "- [Groceries](note://groceries) — food, weekly" in index.text


# --- notes: prompts and completion -----------------------------------------------------------------


@pytest.mark.anyio
async def test_summarize_notes_embeds_the_matching_notes_and_asks_for_a_summary(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Budget", "Rent is 900 a month", ["money"])
        await add(client, "Savings", "Put 200 aside", ["money"])
        await add(client, "Holiday", "Visit Lisbon")
        with anyio.fail_after(TIMEOUT):
            prompts = {p.name: p for p in (await client.list_prompts()).prompts}
            result = await client.get_prompt("summarize_notes", {"topic": "money"})
    assert set(prompts) == {"summarize_notes", "draft_note"}
    assert [(a.name, a.required) for a in prompts["summarize_notes"].arguments or []] == [("topic", True)]
    [message] = result.messages
    assert message.role == "user"
    assert isinstance(message.content, TextContent)
    assert "Summarize" in message.content.text
    assert "Rent is 900 a month" in message.content.text
    assert "Put 200 aside" in message.content.text
    assert "Lisbon" not in message.content.text


@pytest.mark.anyio
async def test_summarize_notes_for_a_topic_no_note_mentions_is_an_error_listing_tags(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Budget", "Rent", ["money"])
        with anyio.fail_after(TIMEOUT), pytest.raises(MCPError) as caught:
            await client.get_prompt("summarize_notes", {"topic": "zebras"})
    assert "topic 'zebras' matches no note; tags in use: money" in str(caught.value)


@pytest.mark.anyio
async def test_draft_note_asks_for_a_note_reusing_existing_tags(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Budget", "Rent", ["money"])
        with anyio.fail_after(TIMEOUT):
            result = await client.get_prompt("draft_note", {"subject": "tax return"})
    [message] = result.messages
    assert isinstance(message.content, TextContent)
    assert "'tax return'" in message.content.text
    assert "money" in message.content.text
    assert "add_note" in message.content.text


@pytest.mark.anyio
async def test_completion_suggests_note_names_for_the_note_template(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Groceries", "milk")
        await add(client, "Garden", "tomatoes")
        await add(client, "Bakery", "bread")
        with anyio.fail_after(TIMEOUT):
            result = await client.complete(
                ResourceTemplateReference(uri="note://{name}"), {"name": "name", "value": "g"}
            )
    assert result.completion.values == ["garden", "groceries"]
    assert result.completion.total == 2
    assert result.completion.has_more is False


@pytest.mark.anyio
async def test_completion_suggests_tags_and_names_for_the_summarize_topic(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        await add(client, "Meeting", "agenda", ["meetings", "work"])
        await add(client, "Money", "rent", ["finance"])
        with anyio.fail_after(TIMEOUT):
            topic = await client.complete(PromptReference(name="summarize_notes"), {"name": "topic", "value": "M"})
            other = await client.complete(PromptReference(name="draft_note"), {"name": "subject", "value": "m"})
    assert topic.completion.values == ["meetings", "meeting", "money"]
    assert other.completion.values == []


# --- notes: list-changed on both protocol eras -----------------------------------------------------


@pytest.mark.anyio
async def test_adding_and_deleting_notes_publish_resources_list_changed_to_listeners(notes_dir: Path) -> None:
    async with Client(create_notes(notes_dir)) as client:
        assert client.protocol_version == "2026-07-28"
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.list_changed is True
        with anyio.fail_after(TIMEOUT):
            async with client.listen(resources_list_changed=True) as subscription:
                events = aiter(subscription)
                await add(client, "Groceries", "milk")
                assert isinstance(await anext(events), ResourcesListChanged)
                await call(client, "delete_note", name="groceries")
                assert isinstance(await anext(events), ResourcesListChanged)


@pytest.mark.anyio
async def test_legacy_clients_receive_resources_list_changed_notifications(notes_dir: Path) -> None:
    changed = anyio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, ResourceListChangedNotification):
            changed.set()

    async with Client(create_notes(notes_dir), mode="legacy", message_handler=on_message) as client:
        assert client.protocol_version != "2026-07-28"
        await add(client, "Groceries", "milk")
        with anyio.fail_after(TIMEOUT):
            await changed.wait()
        assert "note://groceries" in await resource_uris(client)


@pytest.mark.anyio
async def test_legacy_clients_receive_search_progress(notes_dir: Path) -> None:
    updates: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append(progress)

    async with Client(create_notes(notes_dir), mode="legacy") as client:
        await add(client, "Groceries", "milk")
        with anyio.fail_after(TIMEOUT):
            result = await client.call_tool("search_notes", {"query": "milk"}, progress_callback=on_progress)
    assert not result.is_error
    assert updates and updates[-1] == 1


# --- registration ----------------------------------------------------------------------------------


def test_both_plugins_register_their_servers_through_the_hook(tmp_path: Path) -> None:
    manager = pluggy.PluginManager(gateway.hookspecs.PROJECT_NAME)
    manager.add_hookspecs(gateway.hookspecs)
    manager.register(plugins.clock)
    manager.register(plugins.notes)
    registered: dict[str, dict[str, Any]] = {}

    def register(name: str, server: Any, *, description: str = "", capabilities: Any = ()) -> None:
        registered[name] = {"server": server, "description": description, "capabilities": list(capabilities)}

    manager.hook.gateway_register_servers(register=register, settings=Settings(data_dir=tmp_path), config=None)
    assert set(registered) == {"clock", "notes"}
    assert "timezone" in registered["clock"]["capabilities"]
    assert registered["notes"]["description"]
    assert registered["notes"]["server"].store.directory == tmp_path / "notes"
