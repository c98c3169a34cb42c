"""The bundled model's weights stay int8 in memory (`gateway.router.model_graph`): the embedding
table with the same vectors, the matrix weights on int8 kernels with vectors close to float32's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gateway.router.bundled_model import default_model_source
from gateway.router.model_graph import gather_before_dequantize, int8_matmuls

TABLE = "inner.embeddings.word_embeddings.weight"


@pytest.fixture(scope="module")
def model() -> bytes:
    return default_model_source().read_bytes()


def _session(model: bytes, optimized: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # ORT warns that an optimized model it writes is for this machine
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


def test_the_rewritten_model_gives_the_same_hidden_states_bit_for_bit(model: bytes) -> None:
    rewritten = gather_before_dequantize(model)
    assert rewritten != model
    before, after = _session(model), _session(rewritten)
    rng = np.random.default_rng(7)
    for shape in [(1, 2), (1, 13), (4, 40)]:
        ids = rng.integers(0, 30522, size=shape).astype(np.int64)
        ids[:, 0] = 30521  # the table's last row too
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        assert np.array_equal(before.run(None, feed)[0], after.run(None, feed)[0])


def test_onnx_runtime_no_longer_holds_the_table_in_float32(model: bytes, tmp_path: Path) -> None:
    """What ORT keeps is what it would write as its optimized model: the table folded to float32
    (47 MB) before, the int8 table (12 MB) after."""
    _session(model, tmp_path / "before.onnx")
    _session(gather_before_dequantize(model), tmp_path / "after.onnx")
    before, after = (tmp_path / "before.onnx").stat().st_size, (tmp_path / "after.onnx").stat().st_size
    assert before - after > 30_000_000
    assert f"{TABLE}_rows_q".encode() in (tmp_path / "after.onnx").read_bytes()


def test_a_model_without_a_dequantized_table_is_left_as_it_is(model: bytes) -> None:
    once = gather_before_dequantize(model)
    assert gather_before_dequantize(once) == once  # nothing left to rewrite
    assert gather_before_dequantize(b"") == b""


def test_bytes_that_are_not_a_model_are_refused() -> None:
    with pytest.raises(ValueError, match="runs past the end"):
        gather_before_dequantize(b"\x3a\xff\xff\xff\xff\x0f")  # field 7, a length past the end
    with pytest.raises(ValueError, match="unsupported protobuf wire type 7"):
        gather_before_dequantize(b"\x0f\x0f")
    with pytest.raises(ValueError, match="not an ONNX model"):
        gather_before_dequantize(b"\x3a")  # a key and nothing after it


def _pooled(session: ort.InferenceSession, ids: np.ndarray) -> np.ndarray:
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    pooled = session.run(None, feed)[0].mean(axis=1)
    return np.asarray(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))


def test_int8_matmuls_give_vectors_close_to_the_float32_run(model: bytes) -> None:
    float32 = gather_before_dequantize(model)
    int8 = int8_matmuls(float32)
    assert int8 != float32 and b"MatMulNBits" in int8 and b"com.microsoft" in int8
    before, after = _session(float32), _session(int8)
    ids = np.random.default_rng(11).integers(1000, 30522, size=(3, 24)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    cosines = (_pooled(before, ids) * _pooled(after, ids)).sum(axis=1)
    assert cosines.min() > 0.999
    assert not np.array_equal(_pooled(before, ids), _pooled(after, ids))  # hence another model id


def test_int8_matmuls_keep_the_matrix_weights_int8(model: bytes, tmp_path: Path) -> None:
    """36 matrices of 384 x 384 to 384 x 1536: 42 MB as float32, 11 MB as int8."""
    float32 = gather_before_dequantize(model)
    _session(float32, tmp_path / "before.onnx")
    _session(int8_matmuls(float32), tmp_path / "after.onnx")
    before, after = (tmp_path / "before.onnx").stat().st_size, (tmp_path / "after.onnx").stat().st_size
    assert before - after > 25_000_000


def test_int8_matmuls_leave_a_model_without_them_as_it_is(model: bytes) -> None:
    once = int8_matmuls(model)
    assert int8_matmuls(once) == once
    assert int8_matmuls(b"") == b""
    with pytest.raises(ValueError, match="power of two"):
        int8_matmuls(model, block_size=48)
    with pytest.raises(ValueError, match="not an ONNX model"):
        int8_matmuls(b"\x3a")
