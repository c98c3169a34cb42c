"""The built-in openapi plugin: searching a real-world spec, reading schemas, and calling a real HTTP API.

The big spec is 354 operations of GitHub's REST API (tests/data/openapi). `call_api`
runs against tests/servers/library_api.py, a Starlette app on 127.0.0.1 implementing
tests/data/openapi/library.yaml; the plugin's server is driven by the SDK's client in
memory, and once through a real gateway process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from bench.openapi_search import evaluate, load_queries, load_spec
from gateway.config.loader import ConfigError, parse_config
from gateway.config.settings import Settings
from gateway.server_specs import plugin_settings
from plugins.openapi import Config, create_server
from plugins.openapi.config import resolve_source
from plugins.openapi.explorer import Explorer
from plugins.openapi.render import describe_schema
from plugins.openapi.search import build_router
from plugins.openapi.spec import ApiSpec, SpecError, parse_document
from tests.conftest import REPO, START_DEADLINE, _read_line_with_prefix, gateway_over_stdio, stop_process, write_config

DATA = REPO / "tests" / "data" / "openapi"
GITHUB = DATA / "github-api-subset.json"
LIBRARY = DATA / "library.yaml"
LIBRARY_SERVER = REPO / "tests" / "servers" / "library_api.py"
TOKEN = "lib-token-3f9a1c7e"
TOKEN_ENV = "OPENAPI_TEST_LIBRARY_TOKEN"
TIMEOUT = 15.0


def text_of(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def github_config() -> Config:
    return Config.model_validate({"specs": [{"name": "github", "source": str(GITHUB)}]})


def library_config(base_url: str, **overrides: Any) -> Config:
    spec = {"name": "library", "source": str(LIBRARY), "base_url": base_url, "auth": {"bearer_token_env": TOKEN_ENV}}
    return Config.model_validate({"specs": [spec | overrides]})


@asynccontextmanager
async def connect(config: Config, settings: Settings | None = None) -> AsyncIterator[Client]:
    async with Client(create_server(config, REPO / "gateway.yaml", settings)) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    with anyio.fail_after(TIMEOUT):
        return await client.call_tool(tool, arguments)


async def ok(client: Client, tool: str, **arguments: Any) -> str:
    result = await call(client, tool, **arguments)
    assert not result.is_error, text_of(result)
    return text_of(result)


async def error(client: Client, tool: str, **arguments: Any) -> str:
    result = await call(client, tool, **arguments)
    assert result.is_error, text_of(result)
    return text_of(result)


@pytest.fixture(scope="module")
def library_url() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(LIBRARY_SERVER)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ | {"LIBRARY_TOKEN": TOKEN},
        cwd=REPO,
    )
    port = _read_line_with_prefix(process.stdout, "PORT=", START_DEADLINE, process)  # type: ignore[arg-type]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process)


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TOKEN


# --- reading specs ---------------------------------------------------------------------------------


def test_a_swagger_2_document_is_refused_with_a_way_forward() -> None:
    with pytest.raises(SpecError, match=r"only OpenAPI 3.x is supported, found swagger 2.0; convert it"):
        parse_document('{"swagger": "2.0", "paths": {}}', "old.json")


def test_an_external_ref_is_refused_with_a_way_forward() -> None:
    text = json.dumps({"openapi": "3.0.0", "paths": {"/a": {"get": {"responses": {"$ref": "other.yaml#/R"}}}}})
    with pytest.raises(SpecError, match=r"external \$ref 'other.yaml#/R' is not supported; bundle"):
        parse_document(text, "spec.json")


def test_path_level_and_referenced_parameters_are_merged_and_missing_ids_synthesized() -> None:
    spec = ApiSpec.build("library", parse_document(LIBRARY.read_text(), str(LIBRARY)))
    get_shelf = spec.operations["LibraryService_GetShelf"]
    assert [(p.name, p.location, p.required) for p in get_shelf.parameters] == [("shelf", "path", True)]
    list_books = spec.operations["LibraryService_ListBooks"]
    assert [p.name for p in list_books.parameters] == ["shelf", "page_size", "format"]
    whoami = spec.operations["get_v1_whoami"]
    assert (whoami.synthesized, whoami.method, whoami.path) == (True, "get", "/v1/whoami")
    assert "get_v1_whoami" in ApiSpec.build("again", parse_document(LIBRARY.read_text(), "x")).operations


def test_recursive_and_mutually_recursive_schemas_render_without_looping() -> None:
    node, tree = {"$ref": "#/components/schemas/Node"}, {"$ref": "#/components/schemas/Tree"}
    schemas = {
        "Node": {"allOf": [tree], "properties": {"next": node}},
        "Tree": {"allOf": [node], "properties": {"kids": {"type": "array", "items": tree}}},
        "Loop": {"$ref": "#/components/schemas/Loop"},
    }
    document = {"openapi": "3.1.0", "paths": {}, "components": {"schemas": schemas}}
    spec = ApiSpec.build("t", document)
    node = describe_schema(spec, "Node")
    assert "next?: Node" in node and "kids?: array<Tree>" in node
    assert describe_schema(spec, "Loop").startswith("Loop")


def test_a_relative_source_is_relative_to_the_yaml_file(tmp_path: Path) -> None:
    config_file = tmp_path / "conf" / "gateway.yaml"
    assert resolve_source("specs/api.yaml", config_file) == str(tmp_path / "conf" / "specs" / "api.yaml")
    assert resolve_source("https://example.com/openapi.json", config_file) == "https://example.com/openapi.json"


def test_an_example_source_names_a_spec_installed_with_the_plugin(tmp_path: Path) -> None:
    """The example config works wherever it is copied: its spec ships with the plugin, not next to the file."""
    path = Path(resolve_source("example:github-public", tmp_path / "anywhere" / "gateway.yaml"))
    assert path == REPO / "plugins" / "openapi" / "examples" / "github-public.json" and path.is_file()
    with pytest.raises(ValueError, match="no example spec named 'gitlab'; the examples are: github-public"):
        Config.model_validate({"specs": [{"name": "x", "source": "example:gitlab"}]})


def test_bad_settings_are_reported_with_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    text = "plugins:\n  openapi:\n    specs:\n      - name: x\n        source: a.yaml\n        auth: {api_key_env: K}\n"
    config = parse_config(text, path)

    class Module:
        Config = Config

    class Manager:
        def get_plugin(self, name: str) -> type[Module]:
            return Module

    with pytest.raises(ConfigError) as caught:
        plugin_settings(Manager(), "openapi", config)  # type: ignore[arg-type]
    assert "gateway.yaml:6: plugins.openapi.specs[0].auth" in str(caught.value)
    assert "api_key_env needs exactly one of api_key_header or api_key_query" in str(caught.value)


# --- search_api on the big spec --------------------------------------------------------------------


@pytest.mark.anyio
async def test_no_arguments_lists_the_services_with_their_operation_counts() -> None:
    async with connect(github_config()) as client:
        text = await ok(client, "search_api")
    assert "(github, 354 operations, base URL https://api.github.com)" in text
    assert "- issues: 58" in text and "- pulls: 34" in text


@pytest.mark.anyio
async def test_a_service_lists_its_endpoints_and_an_unknown_one_suggests_close_names() -> None:
    async with connect(github_config()) as client:
        gists = await ok(client, "search_api", service="gists")
        unknown = await error(client, "search_api", service="gist")
    assert gists.startswith("gists: 20 operations")
    assert "- gists/create: POST /gists — Create a gist" in gists
    assert "unknown service 'gist'; closest: gists" in unknown


@pytest.mark.anyio
async def test_an_operation_shows_its_parameters_body_and_responses_compactly() -> None:
    async with connect(github_config()) as client:
        text = await ok(client, "search_api", operationId="issues/create")
    assert text.startswith("issues/create — POST /repos/{owner}/{repo}/issues\nCreate an issue")
    assert "Path parameters:\n  owner: string — The account owner of the repository." in text
    assert "Request body (application/json, required):\n  title: string | integer — The title of the issue." in text
    assert "  labels?: array<" in text
    assert "  201 (application/json): issue — Response" in text
    description = text.splitlines()[2]
    assert description.endswith("…") and len(description) <= 501  # GitHub's long description, cut
    assert len(text) < 4000


@pytest.mark.anyio
async def test_an_unknown_operation_id_lists_the_closest_ids() -> None:
    async with connect(github_config()) as client:
        text = await error(client, "search_api", operationId="issues/craete")
    assert "unknown operationId 'issues/craete'; closest: issues/create" in text


@pytest.mark.anyio
async def test_a_query_returns_scored_operations_within_the_limit() -> None:
    async with connect(github_config()) as client:
        text = await ok(client, "search_api", query="create a gist", limit=3)
        in_service = await ok(client, "search_api", query="create", service="gists", limit=2)
        too_many = await call(client, "search_api", query="star", limit=21)
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(lines) == 3
    assert lines[0].startswith("- gists/create (")
    scores = [float(line.split("(", 1)[1].split(")", 1)[0]) for line in lines]
    assert all(0 <= s <= 1 for s in scores) and scores == sorted(scores, reverse=True)
    assert all(line.startswith("- gists/") for line in in_service.splitlines() if line.startswith("- "))
    assert too_many.is_error and "limit" in text_of(too_many)


def test_search_finds_the_expected_operation_for_plain_language_queries(tmp_path: Path) -> None:
    """The floor is below what bench/openapi_search.py measures (docs/benchmarks.md): 0.50 and 0.80."""
    spec = load_spec()
    queries = load_queries()
    operations = list(spec.operations.values())
    assert len(queries) >= 20
    lexical = evaluate(build_router(operations, None, None), queries)
    assert lexical["recall@5"] >= 0.4
    from plugins.openapi.search import load_embedder

    settings = Settings(data_dir=tmp_path)
    embedder = load_embedder(settings)
    assert embedder is not None, "the bundled embedding model did not load"
    semantic = evaluate(build_router(operations, embedder, settings), queries)
    assert semantic["recall@5"] >= 0.7
    assert semantic["recall@5"] > lexical["recall@5"]


def test_the_plugin_and_the_gateways_router_share_one_loaded_model(tmp_path: Path) -> None:
    """One model in memory per process and settings, held only as long as someone uses it."""
    import gc
    import weakref

    from gateway.router.service import load_router_embedder
    from plugins.openapi.search import load_embedder

    settings = Settings(data_dir=tmp_path)
    routers = load_router_embedder(settings, None)
    assert routers is not None, "the bundled embedding model did not load"
    assert load_embedder(settings) is routers
    elsewhere = load_router_embedder(Settings(data_dir=tmp_path / "elsewhere"), None)
    assert elsewhere is not None and elsewhere is not routers
    smaller_batches = load_router_embedder(Settings(data_dir=tmp_path, embedding={"batch_size": 2}), None)
    assert smaller_batches is not None and smaller_batches is not routers and smaller_batches.batch_size == 2
    held = weakref.ref(routers)
    del routers, elsewhere, smaller_batches
    gc.collect()
    assert held() is None, "the shared model outlived its last user"


@pytest.mark.anyio
async def test_the_first_search_builds_the_embedding_index_off_the_event_loop(tmp_path: Path) -> None:
    config = Config.model_validate({"specs": [{"name": "library", "source": str(LIBRARY)}]})
    explorer = Explorer(config, REPO / "gateway.yaml", Settings(data_dir=tmp_path))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.01)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            hits, dense = await explorer.search("put a new book on a shelf", 3)
            tg.cancel_scope.cancel()
    assert dense and hits[0].name == "LibraryService_CreateBook"
    assert ticks > 5  # the loop kept running while the model loaded and the operations were embedded
    assert (tmp_path / "openapi" / "embeddings.sqlite").is_file()


# --- schemas ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_schemas_by_full_and_short_name_with_well_known_types_in_one_line() -> None:
    async with connect(Config.model_validate({"specs": [{"name": "library", "source": str(LIBRARY)}]})) as client:
        full = await ok(client, "search_api", schema="google.protobuf.Timestamp")
        short = await ok(client, "search_api", schema="timestamp")
        book = await ok(client, "search_api", schema="library.v1.Book")
        status = await ok(client, "search_api", schema="Status")
    assert (
        full
        == short
        == (
            'google.protobuf.Timestamp: string(date-time) — RFC 3339 UTC time, e.g. "2024-05-01T12:00:00Z" '
            "(google.protobuf.Timestamp)"
        )
    )
    assert 'loan_period?: string — seconds with an "s" suffix' in book
    assert "metadata?: object — any JSON object (google.protobuf.Struct)" in book
    assert "sequel?: library.v1.Book" in book and "title: string" in book and "id?: integer(int64) [read-only]" in book
    assert "format?: library.v1.Book.Format ('FORMAT_UNSPECIFIED' | 'HARDCOVER'" in book
    assert "proleptic" not in book + full and "nanosecond" not in book
    assert status.startswith("google.rpc.Status: object — error: {code: integer, message: string")


@pytest.mark.anyio
async def test_an_enum_schema_shows_its_values() -> None:
    async with connect(Config.model_validate({"specs": [{"name": "library", "source": str(LIBRARY)}]})) as client:
        text = await ok(client, "search_api", schema="Format")
    assert "library.v1.Book.Format" in text
    assert "enum values (5): 'FORMAT_UNSPECIFIED' | 'HARDCOVER' | 'PAPERBACK' | 'EBOOK' | 'AUDIOBOOK'" in text


@pytest.mark.anyio
async def test_an_unknown_schema_lists_the_closest_names() -> None:
    async with connect(github_config()) as client:
        text = await error(client, "search_api", schema="pull-requets")
    assert "unknown schema 'pull-requets'; closest: pull-request" in text


# --- several specs ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_with_several_specs_ids_are_qualified_and_ambiguity_is_explained(library_url: str, token: str) -> None:
    specs = [
        {"name": name, "source": str(LIBRARY), "base_url": library_url, "auth": {"bearer_token_env": TOKEN_ENV}}
        for name in ("library", "archive")
    ]
    config = Config.model_validate({"specs": specs})
    async with connect(config) as client:
        services = await ok(client, "search_api")
        ambiguous = await error(client, "search_api", operationId="LibraryService_GetShelf")
        shown = await ok(client, "search_api", operationId="archive:LibraryService_GetShelf")
        called = await ok(client, "call_api", operationId="library:LibraryService_GetShelf", path_params={"shelf": 1})
    assert "- library:LibraryService: 7" in services and "- archive:LibraryService: 7" in services
    assert (
        "is in several APIs; use one of: library:LibraryService_GetShelf, archive:LibraryService_GetShelf" in ambiguous
    )
    assert shown.startswith("archive:LibraryService_GetShelf — GET /v1/shelves/{shelf}")
    assert called.startswith("HTTP 200 OK")


@pytest.mark.anyio
async def test_a_spec_that_fails_to_load_is_reported_and_the_others_still_serve(tmp_path: Path) -> None:
    specs = [{"name": "gone", "source": "missing.yaml"}, {"name": "library", "source": str(LIBRARY)}]
    async with Client(create_server(Config.model_validate({"specs": specs}), tmp_path / "gw.yaml")) as client:
        text = await ok(client, "search_api")
    assert "- library:LibraryService: 7" in text
    assert f"API 'gone' failed to load: {tmp_path / 'missing.yaml'}: no such file" in text


@pytest.mark.anyio
async def test_a_spec_is_fetched_from_a_url_and_an_http_error_names_the_url(library_url: str) -> None:
    specs = [
        {"name": "remote", "source": f"{library_url}/openapi.yaml"},
        {"name": "broken", "source": f"{library_url}/v1/openapi.json"},
    ]
    async with connect(Config.model_validate({"specs": specs})) as client:
        text = await ok(client, "search_api")
    assert "Library API (remote, 9 operations, base URL http://127.0.0.1:8080)" in text  # the server variable's default
    assert f"API 'broken' failed to load: {library_url}/v1/openapi.json: cannot fetch the spec: HTTP 401" in text


# --- call_api against a real HTTP server -----------------------------------------------------------


@pytest.mark.anyio
async def test_a_call_returns_status_relevant_headers_and_the_body(library_url: str, token: str) -> None:
    async with connect(library_config(library_url)) as client:
        result = await call(client, "call_api", operationId="LibraryService_ListShelves", query={"page_size": "10"})
    assert not result.is_error, text_of(result)
    text = text_of(result)
    assert text.startswith(f"HTTP 200 OK (GET {library_url}/v1/shelves?page_size=10, ")
    assert 'link: <http://127.0.0.1/v1/shelves?page_token=2>; rel="next"' in text
    assert "x-ratelimit-remaining: 4999" in text and "x-internal-trace" not in text
    content = result.structured_content
    assert content is not None and content["status"] == 200 and content["truncated"] is False
    assert json.loads(content["body"])["shelves"][0]["theme"] == "Fiction"


@pytest.mark.anyio
async def test_a_created_resource_is_sent_as_json_and_its_location_returned(library_url: str, token: str) -> None:
    async with connect(library_config(library_url)) as client:
        text = await ok(client, "call_api", operationId="LibraryService_CreateShelf", body={"theme": "Poetry"})
    assert "location: /v1/shelves/" in text and '"theme": "Poetry"' in text


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"operationId": "LibraryService_GetShelf"}, "path_params.shelf is required (integer(int64)) — The shelf id."),
        (
            {"operationId": "LibraryService_GetShelf", "path_params": {"shelf": "first"}},
            "path_params.shelf: 'first' is not of type 'integer'",
        ),
        (
            {"operationId": "LibraryService_ListShelves", "query": {"page_sise": 5}},
            "query.page_sise: LibraryService_ListShelves has no query parameter 'page_sise'; did you mean 'page_size'",
        ),
        (
            {"operationId": "LibraryService_ListShelves", "query": {"page_size": 1000}},
            "query.page_size: 1000 is greater than the maximum of 100",
        ),
        (
            {"operationId": "LibraryService_ListBooks", "path_params": {"shelf": 1, "format": "EBOOK"}},
            "path_params.format: 'format' is a query parameter of LibraryService_ListBooks; pass it in `query`",
        ),
        (
            {"operationId": "LibraryService_CreateBook", "path_params": {"shelf": 1}, "body": {"title": "Emma"}},
            "body: 'author' is a required property",
        ),
        (
            {
                "operationId": "LibraryService_CreateBook",
                "path_params": {"shelf": 1},
                "body": {"title": "Emma", "author": "Austen", "format": "VINYL"},
            },
            "body.format: 'VINYL' is not one of ['FORMAT_UNSPECIFIED', 'HARDCOVER'",
        ),
        ({"operationId": "LibraryService_CreateShelf"}, "body is required for LibraryService_CreateShelf"),
        ({"operationId": "LibraryService_GetShelf", "path_params": {"shelf": 1}, "body": {}}, "takes no request body"),
        ({"operationId": "LibraryService_Export", "headers": {"Authorization": "x"}}, "headers.Authorization: this"),
    ],
)
@pytest.mark.anyio
async def test_bad_inputs_are_refused_naming_the_parameter_before_anything_is_sent(
    library_url: str, token: str, arguments: dict[str, Any], message: str
) -> None:
    async with connect(library_config(library_url)) as client:
        text = await error(client, "call_api", **arguments)
        books = await ok(client, "call_api", operationId="LibraryService_ListBooks", path_params={"shelf": 1})
    assert message in text
    assert "Emma" not in books  # the refused book was never sent


@pytest.mark.parametrize(
    ("shelf", "message"),
    [
        (9, 'failed: HTTP 404 Not Found: {"code": 5, "message": "shelf 9 not found", "details": []}'),
        (500, 'failed: HTTP 500 Internal Server Error: {"code": 13, "message": "the shelf index is corrupt"'),
    ],
)
@pytest.mark.anyio
async def test_http_error_statuses_become_tool_errors_with_the_apis_reason(
    library_url: str, token: str, shelf: int, message: str
) -> None:
    async with connect(library_config(library_url)) as client:
        text = await error(client, "call_api", operationId="LibraryService_GetShelf", path_params={"shelf": shelf})
    assert f"GET 127.0.0.1:{library_url.rsplit(':', 1)[1]}/v1/shelves/{{shelf}} {message}" in text


@pytest.mark.anyio
async def test_credentials_come_from_the_environment_and_never_appear_in_results(
    library_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    auth = {"bearer_token_env": TOKEN_ENV, "api_key_env": TOKEN_ENV, "api_key_query": "key"}
    async with connect(library_config(library_url, auth=auth)) as client:
        unset = await error(client, "call_api", operationId="get_v1_whoami")
        monkeypatch.setenv(TOKEN_ENV, "wrong-token-123")
        refused = await error(client, "call_api", operationId="get_v1_whoami")
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        result = await call(client, "call_api", operationId="get_v1_whoami")
    assert f"the environment variable {TOKEN_ENV} (credentials of API 'library') is not set" in unset
    assert "HTTP 401 Unauthorized" in refused and "missing or wrong bearer token" in refused
    assert "wrong-token-123" not in refused
    assert not result.is_error, text_of(result)
    text = text_of(result)
    assert '"authorization": "Bearer ***"' in text  # the server echoed it; the plugin masked it
    assert "/v1/whoami?key=***" in text
    assert TOKEN not in text and TOKEN not in json.dumps(result.structured_content)


@pytest.mark.anyio
async def test_a_body_past_the_size_limit_is_cut_with_a_note(library_url: str, token: str) -> None:
    async with connect(library_config(library_url, max_response_bytes=1000)) as client:
        result = await call(client, "call_api", operationId="LibraryService_Export", query={"copies": 500})
    assert not result.is_error, text_of(result)
    content = result.structured_content
    assert content is not None and content["truncated"] is True
    body, note = content["body"].rsplit("\n", 1)
    assert 990 <= len(body) <= 1000  # the first 1000 bytes, a few of them two-byte characters
    assert note.startswith("[truncated: showing the first 1000 bytes of ") and "paging" in note


@pytest.mark.anyio
async def test_a_refused_connection_and_a_timeout_are_clear_errors(library_url: str, token: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    async with connect(library_config(f"http://127.0.0.1:{closed_port}")) as client:
        refused = await error(client, "call_api", operationId="LibraryService_ListShelves")
    async with connect(library_config(library_url, timeout=0.5)) as client:
        slow = await error(client, "call_api", operationId="Operations_WaitOperation", path_params={"name": "op-1"})
    assert f"GET 127.0.0.1:{closed_port}/v1/shelves: could not connect" in refused
    assert "no response within 0.5 s" in slow


# --- through the gateway ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_gateway_lists_and_calls_the_openapi_tools(library_url: str, tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "library.yaml").write_text(LIBRARY.read_text())
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        plugins:
          openapi:
            specs:
              - name: library
                source: specs/library.yaml
                base_url: {library_url}
                auth: {{bearer_token_env: {TOKEN_ENV}}}
        """,
    )
    env = {"GATEWAY_PLUGINS__DIRECTORY": str(REPO / "plugins"), TOKEN_ENV: TOKEN}
    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path, env) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            found = await client.call_tool("openapi__search_api", {"service": "LibraryService"})
            called = await client.call_tool(
                "openapi__call_api", {"operationId": "LibraryService_GetShelf", "path_params": {"shelf": 1}}
            )
    assert {"openapi__search_api", "openapi__call_api"} <= set(tools)
    annotations = tools["openapi__call_api"].annotations
    assert annotations is not None and annotations.read_only_hint is False and annotations.open_world_hint is True
    search_annotations = tools["openapi__search_api"].annotations
    assert search_annotations is not None and search_annotations.read_only_hint is True
    assert "- LibraryService_CreateBook: POST /v1/shelves/{shelf}/books" in text_of(found)
    assert not called.is_error and '"theme": "Fiction"' in text_of(called)


# --- registration ----------------------------------------------------------------------------------


def test_the_hook_registers_the_server_only_when_specs_are_configured(tmp_path: Path) -> None:
    import plugins.openapi

    registered: dict[str, Any] = {}

    def register(name: str, server: Any, *, description: str = "", capabilities: Any = ()) -> None:
        registered[name] = (server, description, list(capabilities))

    settings = Settings(data_dir=tmp_path, config=tmp_path / "conf" / "gateway.yaml")
    plugins.openapi.gateway_register_servers(register, settings, None)
    assert registered == {}
    config = Config.model_validate({"specs": [{"name": "library", "source": "library.yaml"}]})
    plugins.openapi.gateway_register_servers(register, settings, config)
    server, description, capabilities = registered["openapi"]
    assert "(library)" in description and "openapi" in capabilities
    assert server.explorer.config_file == tmp_path / "conf" / "gateway.yaml"
