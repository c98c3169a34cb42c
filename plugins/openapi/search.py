"""Semantic search over operations with the gateway's own router engine.

Each operation becomes a `ToolRecord` (name: its id; description: its summary and
description, then its path after verbs for its method; parameters: its parameter
names; server: the spec's short name; capabilities: its tags), so the
router's documents, BM25 index, embedder and embedding cache are used as they are
for tools. The embedder is the one the gateway's router uses
(`gateway.router.service.load_router_embedder`: a plugin's `gateway_embedder`, else
the bundled model; in the gateway's process, the very instance its router holds); if
none loads, search is BM25 alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mcp_types as types

from gateway.router.base import Embedder, ToolRecord
from gateway.router.index import Router

from .spec import Operation

if TYPE_CHECKING:
    from gateway.config.settings import Settings

__all__ = ["build_router", "load_embedder", "operation_record"]

logger = logging.getLogger(__name__)

MAX_PARAMETERS = 12
METHOD_VERBS = {
    "get": "get read list show",
    "post": "create add send",
    "put": "set replace add",
    "patch": "update change edit",
    "delete": "delete remove",
}
"""Words for what a method does, so "change the title" meets PATCH (`bench/openapi_search.py`: BM25 alone
recall@5 0.47 -> 0.50 with them, the default ranking 0.80 either way)."""


def operation_record(op: Operation) -> ToolRecord:
    """The router's view of one operation.

    The summary comes first because the embedded text is short (`dense_document` keeps
    the first ~30 word pieces of the description); the server is the spec's short name,
    not its title, which would add the same noise to every document.
    """
    endpoint = f"{METHOD_VERBS.get(op.method, op.method)} {op.path}"
    description = ". ".join(p for p in (op.summary, op.description, endpoint) if p)
    properties: dict[str, Any] = {}
    for param in op.parameters[:MAX_PARAMETERS]:
        properties[param.name] = {"description": param.description} if param.description else {}
    return ToolRecord(
        name=op.id,
        server_id=op.spec,
        tool=types.Tool(
            name=op.id,
            description=description,
            input_schema={"type": "object", "properties": properties},
        ),
        original_name=op.operation_id,
        server_name=op.spec,
        capabilities=op.tags,
    )


def load_embedder(settings: Settings) -> Embedder | None:
    """The gateway router's embedder, or None (search is then BM25 alone). Blocking: call from a thread.

    The plugin manager is rebuilt for this (the factory is cheap and import-safe) so that a
    plugin's `gateway_embedder` is honoured exactly as the gateway's router honours it.
    """
    from gateway.plugins import get_plugin_manager
    from gateway.router.service import load_router_embedder

    try:
        manager, _ = get_plugin_manager(settings)
        return load_router_embedder(settings, manager)
    except Exception:  # noqa: BLE001 - boundary: a broken embedder leaves lexical search working
        logger.exception("openapi: the embedding model could not be loaded; searching operations with BM25 alone")
        return None


def build_router(operations: Sequence[Operation], embedder: Embedder | None, settings: Settings | None) -> Router:
    """A router over the operations. Blocking (embeds): call from a thread."""
    cache = None
    if embedder is not None and settings is not None:
        from gateway.router.cache import SqliteEmbeddingCache

        cache = SqliteEmbeddingCache(settings.data_dir / "openapi" / "embeddings.sqlite")
    router = Router(embedder, cache=cache)
    router.update([operation_record(op) for op in operations])
    return router
