"""The router learns from use: the usage model, the router applying it, the service feeding it, and eval --replay.

Ranking tests use the real default embedding model (the bundled all-MiniLM-L6-v2 int8).
"""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np
import pytest

from gateway.config.routing_settings import EmbeddingSettings, LearningSettings
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.router.base import Embedder, Vector
from gateway.router.cache import SqliteEmbeddingCache
from gateway.router.eval import EvalQuery, load_catalog, load_queries
from gateway.router.index import Router
from gateway.router.learning import LearningConfig, UsageModel, lexical_vector
from gateway.router.replay import run_replay, simulate_feedback, split_queries
from gateway.router.service import LATE_SIGNAL_SECONDS, RouterService, SignalCursor, build_router
from gateway.router.signals import UsageSignal
from gateway.upstreams.upstream import UpstreamSpec
from tests.conftest import REPO, gateway_env
from tests.servers.demo_server import create_server
from tests.test_router import CATALOG, write_eval_files

NOW = 1_800_000_000.0
DAY = 86_400.0


def unit(*values: float) -> Vector:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def signal(tool: str, value: float, query: str | None = "q", at: float = NOW) -> UsageSignal:
    return UsageSignal(query=query, tool=tool, value=value, at=at, kind="feedback")


def trained(signals: Sequence[UsageSignal], vectors: dict[str, Vector], **config: float) -> UsageModel:
    model = UsageModel(LearningConfig(**config))  # type: ignore[arg-type]
    model.add(signals, vectors, now=NOW)
    return model


# --------------------------------------------------------------------------- the model


def test_a_tool_that_worked_after_the_same_request_is_boosted_by_a_bounded_share() -> None:
    model = trained([signal("t", 1.0)], {"q": unit(1, 0, 0)}, max_boost=0.3, half_weight_signals=2)
    assert model.adjustments(unit(1, 0, 0), now=NOW) == {"t": pytest.approx(0.3 * 1 / 3)}


def test_failures_and_thumbs_down_lower_a_tool_by_at_most_the_penalty() -> None:
    model = trained([signal("t", -1.0)] * 1000, {"q": unit(1, 0, 0)}, max_penalty=0.1)
    adjustment = model.adjustments(unit(1, 0, 0), now=NOW)["t"]
    assert -0.1 <= adjustment < -0.099


def test_agreeing_signals_approach_the_boost_but_never_pass_it() -> None:
    few = trained([signal("t", 1.0)] * 2, {"q": unit(1, 0)}, max_boost=0.2).adjustments(unit(1, 0), now=NOW)["t"]
    many = trained([signal("t", 1.0)] * 500, {"q": unit(1, 0)}, max_boost=0.2).adjustments(unit(1, 0), now=NOW)["t"]
    assert few == pytest.approx(0.1)  # two signals = half_weight_signals: half the bound
    assert 0.199 < many <= 0.2


def test_mixed_signals_net_out() -> None:
    model = trained([signal("t", 1.0), signal("t", -1.0)], {"q": unit(1, 0)})
    assert model.adjustments(unit(1, 0), now=NOW) == {}


def test_signals_decay_with_age_and_are_forgotten_after_ten_half_lives() -> None:
    vectors = {"q": unit(1, 0)}
    fresh = trained([signal("t", 1.0, at=NOW)], vectors, half_life_days=7, half_weight_signals=1, max_boost=0.2)
    old = trained([signal("t", 1.0, at=NOW - 7 * DAY)], vectors, half_life_days=7, half_weight_signals=1, max_boost=0.2)
    assert fresh.adjustments(unit(1, 0), now=NOW)["t"] == pytest.approx(0.2 * 1 / 2)
    assert old.adjustments(unit(1, 0), now=NOW)["t"] == pytest.approx(0.2 * 0.5 / 1.5)
    ancient = trained([signal("t", 1.0, at=NOW - 71 * DAY), signal("u", 1.0)], vectors, half_life_days=7)
    assert len(ancient) == 1 and set(ancient.adjustments(unit(1, 0), now=NOW)) == {"u"}


def test_only_signals_from_similar_requests_count_and_more_similar_counts_more() -> None:
    model = trained([signal("t", 1.0)], {"q": unit(1, 0)}, min_similarity=0.5)
    assert model.adjustments(unit(0, 1), now=NOW) == {}  # unrelated
    assert model.adjustments(unit(0.45, np.sqrt(1 - 0.45**2)), now=NOW) == {}  # below min_similarity
    close = model.adjustments(unit(0.9, np.sqrt(1 - 0.9**2)), now=NOW)["t"]
    closer = model.adjustments(unit(0.99, np.sqrt(1 - 0.99**2)), now=NOW)["t"]
    assert 0 < close < closer < model.adjustments(unit(1, 0), now=NOW)["t"]


def test_query_less_signals_are_a_small_prior_for_every_request() -> None:
    model = trained([signal("t", -1.0, query=None)] * 100, {}, max_prior=0.02)
    for vector in (unit(1, 0), unit(0, 1), None):
        assert -0.02 <= model.adjustments(vector, now=NOW)["t"] < -0.019


def test_new_signals_need_vectors_only_for_queries_not_seen_before() -> None:
    model = trained([signal("t", 1.0, query="a")], {"a": unit(1, 0)})
    later = [signal("t", 1.0, query="a"), signal("u", 1.0, query="b"), signal("u", 1.0, query="b")]
    assert model.new_queries(later) == ["b"]
    with pytest.raises(ValueError, match="no vector for the new query 'b'"):
        model.add(later, {}, now=NOW)
    model.add(later, {"b": unit(0, 1)}, now=NOW)
    assert len(model) == 4 and model.queries == 2
    assert set(model.adjustments(unit(0, 1), now=NOW)) == {"u"}


def test_the_newest_signals_are_kept_when_there_are_too_many() -> None:
    signals = [signal(f"t{i}", 1.0, query=f"q{i}", at=NOW - i) for i in range(5)]
    model = trained(signals, {f"q{i}": unit(1, i) for i in range(5)}, max_signals=2)
    assert len(model) == 2 and model.queries == 2
    assert set(model.adjustments(unit(1, 0), now=NOW)) <= {"t0", "t1"}


def test_lexical_vectors_compare_requests_by_their_shared_terms() -> None:
    a, b = lexical_vector("convert the invoice to PDF"), lexical_vector("convert invoices into a PDF file")
    assert float(a @ a) == pytest.approx(1.0)
    assert float(a @ b) == pytest.approx(3 / np.sqrt(3 * 4))  # convert, invoice, pdf of 3 and 4 terms
    assert not lexical_vector("the of a").any()


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_boost", 1.5), ("max_penalty", -0.1), ("half_life_days", 0), ("min_similarity", 1.0), ("max_signals", 0)],
)
def test_a_bad_learning_setting_is_refused_with_its_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        LearningConfig(**{field: value})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the router


def learning_router(embedder: Embedder | None, **config: float) -> Router:
    router = Router(embedder, learning=LearningConfig(**config))  # type: ignore[arg-type]
    router.update(CATALOG)
    return router


def ranking(router: Router, query: str, **options: bool) -> list[tuple[str, float]]:
    return [(h.name, h.score) for h in router.search(query, k=len(CATALOG), **options)]


REQUESTS = ["will it rain in Paris tomorrow?", "post the release notes to the team", "what is MSFT trading at"]


def test_without_signals_the_ranking_is_exactly_the_unlearnt_one(embedder: Embedder) -> None:
    plain = Router(embedder)
    plain.update(CATALOG)
    learning = learning_router(embedder)
    for query in REQUESTS:
        assert ranking(learning, query) == ranking(plain, query)


def test_a_tool_used_after_similar_requests_ranks_higher_and_scores_stay_in_0_to_1(embedder: Embedder) -> None:
    router = learning_router(embedder, max_boost=0.25)
    query = "let the team know the build is broken"
    before = dict(ranking(router, query))
    router.learn([signal("calendar__create_event", 1.0, query="tell the team the build is broken", at=time.time())] * 4)
    after = ranking(router, query)
    assert after[0][0] == "calendar__create_event"
    assert 0 < after[0][1] - before["calendar__create_event"] <= 0.25
    assert all(0.0 <= score <= 1.0 for _, score in after)
    assert ranking(router, query, learned=False) == sorted(before.items(), key=lambda item: (-item[1], item[0]))


def test_a_burst_of_thumbs_down_for_one_request_does_not_bury_the_tool_elsewhere(embedder: Embedder) -> None:
    router = learning_router(embedder, max_penalty=0.15)
    unrelated_before = ranking(router, "will it rain in Paris tomorrow?")
    bad = "forecast our quarterly revenue for the board"
    same_before = dict(ranking(router, bad))
    router.learn([signal("weather__get_forecast", -1.0, query=bad, at=time.time())] * 50)
    assert ranking(router, "will it rain in Paris tomorrow?") == unrelated_before
    lowered = dict(ranking(router, bad))["weather__get_forecast"]
    assert same_before["weather__get_forecast"] - 0.15 - 1e-6 <= lowered < same_before["weather__get_forecast"]


class CountingQueries:
    """The real embedder, counting the queries it embeds."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.queries = 0
        self.model_id = inner.model_id
        self.dim = inner.dim

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> Vector:
        self.queries += 1
        return self.inner.embed_query(text)


def test_learning_embeds_each_query_once_and_a_restart_finds_it_in_the_cache(
    embedder: Embedder, tmp_path: Path
) -> None:
    cache = SqliteEmbeddingCache(tmp_path / "embeddings.sqlite")
    counting = CountingQueries(embedder)
    first = Router(counting, cache=cache, learning=LearningConfig())
    first.update(CATALOG)
    at = time.time()
    signals = [signal("slack__post_message", 1.0, query=q, at=at) for q in ("ping the team", "tell everyone")]
    more = [signal("calendar__create_event", 1.0, query=q, at=at) for q in ("ping the team", "book a room")]
    assert first.learn(signals) == 2 and counting.queries == 2
    assert first.learn(more) == 1 and counting.queries == 3  # a known query is not embedded again
    second = Router(counting, cache=cache, learning=LearningConfig())
    second.update(CATALOG)
    assert second.learn(signals + more) == 3 and counting.queries == 3  # all three came from the cache
    query_embeddings = counting.queries
    restarted, original = ranking(second, "ping the team"), ranking(first, "ping the team")
    # The same order and scores; the query is embedded afresh each time, and ONNX Runtime's threads
    # may sum in another order, so a score can differ in the eighth decimal.
    assert [name for name, _ in restarted] == [name for name, _ in original]
    assert [score for _, score in restarted] == pytest.approx([score for _, score in original], abs=1e-6)
    assert counting.queries == query_embeddings + 2


def test_a_bm25_only_router_learns_with_lexical_similarity() -> None:
    router = learning_router(None, max_boost=0.25)
    router.learn([signal("translate__translate_text", 1.0, query="make this readable in German", at=time.time())] * 4)
    assert router.search("make this email readable in German", k=1)[0].name == "translate__translate_text"
    assert router.search("will it rain in Paris tomorrow?", k=1)[0].name == "weather__get_forecast"


def test_a_router_without_learning_refuses_signals() -> None:
    router = Router(None)
    with pytest.raises(RuntimeError, match="without learning"):
        router.learn([signal("t", 1.0)])


# --------------------------------------------------------------------------- the service


class MemorySignals:
    """A `SignalSource` in memory: signals appended by the test, `since` as the records store reads it."""

    def __init__(self) -> None:
        self.signals: list[UsageSignal] = []
        self.reads: list[float | None] = []
        self.failures = 0
        self.read_again = anyio.Event()

    async def usage_signals(self, since: float | None = None) -> Sequence[UsageSignal]:
        self.reads.append(since)
        if len(self.reads) >= 2:
            self.read_again.set()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("records store is down")
        return [s for s in self.signals if since is None or s.at >= since]


def test_the_cursor_returns_each_signal_once_even_when_reads_overlap() -> None:
    cursor = SignalCursor()
    first = [signal("a", 1.0, at=NOW), signal("b", 1.0, at=NOW + 1)]
    assert cursor.new(first) == first and cursor.since is not None and cursor.since <= NOW
    late = signal("c", 1.0, at=NOW - 10)  # written late, but within the overlap
    assert cursor.new([*first, late]) == [late]
    assert cursor.new([]) == []


def test_the_cursor_keeps_no_signal_it_has_read_and_forgets_those_before_the_overlap() -> None:
    # At 200 calls a second every read overlaps the last 120 s: the cursor kept those 24,000
    # signals (and built sets of them at each read), which took a soaking gateway up by tens of MB.
    cursor = SignalCursor()
    read = [signal("t", 1.0, at=NOW + i / 200) for i in range(24_000)]
    refs = [weakref.ref(s) for s in read[::1000]]
    assert len(cursor.new(read)) == 24_000
    del read
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert len(cursor) == 24_000  # all within the overlap: remembered, as hashes
    later = [signal("t", 1.0, at=NOW + 200 + i) for i in range(3)]
    assert cursor.new(later) == later
    assert len(cursor) == 3 + 200 * 38  # those older than the newest minus the overlap are forgotten
    assert cursor.new([*later, signal("t", 1.0, at=NOW + 119.5)]) == []  # seen before, and past the overlap


def test_a_source_s_horizon_narrows_the_overlap_but_never_widens_it() -> None:
    cursor = SignalCursor()
    first = [signal("a", 1.0, at=NOW), signal("b", 1.0, at=NOW + 1)]
    assert cursor.new(first, horizon=NOW + 30) == first
    assert cursor.since == NOW + 30  # nothing before it can still land: the next read starts there
    late = signal("c", 1.0, at=NOW + 31)
    assert cursor.new([late], horizon=NOW + 60) == [late] and cursor.since == NOW + 60 and len(cursor) == 0
    # a call under way for ten minutes holds the horizon back: the fixed overlap applies
    newest = signal("d", 1.0, at=NOW + 600)
    assert cursor.new([newest], horizon=NOW + 60) == [newest]
    assert cursor.since == NOW + 600 - LATE_SIGNAL_SECONDS


@pytest.mark.anyio
async def test_the_service_learns_new_signals_in_the_background_and_survives_a_failing_source(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        embedding=EmbeddingSettings(enabled=False),
        learning=LearningSettings(refresh_seconds=0.05),
    )
    source = MemorySignals()
    source.signals.append(signal("mem__echo", 1.0, query="add two numbers", at=time.time()))
    registry = Registry(
        [UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"))], settings
    )
    async with registry.running():
        service = RouterService(registry, settings, lambda: build_router(settings, None), signals=source)
        registry.task_group.start_soon(service.run)
        with anyio.fail_after(30):
            await source.read_again.wait()  # the background loop read, then read again
            assert source.reads[0] is None and service.learnt == 1
            assert service.router is not None and service.router.usage is not None and len(service.router.usage) == 1
            # a second signal: the next read asks only for recent ones and learns only the new one
            source.signals.append(signal("mem__add", 1.0, query="add two numbers", at=time.time()))
            assert await service.refresh_signals() == 1
            assert source.reads[-1] is not None and len(service.router.usage) == 2
            # a failing source: logged once, retried, then it works again
            source.failures = 3
            with caplog.at_level(logging.DEBUG, logger="gateway.router.service"):
                for _ in range(3):
                    assert await service.refresh_signals() == 0
                source.signals.append(signal("mem__echo", -1.0, query="repeat this text", at=time.time()))
                assert await service.refresh_signals() == 1
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1 and "reading usage signals failed" in warnings[0].getMessage()
            assert any("works again" in r.getMessage() for r in caplog.records)
            learnt = {h.name: h.score for h in await service.search("add two numbers", 20, 0.0)}
            plain = {h.name: h.score for h in service.router.search("add two numbers", k=20, learned=False)}
            assert learnt["mem__echo"] > plain["mem__echo"] and learnt["mem__add"] > plain["mem__add"]
        registry.task_group.cancel_scope.cancel()


# --------------------------------------------------------------------------- eval --replay


def _write_replay_files(tmp_path: Path) -> tuple[Path, Path]:
    """Tools whose descriptions share no word with the requests, and requests in pairs of near paraphrases."""
    tools = {
        "invoice_tool": "Handles billing documents",
        "photo_tool": "Works with images",
        "music_tool": "Audio utilities",
        "travel_tool": "Trip planning helper",
    }
    catalog = {
        "servers": [
            {
                "name": "s",
                "tools": [{"name": n, "description": d, "inputSchema": {"type": "object"}} for n, d in tools.items()],
            }
        ]
    }
    topics = {
        "invoice_tool": "send the overdue payment reminder to customer",
        "photo_tool": "crop the holiday snapshot from the beach",
        "music_tool": "make the song louder and trim the intro",
        "travel_tool": "book flights and hotel for the conference",
    }
    queries = [
        {"id": f"{tool}-{i}", "query": f"{text} {suffix}", "expected": [[{"server": "s", "tool": tool}]]}
        for tool, text in topics.items()
        for i, suffix in enumerate(("today", "tomorrow", "please", "now"))
    ]
    return write_eval_files(tmp_path, catalog, queries)


def test_splits_are_seeded_disjoint_and_cover_every_query_with_expected_tools(tmp_path: Path) -> None:
    _, queries_path = _write_replay_files(tmp_path)
    queries = load_queries(queries_path) + [EvalQuery(id="none", query="nothing fits", expected=())]
    train, held = split_queries(queries, 0.25, seed=3)
    assert len(train) == 4 and len(held) == 12
    assert {q.id for q in train}.isdisjoint({q.id for q in held})
    assert {q.id for q in train} | {q.id for q in held} == {q.id for q in queries if q.expected}
    assert split_queries(queries, 0.25, seed=3) == (train, held)
    assert split_queries(queries, 0.25, seed=4) != (train, held)


def test_the_simulated_user_calls_the_expected_tools_and_rejects_the_top_wrong_one(tmp_path: Path) -> None:
    catalog_path, _ = _write_replay_files(tmp_path)
    router = Router(None)
    router.update(load_catalog(catalog_path))
    query = EvalQuery(
        id="x", query="q", expected=(frozenset({"s__photo_tool", "s__music_tool"}), frozenset({"s__zzz"}))
    )
    hits = [h for name in ("s__travel_tool", "s__music_tool") for h in router.search(name, k=4) if h.name == name]
    signals = simulate_feedback(query, hits, at=NOW)
    assert [(s.tool, s.value, s.kind) for s in signals] == [
        ("s__music_tool", 1.0, "call"),  # the shown alternative
        ("s__music_tool", 1.0, "feedback"),
        ("s__zzz", 1.0, "call"),  # not shown: the set's first alternative
        ("s__zzz", 1.0, "feedback"),
        ("s__travel_tool", -1.0, "feedback"),  # the highest shown tool nobody expected
    ]
    assert all(s.query == "q" and s.at == NOW for s in signals)


def test_replay_learns_from_training_requests_and_never_from_held_back_ones(tmp_path: Path) -> None:
    catalog_path, queries_path = _write_replay_files(tmp_path)
    report = run_replay(load_catalog(catalog_path), load_queries(queries_path), [1, 3], None, seeds=(0, 1, 2))
    assert [s.seed for s in report.splits] == [0, 1, 2]
    assert all(s.trained == 8 and s.held_out == 8 for s in report.splits)
    assert report.mean("learned", "recall@1") > report.mean("without", "recall@1") + 0.3
    assert report.lift_spread("recall@1")["min"] > 0


def test_eval_replay_on_the_command_line_prints_both_figures_and_the_lift(tmp_path: Path) -> None:
    catalog_path, queries_path = _write_replay_files(tmp_path)
    env = gateway_env(tmp_path)
    env["GATEWAY_EMBEDDING__ENABLED"] = "false"
    command = [sys.executable, "-m", "gateway", "eval", "--catalog", str(catalog_path), "--queries", str(queries_path)]
    done = subprocess.run(
        [*command, "--k", "1,3", "--replay", "--repeats", "2", "--seed", "5", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    replay = figures["replay"]
    assert figures["recall@1"] >= 0 and replay["seeds"] == [5, 6] and replay["held_out_queries"] == 8
    assert set(replay["without"]) == set(replay["with"]) == {"recall@1", "recall@3", "mrr"}
    assert replay["with"]["recall@1"] > replay["without"]["recall@1"]
    assert replay["lift"]["recall@1"]["mean"] == pytest.approx(
        replay["with"]["recall@1"] - replay["without"]["recall@1"], abs=1e-3
    )
    assert "held-back recall@1:" in done.stdout and "lift +" in done.stdout
    bad = subprocess.run(
        [*command, "--replay", "--train-fraction", "1.5"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert bad.returncode == 2 and "--train-fraction must be between 0 and 1" in bad.stderr
