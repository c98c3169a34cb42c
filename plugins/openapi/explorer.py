"""The configured APIs, loaded once on first use: lookups by service, operation and schema, and search.

Loading reads every spec (files in a worker thread, URLs with an HTTP client); a spec
that fails to load is reported by the tools with its reason while the others serve.
Search starts lexical (BM25, built in milliseconds) and becomes semantic once the
embedding index is built in a worker thread; a search waits for that up to
`search_wait` seconds the first time.

Names: with one spec, ids, services and schemas are the spec's own names. With several,
each is qualified as `<spec>:<name>`; an unqualified name is accepted when only one spec
has it.
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.to_thread
import httpx2

from gateway.router.base import SearchHit

from .config import Config, SpecConfig, resolve_source
from .search import build_router, load_embedder
from .spec import ApiSpec, Operation, SpecError, parse_document
from .validate import SchemaValidator

if TYPE_CHECKING:
    from gateway.config.settings import Settings
    from gateway.router.index import Router

__all__ = ["Explorer", "NotFound"]

logger = logging.getLogger(__name__)

MAX_SPEC_BYTES = 64 * 1024 * 1024
T = TypeVar("T")


class NotFound(LookupError):
    """A name matched nothing; the message lists the closest names."""


def _closest(name: str, candidates: Sequence[str], n: int = 5) -> list[str]:
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    contains = [c for c in candidates if name.lower() in c.lower() and c.lower() not in close]
    return list(dict.fromkeys([lowered[c] for c in close] + contains))[:n]


def _qualified(spec: str, name: str, qualify: bool) -> str:
    return f"{spec}:{name}" if qualify else name


class Explorer:
    """Every configured API. Use from one event loop; index building is thread-safe."""

    def __init__(self, config: Config, config_file: Path, settings: Settings | None = None) -> None:
        self.config = config
        self.config_file = config_file
        self.settings = settings
        self.specs: dict[str, ApiSpec] = {}
        self.spec_configs: dict[str, SpecConfig] = {s.name: s for s in config.specs}
        self.failures: dict[str, str] = {}
        self.router: Router | None = None
        self._loaded = False
        self._load_lock = anyio.Lock()
        self._index_lock = threading.Lock()
        self._indexed = False
        self._validators: dict[str, SchemaValidator] = {}

    @property
    def qualify(self) -> bool:
        return len(self.config.specs) > 1

    # ------------------------------------------------------------------ loading

    async def load(self) -> None:
        """Load every spec and build the lexical index, once."""
        async with self._load_lock:
            if self._loaded:
                return
            for spec_config in self.config.specs:
                try:
                    self.specs[spec_config.name] = await self._load_one(spec_config)
                except SpecError as exc:
                    self.failures[spec_config.name] = str(exc)
                    logger.error("openapi: API %r is unavailable: %s", spec_config.name, exc)
            operations = self.operations()
            self.router = await anyio.to_thread.run_sync(lambda: build_router(operations, None, None))
            self._loaded = True

    async def _load_one(self, spec_config: SpecConfig) -> ApiSpec:
        source = resolve_source(spec_config.source, self.config_file)
        if source.lower().startswith(("http://", "https://")):
            text = await self._fetch(source, spec_config.timeout)
        else:
            text = await anyio.to_thread.run_sync(self._read, source)

        def build() -> ApiSpec:
            document = parse_document(text, source)
            return ApiSpec.build(
                spec_config.name,
                document,
                source_url=source if source.lower().startswith("http") else "",
                base_url=spec_config.base_url or "",
                qualify=self.qualify,
            )

        spec = await anyio.to_thread.run_sync(build)
        for warning in spec.warnings:
            logger.warning("openapi: %s: %s", spec.name, warning)
        return spec

    @staticmethod
    def _read(path: str) -> str:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read(MAX_SPEC_BYTES + 1)
        except FileNotFoundError:
            raise SpecError(f"{path}: no such file (a relative `source` is relative to the YAML file)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"{path}: cannot read: {exc}") from None

    @staticmethod
    async def _fetch(url: str, timeout: float) -> str:
        try:
            async with httpx2.AsyncClient(timeout=timeout, follow_redirects=True) as client:
                response = await client.get(url, headers={"Accept": "application/json, application/yaml, */*"})
        except httpx2.HTTPError as exc:
            raise SpecError(f"{url}: cannot fetch the spec: {exc or type(exc).__name__}") from None
        if response.status_code >= 400:
            raise SpecError(f"{url}: cannot fetch the spec: HTTP {response.status_code} {response.reason_phrase}")
        if len(response.content) > MAX_SPEC_BYTES:
            raise SpecError(f"{url}: the spec is larger than {MAX_SPEC_BYTES} bytes")
        return response.text

    # ------------------------------------------------------------------ search

    def _build_dense_index(self) -> None:
        """Load the embedder and embed the operations, once (later callers wait for the first)."""
        with self._index_lock:
            if self._indexed:
                return
            embedder = load_embedder(self.settings) if self.settings is not None else None
            router = None
            if embedder is not None:
                try:
                    router = self.router = build_router(self.operations(), embedder, self.settings)
                except Exception:  # noqa: BLE001 - boundary: lexical search goes on without embeddings
                    logger.exception("openapi: embedding the operations failed; searching with BM25 alone")
            self._indexed = True  # searches from now on use this index, while its full texts are embedded
            if router is not None:
                try:
                    router.enrich()
                except Exception:  # noqa: BLE001 - boundary: the short texts' vectors keep serving
                    logger.exception("openapi: embedding the operations' full texts failed; ranking without them")

    async def search(self, query: str, limit: int) -> tuple[list[SearchHit], bool]:
        """The best operations for `query` and whether the ranking used embeddings."""
        await self.load()
        if not self._indexed:
            with anyio.move_on_after(self.config.search_wait):
                await anyio.to_thread.run_sync(self._build_dense_index, abandon_on_cancel=True)
        router = self.router
        assert router is not None
        hits = await anyio.to_thread.run_sync(lambda: router.search(query, k=limit))
        return hits, router.dense

    # ------------------------------------------------------------------ lookups

    def operations(self) -> list[Operation]:
        return [op for spec in self.specs.values() for op in spec.operations.values()]

    def services(self) -> Counter[tuple[str, str]]:
        """(spec, tag) -> number of operations; an operation with several tags counts under each."""
        counts: Counter[tuple[str, str]] = Counter()
        for op in self.operations():
            for tag in op.tags:
                counts[(op.spec, tag)] += 1
        return counts

    def service_name(self, spec: str, tag: str) -> str:
        return _qualified(spec, tag, self.qualify)

    def _pick(self, kind: str, name: str, table: Mapping[str, T], hint: str) -> T:
        """`table[name]`, else a unique case-insensitive or unqualified match, else NotFound with suggestions."""
        if name in table:
            return table[name]
        lowered = [key for key in table if key.lower() == name.lower()]
        if len(lowered) == 1:
            return table[lowered[0]]
        if ":" not in name:
            tails = [key for key in table if key.partition(":")[2].lower() == name.lower()]
            if len(tails) == 1:
                return table[tails[0]]
            if len(tails) > 1:
                raise NotFound(f"{kind} {name!r} is in several APIs; use one of: {', '.join(tails)}")
        close = _closest(name, list(table))
        suggestion = f"closest: {', '.join(close)}" if close else hint
        failed = f" (APIs that failed to load: {', '.join(self.failures)})" if self.failures else ""
        raise NotFound(f"unknown {kind} {name!r}; {suggestion}{failed}")

    def operation(self, op_id: str) -> Operation:
        table = {op.id: op for op in self.operations()}
        return self._pick("operationId", op_id.strip(), table, "search with search_api(query=...)")

    def service(self, name: str) -> tuple[str, str]:
        table = {self.service_name(spec, tag): (spec, tag) for spec, tag in self.services()}
        return self._pick("service", name.strip(), table, "call search_api() to list the services")

    def schema(self, name: str) -> tuple[ApiSpec, str]:
        """A component schema by full name (`google.protobuf.Timestamp`) or short name (`Timestamp`)."""
        full: dict[str, tuple[ApiSpec, str]] = {}
        short: dict[str, list[tuple[ApiSpec, str]]] = {}
        for spec in self.specs.values():
            for key in spec.schemas:
                full[_qualified(spec.name, key, self.qualify)] = (spec, key)
                tail = key.rsplit(".", 1)[-1]
                short.setdefault(_qualified(spec.name, tail, self.qualify).lower(), []).append((spec, key))
        name = name.strip()
        try:
            return self._pick("schema", name, full, "see the schema names in an operation's description")
        except NotFound as not_found:
            candidates = short.get(name.lower()) or (
                [] if ":" in name else [c for k, v in short.items() if k.partition(":")[2] == name.lower() for c in v]
            )
            if len(candidates) == 1:
                return candidates[0]
            if candidates:
                names = ", ".join(_qualified(s.name, key, self.qualify) for s, key in candidates)
                raise NotFound(f"schema {name!r} is ambiguous; use a full name: {names}") from None
            raise not_found from None

    def validator(self, spec: ApiSpec) -> SchemaValidator:
        if spec.name not in self._validators:
            self._validators[spec.name] = SchemaValidator(spec)
        return self._validators[spec.name]

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ
