"""The PostgreSQL embedding cache on a real server (tests/postgres.py): shared by replicas, exact,
and never a reason for routing to fail."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import mcp_types as types
import numpy as np
import pytest

from gateway.router.base import EmbeddingCache, Matrix, ToolRecord, Vector
from gateway.router.cache import SqliteEmbeddingCache, cache_key, open_embedding_cache
from gateway.router.cache_postgres import TABLE, PostgresEmbeddingCache
from gateway.router.index import Router
from gateway.urls import redact_url

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]  # the postgres_server and postgres_database fixtures


class LetterEmbedder:
    """A deterministic stand-in model (one dimension per letter) that counts what it embeds."""

    model_id = "letters@1"
    dim = 26

    def __init__(self) -> None:
        self.embedded = 0

    def _vector(self, text: str) -> Vector:
        counts = np.zeros(26, dtype=np.float32)
        for ch in text.lower():
            if "a" <= ch <= "z":
                counts[ord(ch) - 97] += 1
        return counts / (float(np.linalg.norm(counts)) or 1.0)

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        self.embedded += len(texts)
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, 26), dtype=np.float32)

    def embed_query(self, text: str) -> Vector:
        return self._vector(text)


def _record(name: str, description: str) -> ToolRecord:
    tool = types.Tool(name=name, description=description, input_schema={"type": "object"})
    return ToolRecord(name=name, server_id="s", tool=tool)


RECORDS = [
    _record("s__add", "Add two integers"),
    _record("s__weather", "Today's weather forecast for a city"),
    _record("s__send_mail", "Send an e-mail message to someone"),
]


@pytest.fixture
def database_url(postgres_server: PostgresServer, postgres_database: str) -> str:
    return postgres_server.url_with_password(postgres_database)


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_vectors_round_trip_exactly_and_are_shared_by_every_replica(database_url: str) -> None:
    first, second = PostgresEmbeddingCache(database_url), PostgresEmbeddingCache(database_url)
    protocol: EmbeddingCache = first  # checked by mypy
    assert protocol is first and first.usable and second.usable
    rng = np.random.default_rng(0)
    vectors = {cache_key("m", f"doc {i}"): rng.standard_normal(384).astype(np.float32) for i in range(50)}
    first.put_many(vectors)
    first.put_many({next(iter(vectors)): vectors[next(iter(vectors))]})  # stored twice: no error
    found = second.get_many([*vectors, "absent"])
    assert set(found) == set(vectors)
    assert all(np.array_equal(found[k], v) and found[k].dtype == np.float32 for k, v in vectors.items())
    assert second.get_many([]) == {}


def test_the_table_is_named_after_the_cache_and_holds_float32_bytes(
    database_url: str, postgres_server: PostgresServer, postgres_database: str
) -> None:
    PostgresEmbeddingCache(database_url).put_many({"k": np.arange(4, dtype=np.float32)})
    with postgres_server.connect(postgres_database) as connection:
        dim, blob = connection.execute(f"SELECT dim, vector FROM {TABLE} WHERE key = 'k'").fetchone()
    assert TABLE == "embedding_cache"
    assert dim == 4 and bytes(blob) == np.arange(4, dtype="<f4").tobytes()


def test_replicas_starting_together_create_the_table_once(database_url: str) -> None:
    caches: list[PostgresEmbeddingCache] = []
    threads = [threading.Thread(target=lambda: caches.append(PostgresEmbeddingCache(database_url))) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(caches) == 6 and all(cache.usable for cache in caches)


def test_a_second_router_on_the_same_database_embeds_nothing(database_url: str) -> None:
    first, second = LetterEmbedder(), LetterEmbedder()
    Router(first, cache=PostgresEmbeddingCache(database_url)).update(RECORDS)
    router = Router(second, cache=PostgresEmbeddingCache(database_url))
    router.update(RECORDS)
    assert first.embedded > 0 and second.embedded == 0
    assert router.embedded_documents == 0 and router.cached_documents == first.embedded
    assert router.search("forecast weather", k=1)[0].name == "s__weather"


def test_an_unreachable_database_is_one_warning_and_the_router_still_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"postgresql://gateway:s3cret-pass@127.0.0.1:{_unused_port()}/db"
    with caplog.at_level(logging.WARNING, logger="gateway.router.cache_postgres"):
        cache = PostgresEmbeddingCache(url, connect_timeout=2)
        assert not cache.usable
        assert cache.get_many(["k"]) == {}
        cache.put_many({"k": np.ones(4, dtype=np.float32)})
        embedder = LetterEmbedder()
        router = Router(embedder, cache=cache)
        router.update(RECORDS)
    assert embedder.embedded > 0 and router.search("add integers", k=1)[0].name == "s__add"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "embedding cache" in message and "127.0.0.1" in message and "continuing without it" in message
    assert "s3cret-pass" not in caplog.text


def test_a_database_that_goes_away_later_disables_the_cache_once(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    with postgres_server.connect(autocommit=True) as admin:
        admin.execute('CREATE DATABASE "vanishing"')
    cache = PostgresEmbeddingCache(postgres_server.url_with_password("vanishing"))
    assert cache.usable
    with postgres_server.connect(autocommit=True) as admin:
        admin.execute('DROP DATABASE "vanishing" WITH (FORCE)')
    with caplog.at_level(logging.WARNING, logger="gateway.router.cache_postgres"):
        embedder = LetterEmbedder()
        router = Router(embedder, cache=cache)
        router.update(RECORDS)
        router.update([*RECORDS, _record("s__pid", "This server's process id")])
    assert not cache.usable
    assert router.search("process id", k=1)[0].name == "s__pid"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_the_cache_follows_the_database_url(tmp_path: Path, database_url: str) -> None:
    assert isinstance(open_embedding_cache(None, tmp_path), SqliteEmbeddingCache)
    assert isinstance(open_embedding_cache("", tmp_path), SqliteEmbeddingCache)
    assert (tmp_path / "embeddings.sqlite").exists()
    chosen = open_embedding_cache(database_url, tmp_path)
    assert isinstance(chosen, PostgresEmbeddingCache) and chosen.usable
    with pytest.raises(ValueError, match=r"postgresql:// URL.*'mysql'"):
        open_embedding_cache("mysql://u:p@h/db", tmp_path)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgres://u@h/db", "postgres://u@h/db"),
        ("postgresql://h/db", "postgresql://h/db"),
    ],
)
def test_urls_are_logged_without_their_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
