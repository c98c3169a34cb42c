"""Mean-pooling sentence encoders run on their ONNX Runtime session directly.

fastembed wraps each call in generators, batching and dict building that cost about a
quarter of a millisecond per query, and pads every text of a batch to the longest one
after tokenizing the batch again. For the models whose output is the attention-masked
mean of the last hidden state (the bundled all-MiniLM-L6-v2 and the other
sentence-transformers models of that layout), `MeanPoolingEncoder` runs fastembed's own
session and tokenizer without that wrapper:

- a query is tokenized without padding, truncated to `max_query_tokens`, and run alone;
- documents are tokenized once, sorted by their number of word pieces (so that a batch
  is padded as little as possible) and run in batches, rows returned in input order.

The vectors are fastembed's, to float rounding (tests/test_embedder.py checks it).
`token_vectors` gives the hidden states before pooling, one unit vector per word piece,
which is what late interaction (ColBERT-style MaxSim) scores with; bench/router_rerank.py
measures it as a second stage.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.router.base import Matrix, Vector

__all__ = ["MeanPoolingEncoder", "fastembed_encoder"]


class MeanPoolingEncoder:
    """Embeds with an ONNX session whose first output is `(batch, tokens, dim)` hidden states.

    `tokenizer` is a `tokenizers.Tokenizer` (it is copied, not changed); `session` an
    `onnxruntime.InferenceSession` taking `input_ids`, `attention_mask` and, if the model
    has it, `token_type_ids`. Not thread-safe: the caller serializes calls.
    """

    def __init__(self, session: Any, tokenizer: Any, *, max_query_tokens: int) -> None:
        if max_query_tokens < 2:
            raise ValueError("max_query_tokens must be at least 2 (the special tokens)")
        self._session = session
        self._input_names = {i.name for i in session.get_inputs()}
        self._output_name = session.get_outputs()[0].name
        self._tokenizer = copy.deepcopy(tokenizer)
        self._tokenizer.no_padding()
        self._query_tokenizer = copy.deepcopy(self._tokenizer)
        self._query_tokenizer.enable_truncation(max_length=max_query_tokens)
        self.max_query_tokens = max_query_tokens

    def _run(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> Matrix:
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(self._session.run([self._output_name], feed)[0], dtype=np.float32)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), np.float32(1e-9))
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return np.asarray(pooled / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)

    def embed_query(self, text: str) -> Vector:
        """One text, unpadded, at most `max_query_tokens` word pieces (special tokens included)."""
        ids = np.asarray([self._query_tokenizer.encode(text).ids], dtype=np.int64)
        return self._run(ids, np.ones_like(ids))[0]

    def token_vectors(self, text: str, max_tokens: int) -> tuple[list[int], Matrix]:
        """The word pieces of `text` (at most `max_tokens`, special tokens included) and their
        hidden states, before pooling: one L2-normalized row per piece, without the special
        tokens ([CLS], [SEP]) that every text shares."""
        if max_tokens < 3:
            raise ValueError("max_tokens must be at least 3 (the special tokens and one word piece)")
        ids = self._tokenizer.encode(text).ids
        if len(ids) > max_tokens:
            ids = ids[: max_tokens - 1] + ids[-1:]
        array = np.asarray([ids], dtype=np.int64)
        feed = {"input_ids": array, "attention_mask": np.ones_like(array)}
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(array)
        hidden = np.asarray(self._session.run([self._output_name], feed)[0][0], dtype=np.float32)[1:-1]
        norms = np.linalg.norm(hidden, axis=1, keepdims=True)
        return ids[1:-1], np.asarray(hidden / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)

    def embed_documents(self, texts: Sequence[str], batch_size: int) -> Matrix:
        """Rows in input order; batches of texts with similar numbers of word pieces."""
        encoded = [e.ids for e in self._tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        dim: int | None = None
        rows: list[Matrix] = []
        for start in range(0, len(order), batch_size):
            batch = [encoded[i] for i in order[start : start + batch_size]]
            width = max(len(ids) for ids in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, piece_ids in enumerate(batch):
                ids[row, : len(piece_ids)] = piece_ids
                mask[row, : len(piece_ids)] = 1
            vectors = self._run(ids, mask)
            dim = vectors.shape[1]
            rows.append(vectors)
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        sorted_rows = np.vstack(rows)
        result = np.empty((len(order), dim or 0), dtype=np.float32)
        result[np.asarray(order, dtype=np.intp)] = sorted_rows
        return result


def fastembed_encoder(model: Any, max_query_tokens: int) -> MeanPoolingEncoder | None:
    """A direct encoder over a `fastembed.TextEmbedding`'s own session and tokenizer, if it is
    a mean-pooling model (fastembed's `PooledEmbedding`); None for any other kind.

    The caller knows that the model takes no query prefix (fastembed adds none for these)."""
    from fastembed.text.pooled_embedding import PooledEmbedding

    inner = getattr(model, "model", None)
    if not isinstance(inner, PooledEmbedding):
        return None
    if getattr(inner, "model", None) is None:
        inner.load_onnx_model()
    if inner.model is None or getattr(inner, "tokenizer", None) is None:
        return None
    return MeanPoolingEncoder(inner.model, inner.tokenizer, max_query_tokens=max_query_tokens)
