"""The pure parts of the direct encoder (`gateway.router.pooling`): batching and session options."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from gateway.router.pooling import document_session_options, length_batches, padded


def test_texts_are_batched_by_length_shortest_first_and_equal_lengths_keep_their_order() -> None:
    lengths = [30, 5, 90, 5, 31, 88, 6]
    assert length_batches(lengths, 3) == [[1, 3, 6], [0, 4, 5], [2]]
    assert length_batches(lengths, 1) == [[1], [3], [6], [0], [4], [5], [2]]
    assert length_batches(lengths, 100) == [[1, 3, 6, 0, 4, 5, 2]]
    assert length_batches([], 8) == []


def test_every_text_is_in_exactly_one_batch_of_at_most_the_batch_size() -> None:
    lengths = [int(n) for n in np.random.default_rng(0).integers(3, 130, 257)]
    for size in (1, 4, 8, 64):
        batches = length_batches(lengths, size)
        assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
        assert all(0 < len(batch) <= size for batch in batches)
        widths = [max(lengths[i] for i in batch) for batch in batches]
        assert widths == sorted(widths)


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        length_batches([3, 4], 0)


def test_a_batch_is_padded_with_zeros_to_its_longest_text_and_masked() -> None:
    ids, mask = padded([[101, 7, 102], [101, 102], [101, 8, 9, 10, 102]])
    assert ids.dtype == mask.dtype == np.int64
    assert ids.tolist() == [[101, 7, 102, 0, 0], [101, 102, 0, 0, 0], [101, 8, 9, 10, 102]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_the_document_session_runs_each_batch_on_one_thread_with_every_graph_optimization() -> None:
    options = document_session_options()
    assert options.intra_op_num_threads == 1
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
