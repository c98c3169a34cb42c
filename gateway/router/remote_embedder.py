"""An `Embedder` over an OpenAI-compatible `/v1/embeddings` endpoint (issue 30).

Users who outgrow the bundled model often run one already: Ollama, vLLM,
text-embeddings-inference, Infinity, LiteLLM or OpenAI itself all serve
`POST /v1/embeddings {"model": ..., "input": [...]}`. `GATEWAY_EMBEDDING__URL` and
`GATEWAY_EMBEDDING__MODEL` point the router at one.

An endpoint can go away while the gateway serves. Every failure is raised as
`EmbeddingUnavailable`, which the router catches: a search is then ranked with BM25 alone
and the router's status says why (`Router.status`), never an error to the client. After a
failure the endpoint is not asked again for `retry_seconds`, so searches meanwhile do not
each wait for a timeout. A search's embedding has its own, shorter bound (`query_timeout`).

The model id in embedding-cache keys is `openai-embeddings:<model>/<dim>`: a switch of
backend or model is a miss, and so re-embeds (the URL is not part of it, so replicas reaching
one model by different addresses share a PostgreSQL cache).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx2
import numpy as np

from gateway.router.base import EmbeddingUnavailable, Matrix, Vector
from gateway.router.endpoints import EndpointError, endpoint_url, post_json

__all__ = ["EmbeddingUnavailable", "EndpointEmbedder"]


class EndpointEmbedder:
    """Embeds through an OpenAI-compatible embeddings endpoint; thread-safe.

    The vector size is learnt from the first answer (`dim` asks the endpoint once if need be).
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        request_batch: int = 64,
        timeout: float = 30.0,
        query_timeout: float = 2.0,
        retry_seconds: float = 30.0,
    ) -> None:
        if request_batch < 1:
            raise ValueError("request_batch must be at least 1")
        self.url = endpoint_url(url, "/embeddings")
        self.model = model
        self._key = api_key
        self._request_batch = request_batch
        self._timeout = timeout
        self._query_timeout = query_timeout
        self._retry_seconds = retry_seconds
        self._client = httpx2.Client(trust_env=False)
        self._dim: int | None = None
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._retry_at = 0.0

    # ------------------------------------------------------------------ the Embedder protocol

    @property
    def backend(self) -> str:
        """What `mcp-gateway eval` and the router's status name the backend by."""
        return f"openai-embeddings {self.model} at {self.url}"

    @property
    def model_id(self) -> str:
        return f"openai-embeddings:{self.model}/{self.dim}"

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._request(["dimension probe"], self._timeout)
        assert self._dim is not None
        return self._dim

    @property
    def batch_size(self) -> int:
        return self._request_batch

    @property
    def failure(self) -> str | None:
        """Why the last request failed (None once one succeeds again)."""
        return self._failure

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [
            self._request(texts[start : start + self._request_batch], self._timeout)
            for start in range(0, len(texts), self._request_batch)
        ]
        return np.vstack(parts)

    def embed_query(self, text: str) -> Vector:
        return self._request([text], self._query_timeout)[0]

    def embed_queries(self, texts: Sequence[str]) -> Matrix:
        """Several requests in one round trip (a long request's steps)."""
        return self._request(list(texts), self._query_timeout)

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"EndpointEmbedder({self.model!r} at {self.url!r})"

    # ------------------------------------------------------------------ requests

    def _request(self, texts: list[str], timeout: float) -> Matrix:
        now = time.monotonic()
        failure = self._failure
        if failure is not None and now < self._retry_at:
            raise EmbeddingUnavailable(failure)
        try:
            answer = post_json(
                self._client, self.url, {"model": self.model, "input": texts}, key=self._key, timeout=timeout
            )
            matrix = self._vectors(answer, len(texts))
        except EndpointError as e:
            with self._lock:
                self._failure = str(e)
                self._retry_at = time.monotonic() + self._retry_seconds
            raise EmbeddingUnavailable(str(e)) from e
        with self._lock:
            self._failure = None
        return matrix

    def _vectors(self, answer: Any, expected: int) -> Matrix:
        """The answer's vectors in input order, unit length; EndpointError for an answer of another shape."""
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or len(data) != expected:
            got = f"{len(data)} vectors" if isinstance(data, list) else "no `data` list"
            raise EndpointError(f"{self.url} answered {got} for {expected} texts")
        try:
            ordered = sorted(data, key=lambda item: int(item.get("index", 0)))
            matrix = np.asarray([item["embedding"] for item in ordered], dtype=np.float32)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise EndpointError(f"{self.url} answered vectors that are not lists of numbers ({e})") from e
        if matrix.ndim != 2 or matrix.shape[1] == 0:
            raise EndpointError(f"{self.url} answered vectors of shape {matrix.shape}")
        with self._lock:
            if self._dim is None:
                self._dim = int(matrix.shape[1])
            elif matrix.shape[1] != self._dim:
                raise EndpointError(
                    f"{self.url} answered {matrix.shape[1]}-dimensional vectors, not {self._dim} as before "
                    "(the model behind it changed; restart the gateway to re-embed)"
                )
        if not np.isfinite(matrix).all():
            raise EndpointError(f"{self.url} answered vectors with NaN or infinite values")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return np.asarray(matrix / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)
