"""The merged catalog: names, collisions, reversibility (pure functions, no servers)."""

from __future__ import annotations

import mcp_types as types

from gateway.catalog import NAME_PATTERN, SERVER_META_KEY, ServerListing, build_catalog, expose_name, expose_uri


def _tool(name: str) -> types.Tool:
    return types.Tool(name=name, input_schema={"type": "object"})


def test_tools_are_exposed_as_prefix_double_underscore_name() -> None:
    catalog = build_catalog([ServerListing("github", "gh", tools=[_tool("search_issues")])])
    entry = catalog.tools["gh__search_issues"]
    assert (entry.server_id, entry.original) == ("github", "search_issues")
    assert entry.item.name == "gh__search_issues"
    assert entry.item.meta == {SERVER_META_KEY: "github"}


def test_characters_outside_the_model_api_alphabet_become_underscores() -> None:
    assert expose_name("fs", "read.file v2") == "fs__read_file_v2"
    assert NAME_PATTERN.match(expose_name("fs", "read.file v2"))


def test_a_name_over_64_characters_is_shortened_deterministically_and_stays_unique() -> None:
    long_a = "a" * 80
    long_b = "a" * 79 + "b"
    first, second = expose_name("srv", long_a), expose_name("srv", long_b)
    assert len(first) == 64 and len(second) == 64
    assert NAME_PATTERN.match(first) and NAME_PATTERN.match(second)
    assert first != second
    assert expose_name("srv", long_a) == first
    catalog = build_catalog([ServerListing("srv", "srv", tools=[_tool(long_a)])])
    assert catalog.tools[first].original == long_a


def test_an_empty_prefix_passes_names_through_when_nothing_collides() -> None:
    catalog = build_catalog(
        [ServerListing("a", "", tools=[_tool("search")]), ServerListing("b", "b", tools=[_tool("search")])]
    )
    assert set(catalog.tools) == {"search", "b__search"}
    assert catalog.collisions == []


def test_a_collision_between_pass_through_servers_falls_back_to_the_server_id() -> None:
    catalog = build_catalog(
        [ServerListing("alpha", "", tools=[_tool("search")]), ServerListing("beta", "", tools=[_tool("search")])]
    )
    assert catalog.tools["search"].server_id == "alpha"
    assert catalog.tools["beta__search"].server_id == "beta"
    assert len(catalog.collisions) == 1 and "beta" in catalog.collisions[0]


def test_a_collision_that_the_server_id_cannot_solve_gets_a_numbered_name_and_nothing_is_dropped() -> None:
    catalog = build_catalog(
        [
            ServerListing("q", "", tools=[_tool("x__t")]),
            ServerListing("w", "", tools=[_tool("t")]),
            ServerListing("x", "", tools=[_tool("t")]),
        ]
    )
    assert {name: e.server_id for name, e in catalog.tools.items()} == {"x__t": "q", "t": "w", "x__t_2": "x"}
    assert catalog.tools["x__t_2"].original == "t"


def test_the_result_does_not_depend_on_the_order_a_server_lists_its_tools() -> None:
    one = build_catalog([ServerListing("s", "", tools=[_tool("b"), _tool("a")])])
    two = build_catalog([ServerListing("s", "", tools=[_tool("a"), _tool("b")])])
    assert list(one.tools) == list(two.tools)


def test_resource_uris_are_namespaced_and_resolve_back_to_their_server() -> None:
    catalog = build_catalog(
        [
            ServerListing("notes", "notes", resources=[types.Resource(uri="note://todo", name="todo")]),
            ServerListing("files", "files", resources=[types.Resource(uri="file:///a.txt", name="a")]),
        ]
    )
    assert expose_uri("notes", "note://todo") in catalog.resources
    assert catalog.resolve_resource("notes+note://todo") == ("notes", "note://todo")
    assert catalog.resolve_resource("files+file:///other.txt") == ("files", "file:///other.txt")


def test_a_raw_upstream_uri_from_a_resource_link_still_resolves() -> None:
    catalog = build_catalog(
        [
            ServerListing(
                "notes",
                "notes",
                templates=[types.ResourceTemplate(uri_template="note://{name}", name="note")],
            ),
            ServerListing("files", "files", resources=[types.Resource(uri="file:///a.txt", name="a")]),
        ]
    )
    assert catalog.resolve_resource("file:///a.txt") == ("files", "file:///a.txt")
    assert catalog.resolve_resource("note://shopping") == ("notes", "note://shopping")
    assert catalog.resolve_resource("unknown://x") is None


def test_resource_templates_are_namespaced_for_completion_refs() -> None:
    catalog = build_catalog(
        [ServerListing("notes", "notes", templates=[types.ResourceTemplate(uri_template="note://{name}", name="n")])]
    )
    assert catalog.resolve_template("notes+note://{name}") == ("notes", "note://{name}")
    assert catalog.resolve_template("note://{name}") is None
