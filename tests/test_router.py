"""The router's index, ranking, documents, BM25 and evaluation harness.

Ranking tests use the real default embedding model (the bundled all-MiniLM-L6-v2 int8,
loaded by `load_embedder` exactly as the gateway loads it), not a fake.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import numpy as np
import pytest

from gateway.config.routing_settings import RoutingSettings
from gateway.router.base import BULK_ROUNDS, Embedder, Matrix, ToolRecord, Vector, bulk_size
from gateway.router.bm25 import BM25Index, tokenize
from gateway.router.cache import cache_key
from gateway.router.documents import (
    dense_document,
    split_identifier,
    tool_document,
    truncate,
    truncate_tokens,
)
from gateway.router.embedder import FastEmbedEmbedder
from gateway.router.eval import format_report, load_catalog, run_eval
from gateway.router.index import EMBED_BATCH, Router
from gateway.router.router_config import RouterConfig
from gateway.router.steps import split_query
from tests.conftest import EXAMPLE_CONFIG

# --------------------------------------------------------------------------- fixtures


def record(
    server: str,
    tool: str,
    description: str,
    *,
    params: dict[str, Any] | None = None,
    server_description: str = "",
    capabilities: tuple[str, ...] = (),
) -> ToolRecord:
    name = f"{server}__{tool}"
    schema: dict[str, Any] = {"type": "object", "properties": params or {}}
    return ToolRecord(
        name=name,
        server_id=server,
        tool=types.Tool(name=name, description=description, input_schema=schema),
        original_name=tool,
        server_name=server,
        server_description=server_description,
        capabilities=capabilities,
    )


CATALOG = [
    record(
        "weather",
        "get_forecast",
        "Get the weather forecast (temperature, rain, wind) for a city for the next days.",
        params={"city": {"type": "string", "description": "City name"}},
        server_description="Weather data from a public meteorological service.",
    ),
    record("weather", "get_alerts", "Severe weather alerts (storms, floods) for a US state."),
    record(
        "github",
        "create_pull_request",
        "Open a new pull request in a GitHub repository from a branch.",
        params={"repo": {"type": "string"}, "head": {"type": "string"}, "base": {"type": "string"}},
        server_description="GitHub API: repositories, issues, pull requests.",
    ),
    record("github", "search_issues", "Search issues and pull requests across GitHub repositories."),
    record("filesystem", "read_file", "Read the complete contents of a file from the file system."),
    record("filesystem", "write_file", "Create a new file or overwrite an existing file with new content."),
    record("slack", "post_message", "Post a message to a Slack channel."),
    record("calendar", "create_event", "Create a calendar event with a title, start time and attendees."),
    record("finance", "get_stock_price", "Get the latest stock price for a ticker symbol."),
    record("bing", "bing_search", "使用必应搜索指定的关键词，并返回搜索结果列表"),
    record("translate", "translate_text", "Translate text from one language to another."),
    record("maps", "geocode_address", "Convert a street address or place name to latitude and longitude."),
]

QUERIES = [
    ("will it rain in Paris tomorrow?", "weather__get_forecast"),
    ("open a PR for my feature branch", "github__create_pull_request"),
    ("save this text into a new file on disk", "filesystem__write_file"),
    ("tell the team channel that the deploy is done", "slack__post_message"),
    ("how much is an AAPL share worth right now", "finance__get_stock_price"),
    ("schedule a meeting with Alice on Monday at 10", "calendar__create_event"),
    ("find the coordinates of the Eiffel Tower", "maps__geocode_address"),
    ("搜索关键词", "bing__bing_search"),
]


@pytest.fixture(scope="module")
def dense_router(embedder: Embedder) -> Router:
    router = Router(embedder)
    router.update(CATALOG)
    router.enrich()
    return router


@pytest.fixture(scope="module")
def bm25_router() -> Router:
    router = Router(None)
    router.update(CATALOG)
    return router


class CountingEmbedder:
    """The real embedder, counting the documents it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.documents: list[str] = []
        self.queries: list[str] = []

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        self.documents.extend(texts)
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> Vector:
        self.queries.append(text)
        return self.inner.embed_query(text)


class DictCache:
    def __init__(self) -> None:
        self.data: dict[str, Vector] = {}

    def get_many(self, keys: Sequence[str]) -> dict[str, Vector]:
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, items: dict[str, Vector]) -> None:
        self.data.update(items)


# --------------------------------------------------------------------------- documents


@pytest.mark.parametrize(
    ("identifier", "words"),
    [
        ("search_issues", ["search", "issues"]),
        ("get-weread-rank", ["get", "weread", "rank"]),
        ("searchIssues", ["search", "issues"]),
        ("getHTTPResponse_v2", ["get", "http", "response", "v", "2"]),
        ("mcp_howtocook_getRecipeById", ["mcp", "howtocook", "get", "recipe", "by", "id"]),
        ("Ant Design Components", ["ant", "design", "components"]),
        ("files.list", ["files", "list"]),
    ],
)
def test_identifiers_are_split_into_lowercase_words(identifier: str, words: list[str]) -> None:
    assert split_identifier(identifier) == words


def test_a_tool_document_puts_the_name_words_first_then_description_parameters_and_server() -> None:
    doc = tool_document(
        record(
            "github",
            "createPullRequest",
            "Open a pull request.",
            params={"repo_name": {"type": "string", "description": "owner/repo"}, "draft": {"type": "boolean"}},
            server_description="The GitHub API.",
            capabilities=("code", "vcs"),
        )
    )
    assert doc.startswith("create pull request. Open a pull request.")
    assert "Parameters: repo name (owner/repo), draft" in doc
    assert doc.index("Parameters:") < doc.index("Server: github")
    assert "code, vcs" in doc and "The GitHub API" in doc


def test_the_exposed_name_without_its_prefix_names_a_tool_without_an_original_name() -> None:
    plain = ToolRecord(name="srv__do_thing", server_id="srv", tool=types.Tool(name="srv__do_thing", input_schema={}))
    assert tool_document(plain).startswith("do thing.")


def test_long_descriptions_are_cut_at_a_word_boundary_so_every_part_keeps_its_place() -> None:
    long = "word " * 2000
    doc = tool_document(record("srv", "tool", long, server_description="the server " * 500))
    assert len(doc) < 1500
    assert "Server: srv" in doc
    assert truncate("alpha beta gamma", 12) == "alpha beta"


def test_the_embedded_text_is_short_and_budgets_cjk_characters_as_tokens() -> None:
    english = dense_document(record("srv", "tool", "word " * 500))
    assert english.startswith("tool. word word") and english.endswith("Server: srv.")
    assert len(english.split()) < 60
    chinese = truncate_tokens("使用必应搜索指定的关键词" * 10, 10)
    assert chinese == "使用必应搜索指定的关"


# --------------------------------------------------------------------------- BM25


def test_the_tokenizer_splits_identifiers_drops_stopwords_and_folds_plurals() -> None:
    assert tokenize("searchIssues in the repos") == ["search", "issu", "repo"]
    assert tokenize("search_issues") == tokenize("search-issues") == tokenize("Search Issues")
    assert tokenize("files") == tokenize("file")
    assert tokenize("creating") == tokenize("created") == tokenize("create")


def test_the_tokenizer_makes_character_bigrams_of_cjk_text() -> None:
    assert tokenize("搜索关键词") == ["搜索", "索关", "关键", "键词"]
    assert tokenize("天") == ["天"]
    assert tokenize("bing搜索") == ["bing", "搜索"]


def test_bm25_ranks_the_document_with_the_rarer_matching_terms_first() -> None:
    index = BM25Index.build([("a", "red apple pie"), ("b", "green apple"), ("c", "banana bread")])
    scores = index.scores("red apple")
    assert scores[0] > scores[1] > 0 and scores[2] == 0
    assert 0 < scores.max() <= index.max_score("red apple")


def test_bm25_rebuilds_reuse_the_terms_of_unchanged_documents() -> None:
    first = BM25Index.build([("a", "red apple"), ("b", "green apple")])
    second = BM25Index.build([("a", "red apple"), ("b", "yellow apple"), ("c", "plum")], previous=first)
    assert first.tokenized == 2 and second.tokenized == 2
    assert second.keys == ["a", "b", "c"]
    assert first.scores("green")[1] > 0 and second.scores("green").max() == 0
    removed = BM25Index.build([("c", "plum")], previous=second)
    assert removed.tokenized == 0 and len(removed) == 1


# --------------------------------------------------------------------------- ranking


@pytest.mark.parametrize(("query", "expected"), QUERIES)
def test_the_hybrid_router_ranks_the_right_tool_first(dense_router: Router, query: str, expected: str) -> None:
    assert dense_router.dense
    hits = dense_router.search(query, k=3)
    assert hits[0].name == expected, [(h.name, round(h.score, 3)) for h in hits]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("weather forecast for Paris", "weather__get_forecast"),
        ("create a pull request", "github__create_pull_request"),
        ("write a new file", "filesystem__write_file"),
        ("post a message to slack", "slack__post_message"),
        ("搜索关键词", "bing__bing_search"),
    ],
)
def test_without_an_embedder_the_router_ranks_with_bm25_alone(bm25_router: Router, query: str, expected: str) -> None:
    assert not bm25_router.dense
    assert bm25_router.description == "bm25+split=sentences/round_robin"  # long requests step by step
    assert bm25_router.search(query, k=3)[0].name == expected


@pytest.mark.parametrize("fixture", ["dense_router", "bm25_router"])
def test_scores_are_between_0_and_1_and_never_increase_down_the_list(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    router: Router = request.getfixturevalue(fixture)
    for query, _ in QUERIES:
        hits = router.search(query, k=len(CATALOG))
        assert len(hits) == len(CATALOG)
        scores = [h.score for h in hits]
        assert all(0.0 <= s <= 1.0 for s in scores)
        assert scores == sorted(scores, reverse=True)
        assert hits[0].record.name == hits[0].name


def test_the_threshold_drops_weak_results(dense_router: Router) -> None:
    everything = dense_router.search("will it rain in Paris tomorrow?", k=12)
    cut = (everything[0].score + everything[-1].score) / 2
    kept = dense_router.search("will it rain in Paris tomorrow?", k=12, threshold=cut)
    assert 0 < len(kept) < len(everything)
    assert all(h.score >= cut for h in kept)
    assert dense_router.search("will it rain in Paris tomorrow?", threshold=1.0) == []


def test_equal_scores_are_ordered_by_name_and_results_are_stable() -> None:
    router = Router(None)
    router.update(
        [record("beta", "same", "identical text"), record("alpha", "same", "identical text"), record("c", "x", "y")]
    )
    hits = router.search("identical text", k=3)
    assert [h.name for h in hits[:2]] == ["alpha__same", "beta__same"]
    assert hits[0].score == hits[1].score
    assert [h.name for h in router.search("identical text", k=1)] == ["alpha__same"]
    assert router.search("identical text", k=3) == hits


def test_the_first_k_results_are_the_results_for_k(dense_router: Router) -> None:
    for query, _ in QUERIES:
        ten = [h.name for h in dense_router.search(query, k=10)]
        assert [h.name for h in dense_router.search(query, k=3)] == ten[:3]


@pytest.mark.parametrize("query", ["", "   ", "\n"])
def test_an_empty_query_is_an_error(bm25_router: Router, query: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        bm25_router.search(query)


def test_an_empty_index_returns_nothing_and_k_must_be_positive() -> None:
    router = Router(None)
    assert router.search("anything") == []
    router.update(CATALOG[:2])
    with pytest.raises(ValueError):
        router.search("weather", k=0)


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Router(None).update([CATALOG[0], CATALOG[0]])


def test_every_ranking_variant_returns_valid_results(embedder: Embedder) -> None:
    for config in (
        RouterConfig(fusion="rrf"),
        RouterConfig(fusion="dense"),
        RouterConfig(fusion="bm25"),
        RouterConfig(server_weight=0.5),
        RouterConfig(split="clauses", merge="round_robin"),
        RouterConfig(split="sentences", merge="max"),
        RouterConfig(full_document_weight=0.5),
        RouterConfig(query_text="raw"),
    ):
        router = Router(embedder, config=config)
        router.update(CATALOG)
        hits = router.search("Get the forecast for Paris. Then post it to the team channel.", k=5)
        assert len(hits) == 5 and len({h.name for h in hits}) == 5
        assert all(0.0 <= h.score <= 1.0 for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert "weather__get_forecast" in [h.name for h in hits], config


def test_the_model_reads_the_compact_request_and_bm25_the_request_as_written(embedder: Embedder) -> None:
    counting = CountingEmbedder(embedder)
    request = "Please save the forecast to /root/notes/paris.md"
    compact = Router(counting)
    compact.update(CATALOG)
    compact.search(request, k=3)
    assert counting.queries == ["save forecast file md"]
    raw = Router(counting, config=RouterConfig(query_text="raw"))
    raw.update(CATALOG)
    raw.search(request, k=3)
    assert counting.queries[-1] == request
    # BM25 reads the path's words: a tool named after them matches only lexically
    notes = record("notes", "paris_notes", "Keep notes about trips")
    lexical = Router(None)
    lexical.update([*CATALOG, notes])
    assert lexical.search(request, k=1)[0].name == "notes__paris_notes"


def full_text(r: ToolRecord) -> str:
    return truncate_tokens(tool_document(r), RouterConfig().full_document_tokens)


def test_update_embeds_the_short_texts_and_enrich_the_full_texts(embedder: Embedder) -> None:
    counting = CountingEmbedder(embedder)
    cache = DictCache()
    router = Router(counting, cache=cache)
    router.update(CATALOG)
    assert sorted(counting.documents) == sorted(dense_document(r) for r in CATALOG)
    # a tool with a short description and nothing else has one text: its full text is its short text
    longer = [r for r in CATALOG if full_text(r) != dense_document(r)]
    assert 0 < len(longer) < len(CATALOG) and router.pending_documents == len(longer)
    before = router.search("weather forecast for tomorrow", k=len(CATALOG))  # searchable at once
    assert before[0].name == "weather__get_forecast"

    counting.documents.clear()
    calls: list[tuple[int, int]] = []
    assert router.enrich(progress=lambda done, total: calls.append((done, total))) == len(longer)
    assert sorted(counting.documents) == sorted(full_text(r) for r in longer)
    assert calls[0] == (0, len(longer)) and calls[-1] == (len(longer), len(longer))
    assert router.pending_documents == 0 and router.enrich() == 0
    # a tool's vector is the mean of its two texts' vectors: its cosine is the mean of the two cosines
    forecast = next(r for r in longer if r.name == "weather__get_forecast")
    row = router.names.index(forecast.name)
    short, full = (cache.data[cache_key(embedder.model_id, text(forecast))] for text in (dense_document, full_text))
    assert np.allclose(router._snapshot.matrix[row], 0.5 * short + 0.5 * full, atol=1e-6)
    after = router.search("weather forecast for tomorrow", k=len(CATALOG))
    assert after[0].name == "weather__get_forecast" and [h.score for h in after] != [h.score for h in before]

    # a restart finds both texts' vectors in the cache; a changed tool re-embeds its own texts only
    counting.documents.clear()
    restarted = Router(counting, cache=cache)
    restarted.update(CATALOG)
    assert restarted.pending_documents == 0 and restarted.enrich() == 0 and counting.documents == []
    assert [(h.name, h.score) for h in restarted.search("weather forecast", k=5)] == [
        (h.name, h.score) for h in router.search("weather forecast", k=5)
    ]
    changed = record(
        "slack", "post_message", "Send a chat message to a Slack channel or a person.", params={"channel": {}}
    )
    records = [changed if r.name == changed.name else r for r in CATALOG]
    restarted.update(records)
    assert restarted.pending_documents == 1 and restarted.enrich() == 1
    assert counting.documents == [dense_document(changed), full_text(changed)]


def test_enrich_takes_in_an_update_made_meanwhile_and_stops_when_asked(embedder: Embedder) -> None:
    added = record("jira", "create_issue", "Create a Jira issue in a project.", params={"project": {}})
    kept = [r for r in CATALOG if r.name != "maps__geocode_address"]

    class UpdatingEmbedder(CountingEmbedder):
        """Updates the router (a tool added, one removed) while the first full texts are embedded."""

        router: Router | None = None

        def embed_documents(self, texts: Sequence[str]) -> Matrix:
            if self.router is not None and any(text == full_text(CATALOG[0]) for text in texts):
                router, self.router = self.router, None
                router.update([*kept, added])
            return super().embed_documents(texts)

    updating = UpdatingEmbedder(embedder)
    router = Router(updating)
    router.update(CATALOG)
    stop = threading.Event()
    stop.set()
    pending = router.pending_documents
    assert router.enrich(stop=stop) == 0 and pending > 0 and router.pending_documents == pending

    updating.router = router
    router.enrich()
    assert router.pending_documents == 0 and "jira__create_issue" in router.names
    assert full_text(added) in updating.documents  # the tool added meanwhile has both its texts
    assert router.search("open a ticket in jira", k=1)[0].name == "jira__create_issue"


def test_multi_step_requests_are_split_into_steps() -> None:
    assert split_query("Find the weather in Paris. Then email it to Bob.", clauses=False) == [
        "Find the weather in Paris.",
        "Then email it to Bob.",
    ]
    assert split_query("1. download the report 2. summarize the report", clauses=False) == [
        "download the report",
        "summarize the report",
    ]
    assert split_query("read the sales file, plot a bar chart and then save it to disk") == [
        "read the sales file",
        "plot a bar chart",
        "save it to disk",
    ]
    assert split_query("Ask Mr. Smith about it") == ["Ask Mr. Smith about it"]
    assert split_query("hello") == ["hello"]


LONG_REQUEST = (
    "I need the latest price of the ACME stock for my report. Post a short note about it to the team's "
    "Slack channel. Then put a meeting with the team on my calendar for Monday at ten. "
    "Finally, the summary has to be in French for our partners in Lyon, so translate it."
)


def test_a_long_four_step_request_gets_one_tool_for_each_of_its_steps(dense_router: Router) -> None:
    assert dense_router.config.split == "sentences"
    hits = dense_router.search(LONG_REQUEST, k=4)
    assert {h.name for h in hits} == {
        "finance__get_stock_price",
        "slack__post_message",
        "calendar__create_event",
        "translate__translate_text",
    }


@pytest.mark.parametrize("request_text", ["turn off the coffee maker", "water the plants in the garden"])
def test_an_infeasible_request_scores_under_the_default_no_fit_threshold(
    dense_router: Router, request_text: str
) -> None:
    threshold = RoutingSettings().no_fit_threshold
    assert dense_router.search(request_text, k=1)[0].score < threshold  # "no tool fits this request"
    assert dense_router.search("post a message to slack", k=1)[0].score >= threshold


# --------------------------------------------------------------------------- incremental updates


def test_an_update_embeds_only_new_and_changed_documents(embedder: Embedder) -> None:
    counting = CountingEmbedder(embedder)
    cache = DictCache()
    router = Router(counting, cache=cache)
    calls: list[tuple[int, int]] = []
    router.update(CATALOG, progress=lambda done, total: calls.append((done, total)))
    assert len(counting.documents) == len(CATALOG)
    assert calls[0] == (0, len(CATALOG)) and calls[-1] == (len(CATALOG), len(CATALOG))
    assert len(cache.data) == len(CATALOG)

    counting.documents.clear()
    router.update(list(reversed(CATALOG)))
    assert counting.documents == []

    changed = record("slack", "post_message", "Send a chat message to a Slack channel or a person.")
    added = record("jira", "create_issue", "Create a Jira issue in a project.")
    records = [r for r in CATALOG if r.name != "slack__post_message" and r.name != "maps__geocode_address"]
    router.update([*records, changed, added])
    assert sorted(counting.documents) == sorted([dense_document(changed), dense_document(added)])
    assert "maps__geocode_address" not in router.names and "jira__create_issue" in router.names
    assert len(router) == len(CATALOG)
    assert router.search("find the coordinates of the Eiffel Tower", k=len(CATALOG))[0].name != "maps__geocode_address"
    assert router.search("open a ticket in jira", k=1)[0].name == "jira__create_issue"

    # a fresh router (a restart) finds every vector in the cache
    counting.documents.clear()
    restarted = Router(counting, cache=cache)
    restarted.update([*records, changed, added])
    assert counting.documents == []
    assert [h.name for h in restarted.search("open a ticket in jira", k=5)] == [
        h.name for h in router.search("open a ticket in jira", k=5)
    ]
    key = cache_key(embedder.model_id, dense_document(added))
    assert np.array_equal(cache.data[key], restarted._vectors[key])


def test_a_description_change_updates_bm25_even_when_the_embedded_text_is_the_same(embedder: Embedder) -> None:
    counting = CountingEmbedder(embedder)
    router = Router(counting)
    base = record("srv", "tool", "Do one thing. " + "filler " * 60)
    router.update([base, CATALOG[0]])
    counting.documents.clear()
    tail_changed = record("srv", "tool", "Do one thing. " + "filler " * 60 + "zanzibar")
    router.update([tail_changed, CATALOG[0]])
    assert counting.documents == []  # the embedded start of the description did not change
    assert router.search("zanzibar", k=1)[0].name == "srv__tool"


# --------------------------------------------------------------------------- evaluation


def write_eval_files(directory: Path, catalog: dict[str, Any], queries: list[dict[str, Any]]) -> tuple[Path, Path]:
    """`catalog.json` and `queries.jsonl` in `directory`, in the formats `mcp-gateway eval` reads."""
    catalog_path = directory / "catalog.json"
    catalog_path.write_text(json.dumps(catalog))
    queries_path = directory / "queries.jsonl"
    queries_path.write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    return catalog_path, queries_path


def _write_eval_files(tmp_path: Path) -> tuple[Path, Path]:
    catalog = {
        "servers": [
            {
                "name": "zoo",
                "description": "",
                "tools": [
                    {"name": "feed_zebra", "description": "Feed the zebra", "inputSchema": {"type": "object"}},
                    {"name": "wash_elephant", "description": "Wash the elephant", "inputSchema": {"type": "object"}},
                ],
            },
            {
                "name": "kitchen",
                "tools": [
                    {"name": "bake_bread", "description": "Bake bread in the oven"},
                    {"name": "boil_water", "description": "Boil water in a kettle"},
                ],
            },
            {"name": "garage", "tools": [{"name": "fix_bicycle", "description": "Repair a bicycle tire"}]},
        ]
    }
    queries = [
        # rank 1: recall@1 1, recall@5 1, rr 1
        {"id": "q1", "query": "feed the zebra", "expected": [[{"server": "zoo", "tool": "feed_zebra"}]]},
        # both tools in the top 2: recall@1 0.5, recall@5 1, rr 1
        {
            "id": "q2",
            "query": "bake bread and fix the bicycle",
            "expected": [[{"server": "kitchen", "tool": "bake_bread"}], [{"server": "garage", "tool": "fix_bicycle"}]],
        },
        # one of two sets found (an alternative counts): recall@1 0.5, recall@5 0.5, rr 1
        {
            "id": "q3",
            "query": "boil water",
            "expected": [
                [{"server": "zoo", "tool": "feed_zebra"}, {"server": "kitchen", "tool": "boil_water"}],
                [{"server": "zoo", "tool": "wash_elephant"}],
            ],
        },
        # the expected tool is second ("wash" twice beats "kettle" once): recall@1 0, recall@5 1, rr 0.5
        {"id": "q4", "query": "wash the kettle", "expected": [[{"server": "kitchen", "tool": "boil_water"}]]},
        # nothing matches: 0, 0, 0
        {"id": "q5", "query": "polish the piano", "expected": [[{"server": "garage", "tool": "fix_bicycle"}]]},
        # no expected tool: one query with nothing above the threshold, one with something
        {"id": "q6", "query": "tune the guitar", "expected": []},
        {"id": "q7", "query": "feed the elephant", "expected": []},
    ]
    return write_eval_files(tmp_path, catalog, queries)


def test_the_eval_harness_computes_recall_mrr_and_the_no_answer_rate(tmp_path: Path) -> None:
    catalog_path, queries_path = _write_eval_files(tmp_path)
    report = run_eval(catalog_path, queries_path, [1, 5], None, threshold=0.01)
    result = report.to_json()
    assert set(result) == {
        "recall@1",
        "recall@5",
        "mrr",
        "index_seconds",
        "enrich_seconds",
        "search_ms_p50",
        "search_ms_p95",
        "queries",
        "empty_expected_none_rate",
        "empty_expected",
        "router",
        "cached_documents",
        "recall@1_halves",
        "recall@5_halves",
    }
    assert result["recall@1"] == pytest.approx((1 + 0.5 + 0.5 + 0 + 0) / 5)
    assert result["recall@5"] == pytest.approx((1 + 1 + 0.5 + 1 + 0) / 5)
    assert result["mrr"] == pytest.approx((1 + 1 + 1 + 0.5 + 0) / 5)
    assert result["queries"] == 5
    assert result["empty_expected_none_rate"] == pytest.approx(0.5) and result["empty_expected"] == 2
    assert result["recall@1_halves"] == [pytest.approx((1 + 0.5 + 0) / 3), pytest.approx((0.5 + 0) / 2)]
    assert result["router"] == "bm25+split=sentences/round_robin"
    assert result["search_ms_p50"] >= 0 and result["index_seconds"] >= 0
    text = format_report(report)
    assert "recall@1: 0.400" in text and "recall@5: 0.700" in text and "mrr: 0.700" in text


def test_the_eval_harness_indexes_the_catalog_as_gateway_tool_records(tmp_path: Path, embedder: Embedder) -> None:
    catalog_path, queries_path = _write_eval_files(tmp_path)
    records = load_catalog(catalog_path)
    assert [r.name for r in records][:2] == ["zoo__feed_zebra", "zoo__wash_elephant"]
    assert records[0].original_name == "feed_zebra" and records[0].server_name == "zoo"
    report = run_eval(catalog_path, queries_path, [10, 1], embedder)
    assert report.ks == (1, 10)
    assert set(report.to_json()) >= {"recall@1", "recall@10"}
    assert report.router == RouterConfig().describe(True)
    assert report.recall[1] >= 0.4 and report.empty_expected_none_rate == 0.0


EVERYDAY_REQUESTS = [
    ("what time is it", "clock__now"),
    ("what time is it in Tokyo", "clock__now"),
    ("how many days until christmas", "clock__date_difference"),
    ("add 3 business days to friday", "clock__add_duration"),
    ("convert 3pm Paris time to New York", "clock__convert_time"),
    ("take a note", "notes__add_note"),
    ("add a note", "notes__add_note"),
    ("remember this for later", "notes__add_note"),
    ("delete my shopping note", "notes__delete_note"),
    ("show all my notes", "notes__list_notes"),
    ("find my notes about rust", "notes__search_notes"),
]


@pytest.fixture(scope="module")
def bundled_router(embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Router:
    """The router over the bundled plugins' tools (clock, notes, openapi, sql) as the example config serves them."""
    from gateway.config.loader import load_config
    from gateway.config.settings import Settings
    from gateway.plugins import get_plugin_manager
    from gateway.registry import Registry
    from gateway.router.service import records_from_registry
    from gateway.server_specs import specs_from_config, specs_from_plugins

    settings = Settings(data_dir=tmp_path_factory.mktemp("bundled"))
    config = load_config(EXAMPLE_CONFIG)
    pm, _ = get_plugin_manager(settings)
    registry = Registry(specs_from_plugins(pm, settings, config) + specs_from_config(config), settings, plugins=pm)

    async def tools() -> list[ToolRecord]:
        async with registry.running():
            await registry.wait_settled(30)
            return records_from_registry(registry)

    router = Router(embedder)
    router.update(anyio.run(tools))
    router.enrich()
    return router


@pytest.mark.parametrize(("query", "expected"), EVERYDAY_REQUESTS)
def test_everyday_requests_find_the_bundled_tool_first(bundled_router: Router, query: str, expected: str) -> None:
    assert bundled_router.search(query, k=3)[0].name == expected


# --------------------------------------------------------------------------- calls to the embedder


def test_an_embedder_with_document_workers_gets_enough_texts_per_call_to_keep_them_busy(
    embedder: FastEmbedEmbedder,
) -> None:
    class Plain:  # an embedder without workers (the protocol alone)
        model_id = "plain"
        dim = 3

    assert bulk_size(Plain(), EMBED_BATCH) == EMBED_BATCH and bulk_size(Plain(), 1) == 1
    assert embedder.document_workers >= 1
    expected = embedder.document_workers * embedder.batch_size * BULK_ROUNDS if embedder.document_workers > 1 else 1
    assert bulk_size(embedder, 1) == expected
    assert bulk_size(embedder, 10_000) == 10_000
