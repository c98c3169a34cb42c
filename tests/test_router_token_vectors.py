"""The bundled model's word-piece vectors before pooling (`MeanPoolingEncoder.token_vectors`),
which late interaction scores with (bench/router_rerank.py measures it as a second stage)."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.router.embedder import FastEmbedEmbedder


def test_one_unit_vector_per_word_piece_without_the_special_tokens(embedder: FastEmbedEmbedder) -> None:
    ids, vectors = embedder.token_vectors("Get the weather forecast for a city", 64)
    assert len(ids) == vectors.shape[0] == 7  # get the weather forecast for a city: one piece each
    assert vectors.shape[1] == embedder.dim and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    again_ids, again = embedder.token_vectors("Get the weather forecast for a city", 64)
    assert again_ids == ids
    np.testing.assert_array_equal(again, vectors)  # deterministic


def test_a_long_text_is_cut_at_max_tokens_special_tokens_included(embedder: FastEmbedEmbedder) -> None:
    ids, vectors = embedder.token_vectors("list the files in a directory " * 40, 20)
    assert len(ids) == vectors.shape[0] == 18


def test_the_vectors_are_read_in_context_not_one_per_word(embedder: FastEmbedEmbedder) -> None:
    river_ids, river = embedder.token_vectors("walk along the river bank", 16)
    money_ids, money = embedder.token_vectors("open a savings account at the bank", 16)
    assert river_ids[-1] == money_ids[-1]  # the same word piece, "bank"
    assert float(river[-1] @ money[-1]) < 0.9


def test_max_tokens_under_three_is_refused(embedder: FastEmbedEmbedder) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        embedder.token_vectors("weather", 2)
