"""Loading the router's embedding model, as the settings choose it (`load_embedder`).

`url` set: an OpenAI-compatible endpoint instead (`gateway.router.remote_embedder`). Otherwise
three ways to get a model, chosen by `EmbeddingSettings`:

- nothing set: the bundled default, all-MiniLM-L6-v2 with int8 weights, verified and
  assembled under the data dir by `gateway.router.bundled_model`: nothing is downloaded,
  ever.
- `model_path`: a local directory laid out as fastembed expects for the model name `model`
  (default `sentence-transformers/all-MiniLM-L6-v2`: `model.onnx`, `tokenizer.json`,
  `tokenizer_config.json`, `config.json`, `special_tokens_map.json`); with `model_sha256`,
  its files are checked against those digests first.
- `model` alone: a fastembed model by name, which fastembed downloads from its model hub
  into `<data_dir>/models/fastembed/` on first use.

Whatever goes wrong while loading (a missing package, a checksum mismatch, an unimportable
onnxruntime, a bad path, an unreachable hub) is logged as one warning naming the cause and
the remedy, and `load_embedder` returns None: the router then runs on BM25 alone.

"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.router.base import Embedder
from gateway.router.bundled_model import (
    DEFAULT_EMBEDDER_ID,
    DEFAULT_MODEL_ID,
    MODEL_FILE,
    BundledModelError,
    prepare_model_dir,
    sha256_file,
    stat_digest,
)
from gateway.router.embedder import DEFAULT_MODEL_NAME, FastEmbedEmbedder

if TYPE_CHECKING:
    from gateway.config.routing_settings import EmbeddingSettings

__all__ = ["load_embedder"]

logger = logging.getLogger(__name__)

_ENV_PATH = "GATEWAY_EMBEDDING__MODEL_PATH"
_ENV_MODEL = "GATEWAY_EMBEDDING__MODEL"
_ENV_ENABLED = "GATEWAY_EMBEDDING__ENABLED"


class _LoadError(Exception):
    """A model could not be loaded; the message names the cause and what to do."""


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
    if settings.url:
        return _load_endpoint(settings)
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
    logger.debug(  # the router says when it is ready; a load that ends after a shutdown stays quiet
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


def _load_default(settings: EmbeddingSettings, data_dir: Path) -> FastEmbedEmbedder:
    """The bundled model, from its verified directory under `data_dir`."""
    try:
        model_dir = prepare_model_dir(data_dir)
    except BundledModelError as e:
        raise _LoadError(f"the bundled embedding model is unusable: {e}" + _bm25_hint(_HINT_PATH, _HINT_DISABLE)) from e
    return _open(
        DEFAULT_MODEL_NAME,
        model_id=DEFAULT_EMBEDDER_ID if settings.int8_matmul else DEFAULT_MODEL_ID,
        model_dir=model_dir,
        settings=settings,
        cache_dir=data_dir / "models" / "fastembed",
        what=f"the bundled embedding model ({model_dir})",
        hint=_bm25_hint(_HINT_PATH, _HINT_DISABLE),
        bundled=True,
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
    model_file = str(description.get("model_file") or MODEL_FILE)
    required = [model_file, "tokenizer.json", "tokenizer_config.json"] if model_file.endswith(".onnx") else []
    missing = [file for file in required if not (path / file).is_file()]
    if missing:
        raise _LoadError(
            f"{what} has no {', '.join(missing)} (fastembed reads the model {name!r} as "
            f"{', '.join(required)}, config.json and special_tokens_map.json; set {_ENV_MODEL} "
            f"to the fastembed model whose layout the directory has)" + hint
        )
    model_id = f"{name}@{stat_digest(path / model_file)}"
    if settings.model_sha256:
        model_id = f"{name}@{_verified_digests(path, settings.model_sha256, model_file, what, hint)[:8]}"
    else:
        logger.info("router: %s is not verified (set GATEWAY_EMBEDDING__MODEL_SHA256 to check its files)", what)
    return _open(
        name,
        model_id=model_id,
        model_dir=path,
        settings=settings,
        cache_dir=data_dir / "models" / "fastembed",
        what=f"the embedding model in {what} (read as {name!r})",
        hint=hint,
    )


def _verified_digests(path: Path, expected: dict[str, str], model_file: str, what: str, hint: str) -> str:
    """Check every file named in `expected` against its sha256; returns the model file's digest.

    The model file must be among them: a pin that leaves the weights out pins nothing."""
    if model_file not in expected:
        raise _LoadError(
            f"GATEWAY_EMBEDDING__MODEL_SHA256 names no digest for {model_file}, the model's weights "
            f"(it names {', '.join(sorted(expected)) or 'nothing'})" + hint
        )
    for name, digest in sorted(expected.items()):
        file = path / name
        if Path(name).is_absolute() or ".." in Path(name).parts or not file.is_file():
            raise _LoadError(f"{what} has no file {name!r} to verify" + hint)
        actual = sha256_file(file)
        if actual.lower() != digest.strip().lower():
            raise _LoadError(f"{what}: {name} has sha256 {actual}, expected {digest.strip()}" + hint)
    return expected[model_file].strip().lower()


def _load_endpoint(settings: EmbeddingSettings) -> Embedder | None:
    """The OpenAI-compatible endpoint of `url`; None (logged) when misconfigured. An endpoint that is
    down now is still returned: the router ranks with BM25 alone until it answers."""
    from gateway.router.endpoints import api_key_from_env
    from gateway.router.remote_embedder import EmbeddingUnavailable, EndpointEmbedder

    assert settings.url
    hint = _bm25_hint("set GATEWAY_EMBEDDING__MODEL to the model the endpoint serves", _HINT_DISABLE)
    if not settings.model:
        logger.warning("router: GATEWAY_EMBEDDING__URL is set but GATEWAY_EMBEDDING__MODEL is not%s", hint)
        return None
    try:
        key = api_key_from_env(settings.api_key_env)
    except ValueError as e:
        logger.warning("router: %s%s", e, _bm25_hint("set it, or unset GATEWAY_EMBEDDING__API_KEY_ENV"))
        return None
    embedder = EndpointEmbedder(
        settings.url,
        settings.model,
        api_key=key,
        request_batch=settings.request_batch,
        timeout=settings.timeout,
        query_timeout=settings.query_timeout,
        retry_seconds=settings.retry_seconds,
    )
    try:
        logger.info("router: embedding model %s (dim %d) at %s", settings.model, embedder.dim, embedder.url)
    except EmbeddingUnavailable as e:
        logger.warning(
            "router: the embedding endpoint does not answer (%s); routing with BM25 alone until it does "
            "(tried again every %g s)",
            e,
            settings.retry_seconds,
        )
    return embedder


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
    model_dir = getattr(getattr(embedder._fastembed(), "model", None), "_model_dir", None)
    model_file = description.get("model_file")
    if model_dir is not None and model_file and (Path(model_dir) / str(model_file)).is_file():
        embedder._model_id = f"{name}@{stat_digest(Path(model_dir) / str(model_file))}"
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
    _import_runtime(("fastembed", "onnxruntime"))
    from fastembed import TextEmbedding

    return TextEmbedding


def _import_runtime(packages: tuple[str, ...], present: tuple[str, ...] = ()) -> None:
    """Import what the model runs on (the bundled model: onnxruntime, no fastembed), and find
    `present` without importing it (the bundled model's `tokenizers`, imported only for a text
    that `gateway.router.wordpiece` does not take); a `_LoadError` naming them if one is missing."""
    try:
        for package in packages:
            importlib.import_module(package)
        for package in present:
            if importlib.util.find_spec(package) is None:
                raise ModuleNotFoundError(f"No module named {package!r}")
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError from onnxruntime's native libraries
        raise _LoadError(
            f"{' or '.join(packages + present)} cannot be imported ({type(e).__name__}: {e})"
            + _bm25_hint(
                f"reinstall mcp-gateway with its dependencies ({', '.join(packages + present)})", _HINT_DISABLE
            )
        ) from e


def _open(
    name: str,
    *,
    model_id: str,
    model_dir: Path | None,
    settings: EmbeddingSettings,
    cache_dir: Path,
    what: str,
    hint: str,
    bundled: bool = False,
) -> FastEmbedEmbedder:
    """The model opened (`bundled`: run directly on ONNX Runtime, fastembed not imported)."""
    if bundled:
        _import_runtime(("onnxruntime",), present=("tokenizers",))
    else:
        _import_runtime(("fastembed", "onnxruntime"))
    try:
        with contextlib.nullcontext() if bundled else _quiet_fastembed():
            return FastEmbedEmbedder(
                name,
                model_id=model_id,
                model_dir=model_dir,
                cache_dir=cache_dir,
                threads=settings.threads,
                batch_size=settings.batch_size,
                max_query_tokens=settings.max_query_tokens,
                document_workers=settings.document_workers,
                bundled=bundled,
                int8_matmul=bundled and settings.int8_matmul,
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
