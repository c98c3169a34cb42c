"""The direct encoder (`gateway.router.pooling`): batching, session options, the query cut, the arena's shrinking."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from gateway.router.bundled_model import ASSETS_DIR, default_model_source
from gateway.router.pooling import (
    ARENA_KEEP_TOKENS,
    ARENA_SHRINKAGE,
    MeanPoolingEncoder,
    cut_ids,
    document_session_options,
    drop_model_bytes,
    length_batches,
    open_session,
    padded,
    session_options,
)


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


def test_a_session_has_the_threads_asked_for_and_fastembeds_optimizations() -> None:
    options = session_options(3)
    assert options.intra_op_num_threads == options.inter_op_num_threads == 3
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert session_options(None).intra_op_num_threads == 0  # ONNX Runtime's default: every core


def test_a_query_is_cut_as_the_truncating_tokenizer_cuts_it() -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ASSETS_DIR / "tokenizer.json"))
    tokenizer.no_padding()
    text = "find the weather forecast for tomorrow in paris and translate it into german, then email it"
    for max_tokens in range(3, 30):
        truncating = Tokenizer.from_file(str(ASSETS_DIR / "tokenizer.json"))
        truncating.no_padding()
        truncating.enable_truncation(max_length=max_tokens)
        assert cut_ids(tokenizer.encode(text).ids, max_tokens) == truncating.encode(text).ids
    assert cut_ids([101, 7, 102], 8) == [101, 7, 102]


class _Recording:
    """A real ONNX Runtime session that records the run options of each run."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.shrinks: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def run(self, names: Any, feed: Any, options: Any = None) -> Any:
        self.shrinks.append(options is not None and options.get_run_config_entry(ARENA_SHRINKAGE) == "cpu:0")
        return self._session.run(names, feed, options)


def test_the_arena_of_the_session_that_ran_large_batches_is_shrunk_after_them_and_not_after_small_ones() -> None:
    from tokenizers import Tokenizer

    model = default_model_source()
    main = _Recording(open_session(model, session_options(1)))
    documents = _Recording(open_session(model, document_session_options()))
    encoder = MeanPoolingEncoder(
        main, Tokenizer.from_file(str(ASSETS_DIR / "tokenizer.json")), max_query_tokens=16, document_session=documents
    )
    texts = [f"tool {i}: " + "read the records of a table " * (3 * (i % 5) + 12) for i in range(12)]
    assert min(len(ids) for ids in encoder.tokenize_documents(texts)) * 4 > ARENA_KEEP_TOKENS
    one_at_a_time = encoder.embed_documents(texts, 4)
    assert main.shrinks == [False, False, False, True] and documents.shrinks == []
    in_bulk = encoder.embed_documents(texts, 4, workers=2)
    assert documents.shrinks == [False, False, False, True] and main.shrinks[4:] == []
    np.testing.assert_array_equal(one_at_a_time, in_bulk)
    encoder.embed_query("read the records")
    encoder.embed_documents(["read a file", "write a file"], 4)  # 2 x 5 word pieces: the arena is kept
    assert main.shrinks[4:] == [False, False]


def test_the_shipped_tokenizer_is_read_as_fastembed_reads_it() -> None:
    """`load_tokenizer` (no fastembed import) gives fastembed's word pieces: truncated at 512,
    special tokens kept whole, no padding."""
    from fastembed.common.preprocessor_utils import load_tokenizer as fastembed_tokenizer

    from gateway.router.pooling import load_tokenizer

    ours = load_tokenizer(ASSETS_DIR)
    theirs, _ = fastembed_tokenizer(ASSETS_DIR)
    theirs.no_padding()
    texts = ["Create a GitHub issue", "天气预报 for [MASK] Zürich", "x " * 2000, "", "[CLS] [SEP] [PAD] [UNK]"]
    assert [e.ids for e in ours.encode_batch(texts)] == [e.ids for e in theirs.encode_batch(texts)]
    assert len(ours.encode(texts[2]).ids) == 512
    assert ours.padding is None


def test_an_opened_session_does_not_keep_the_model_bytes_and_embeds_as_one_that_does() -> None:
    """ONNX Runtime's Python session keeps the bytes it was made from (23 MB for the bundled model)
    only to be made again by `set_providers`: `open_session` lets them go, and the vectors stay."""
    from gateway.router.model_graph import gather_before_dequantize
    from gateway.router.pooling import load_tokenizer

    model = default_model_source()
    ours = open_session(model, session_options(1))
    assert getattr(ours, "_model_bytes", None) is None
    model_bytes = gather_before_dequantize(model.read_bytes())
    theirs = ort.InferenceSession(model_bytes, sess_options=session_options(1), providers=["CPUExecutionProvider"])
    del model_bytes
    assert len(theirs._model_bytes) > 20_000_000  # what is let go (if ONNX Runtime stops keeping it, this says so)
    texts = ["Create a GitHub issue", "list the open pull requests of a repository"]
    vectors = [
        MeanPoolingEncoder(session, load_tokenizer(ASSETS_DIR), max_query_tokens=16).embed_documents(texts, 8)
        for session in (ours, theirs)
    ]
    np.testing.assert_array_equal(vectors[0], vectors[1])
    assert drop_model_bytes(theirs) and not drop_model_bytes(theirs)
    np.testing.assert_array_equal(
        MeanPoolingEncoder(theirs, load_tokenizer(ASSETS_DIR), max_query_tokens=16).embed_documents(texts, 8),
        vectors[0],
    )
