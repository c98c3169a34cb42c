"""Keep a quantized model's weights quantized in memory: two rewrites of an ONNX graph, on its bytes.

The bundled model stores its weights as int8 with a float scale per row, dequantized in the
graph (`Cast` to float, `Mul` by the scale). ONNX Runtime folds those constants when it loads
the model, so the word-embedding table (30,522 × 384) is held as 47 MB of float32 for the
process's life, of which a text uses a few rows. `gather_before_dequantize` reorders
`Gather(Mul(Cast(q), scale), ids)` into `Mul(Cast(Gather(q, ids)), Gather(scale, ids))`: the
table stays int8 (12 MB) and only the rows of a text's word pieces are dequantized, each
element by the same float operations as before, so the vectors are bit for bit the same
(tests/test_model_graph.py checks it).

The matrix weights (36 of them, 42 MB as float32) are folded the same way. `int8_matmuls` replaces
`MatMul(x, Mul(Cast(q), scale))` (q int8 `[K, N]`, one scale per column) by ONNX Runtime's
`MatMulNBits` with 8-bit weights (its `com.microsoft` domain): the same int8 values and scales,
held as 11 MB and multiplied by int8 kernels (`accuracy_level` 4: `x` quantized per block of
`block_size` values as it is multiplied). The vectors then differ from the float32 run's in the
third or fourth digit (cosine 0.999 to 0.9998 measured), so an embedder that uses it has another
model id (`gateway.router.bundled_model.DEFAULT_EMBEDDER_ID`): cached vectors are never mixed.

The rewrites read and write protobuf's wire format directly (ModelProto field 7 is the graph,
GraphProto field 1 a node, NodeProto fields 1/2/3/4 inputs, outputs, name, op type): the
`onnx` package is not a dependency. Anything it does not recognise is left as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["MATMUL_BLOCK_SIZE", "gather_before_dequantize", "int8_matmuls"]

_MODEL_GRAPH, _MODEL_OPSET_IMPORT = 7, 8
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_VALUE_INFO = 1, 5, 13
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP, _NODE_ATTRIBUTE, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_RAW = 1, 2, 8, 9
_FLOAT, _UINT8, _INT8 = 1, 2, 3  # TensorProto.DataType
_ATTRIBUTE_NAME, _ATTRIBUTE_INT, _ATTRIBUTE_TYPE, _ATTRIBUTE_TYPE_INT = 1, 3, 20, 2
_OPSET_DOMAIN, _OPSET_VERSION = 1, 2
_VALUE_INFO_NAME = 1
_VARINT, _LENGTH_DELIMITED = 0, 2
_MICROSOFT = "com.microsoft"

MATMUL_BLOCK_SIZE = 32
"""Values of `x` quantized together by `MatMulNBits`'s int8 kernels (a power of two dividing K, at
least 16). Over 43 texts, cosine to float32 at worst 0.99969 (0.99982 with 16, 0.99897 with 128);
on the dev sets 32 kept recall closest (docs/benchmarks.md, "Memory")."""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """(field number, value of a length-delimited field or b"", the field's raw bytes) of a message."""
    i = 0
    while i < len(data):
        start = i
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value = b""
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == _LENGTH_DELIMITED:
            length, i = _varint(data, i)
            value = data[i : i + length]
            i += length
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > len(data):
            raise ValueError(f"a field runs past the end of its message ({i} > {len(data)} bytes)")
        yield number, value, data[start:i]


def _field(number: int, value: bytes) -> bytes:
    return _encode_varint(number << 3 | _LENGTH_DELIMITED) + _encode_varint(len(value)) + value


def _int_field(number: int, value: int) -> bytes:
    return _encode_varint(number << 3 | _VARINT) + _encode_varint(value)


@dataclass
class _Tensor:
    """An initializer's name, shape, element type and raw bytes (None if not stored as raw_data)."""

    name: str
    dims: list[int]
    dtype: int
    raw: bytes | None

    @classmethod
    def parse(cls, message: bytes) -> _Tensor:
        name, dims, dtype, raw = "", [], 0, None
        i = 0
        while i < len(message):
            key, i = _varint(message, i)
            number, wire = key >> 3, key & 7
            if wire == _VARINT:
                value, i = _varint(message, i)
                if number == _TENSOR_DIMS:
                    dims.append(value)
                elif number == _TENSOR_TYPE:
                    dtype = value
                continue
            if wire != _LENGTH_DELIMITED:
                i += 8 if wire == 1 else 4 if wire == 5 else len(message)
                continue
            length, i = _varint(message, i)
            data, i = message[i : i + length], i + length
            if number == _TENSOR_NAME:
                name = data.decode()
            elif number == _TENSOR_RAW:
                raw = data
            elif number == _TENSOR_DIMS:  # packed
                j = 0
                while j < len(data):
                    value, j = _varint(data, j)
                    dims.append(value)
        return cls(name, dims, dtype, raw)

    def encode(self) -> bytes:
        assert self.raw is not None
        head = b"".join(_int_field(_TENSOR_DIMS, d) for d in self.dims) + _int_field(_TENSOR_TYPE, self.dtype)
        return head + _field(_TENSOR_NAME, self.name.encode()) + _field(_TENSOR_RAW, self.raw)


@dataclass
class _Node:
    raw: bytes
    op: str
    inputs: list[str]
    outputs: list[str]

    @classmethod
    def parse(cls, raw: bytes) -> _Node:
        op, inputs, outputs = "", [], []
        for number, value, _ in _fields(raw):
            if number == _NODE_OP:
                op = value.decode()
            elif number == _NODE_INPUT:
                inputs.append(value.decode())
            elif number == _NODE_OUTPUT:
                outputs.append(value.decode())
        return cls(raw, op, inputs, outputs)

    def with_names(self, inputs: list[str], outputs: list[str], name: str | None = None) -> bytes:
        """This node's bytes with other inputs and outputs (and name); its attributes kept."""
        head = b"".join(_field(_NODE_INPUT, n.encode()) for n in inputs)
        head += b"".join(_field(_NODE_OUTPUT, n.encode()) for n in outputs)
        rest = b""
        for number, _, raw in _fields(self.raw):
            if number in (_NODE_INPUT, _NODE_OUTPUT):
                continue
            rest += _field(_NODE_NAME, name.encode()) if number == _NODE_NAME and name is not None else raw
        return head + rest


def _wiring(nodes: dict[int, _Node]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """The nodes reading each tensor, and the node writing it."""
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for i, node in nodes.items():
        for name in node.inputs:
            consumers.setdefault(name, []).append(i)
        for name in node.outputs:
            producer[name] = i
    return consumers, producer


def _dequantized(
    name: str, reader: int, nodes: dict[int, _Node], consumers: dict[str, list[int]], producer: dict[str, int]
) -> tuple[int, int, str, str, str] | None:
    """If tensor `name`, read by node `reader` alone, is `Mul(Cast(q), scale)`: the Mul's and the Cast's
    nodes, the Cast's output, q and scale."""
    m = producer.get(name)
    if m is None or nodes[m].op != "Mul" or len(nodes[m].inputs) != 2 or consumers.get(name) != [reader]:
        return None
    cast_output, scale = nodes[m].inputs
    c = producer.get(cast_output)
    if c is None or nodes[c].op != "Cast" or consumers.get(cast_output) != [m]:
        return None
    return m, c, cast_output, nodes[c].inputs[0], scale


def _rewrite_graph(graph: bytes) -> bytes | None:
    """The graph with every dequantized table gathered before dequantizing; None if none is."""
    items = list(_fields(graph))
    nodes = {i: _Node.parse(value) for i, (number, value, _) in enumerate(items) if number == _GRAPH_NODE}
    initializers = set()
    for number, value, _ in items:
        if number == _GRAPH_INITIALIZER:
            initializers |= {v.decode() for n, v, _ in _fields(value) if n == _TENSOR_NAME}
    consumers, producer = _wiring(nodes)
    replaced: dict[int, bytes] = {}
    removed_names: set[str] = set()
    for g, gather in nodes.items():
        if gather.op != "Gather" or len(gather.inputs) != 2:
            continue
        table, ids = gather.inputs
        found = _dequantized(table, g, nodes, consumers, producer)
        if found is None:
            continue
        m, c, cast_output, quantized, scale = found
        if quantized not in initializers or scale not in initializers:
            continue
        rows_q, rows_scale, rows_f = f"{table}_rows_q", f"{table}_rows_scale", f"{table}_rows_f"
        replaced[c] = replaced[m] = b""
        replaced[g] = b"".join(
            _field(_GRAPH_NODE, node)
            for node in (
                gather.with_names([quantized, ids], [rows_q], f"{table}_gather_q"),
                gather.with_names([scale, ids], [rows_scale], f"{table}_gather_scale"),
                nodes[c].with_names([rows_q], [rows_f]),
                nodes[m].with_names([rows_f, rows_scale], gather.outputs),
            )
        )
        removed_names |= {table, cast_output}
    if not replaced:
        return None
    out = []
    for i, (number, value, raw) in enumerate(items):
        if i in replaced:
            out.append(replaced[i])
        elif number == _GRAPH_VALUE_INFO and any(
            n == _VALUE_INFO_NAME and v.decode() in removed_names for n, v, _ in _fields(value)
        ):
            continue  # the shape of a tensor that is no longer computed
        else:
            out.append(raw)
    return b"".join(out)


def _int_attribute(name: str, value: int) -> bytes:
    return _field(
        _NODE_ATTRIBUTE,
        _field(_ATTRIBUTE_NAME, name.encode())
        + _int_field(_ATTRIBUTE_INT, value)
        + _int_field(_ATTRIBUTE_TYPE, _ATTRIBUTE_TYPE_INT),
    )


def _matmul_nbits(
    x: str, weights: tuple[_Tensor, _Tensor], output: list[str], name: str, block: int
) -> tuple[bytes, list[_Tensor]]:
    """A `MatMulNBits` node of `x` and the int8 weights `q` `[K, N]` with a scale per column, and its
    two initializers: the weights transposed to `[N, K / block, block]`, offset by 128 into uint8 (its
    default zero point for 8 bits: the same values), and each column's scale once per block."""
    import numpy as np

    q, scale = weights
    k, n = q.dims
    assert q.raw is not None and scale.raw is not None
    values = np.frombuffer(q.raw, dtype=np.int8).reshape(k, n).T.astype(np.int16) + 128
    packed = _Tensor(f"{name}_b", [n, k // block, block], _UINT8, values.astype(np.uint8).tobytes())
    scales = np.repeat(np.frombuffer(scale.raw, dtype=np.float32), k // block)
    per_block = _Tensor(f"{name}_scales", [n * (k // block)], _FLOAT, scales.astype(np.float32).tobytes())
    node = b"".join(_field(_NODE_INPUT, i.encode()) for i in (x, packed.name, per_block.name))
    node += b"".join(_field(_NODE_OUTPUT, o.encode()) for o in output)
    node += (
        _field(_NODE_NAME, name.encode()) + _field(_NODE_OP, b"MatMulNBits") + _field(_NODE_DOMAIN, _MICROSOFT.encode())
    )
    for attribute, value in (("K", k), ("N", n), ("bits", 8), ("block_size", block), ("accuracy_level", 4)):
        node += _int_attribute(attribute, value)
    return node, [packed, per_block]


def _matmuls_graph(graph: bytes, block: int) -> bytes | None:
    """The graph with every `MatMul` of dequantized int8 weights made a `MatMulNBits`; None if none is."""
    items = list(_fields(graph))
    nodes = {i: _Node.parse(value) for i, (number, value, _) in enumerate(items) if number == _GRAPH_NODE}
    tensors = {
        t.name: (i, t)
        for i, (number, value, _) in enumerate(items)
        if number == _GRAPH_INITIALIZER
        for t in [_Tensor.parse(value)]
    }
    consumers, producer = _wiring(nodes)
    replaced: dict[int, bytes] = {}
    removed_names: set[str] = set()
    added: list[_Tensor] = []
    for i, matmul in nodes.items():
        if matmul.op != "MatMul" or len(matmul.inputs) != 2:
            continue
        x, weight = matmul.inputs
        found = _dequantized(weight, i, nodes, consumers, producer)
        if found is None:
            continue
        m, c, cast_output, quantized, scale_name = found
        q, scale = tensors.get(quantized), tensors.get(scale_name)
        if q is None or scale is None or consumers.get(q[1].name) != [c] or consumers.get(scale_name) != [m]:
            continue
        (qi, qt), (si, st) = q, scale
        if qt.dtype != _INT8 or st.dtype != _FLOAT or qt.raw is None or st.raw is None or len(qt.dims) != 2:
            continue
        k, n = qt.dims
        if st.dims not in ([1, n], [n]) or k % block or len(qt.raw) != k * n or len(st.raw) != 4 * n:
            continue
        new_node, initializers = _matmul_nbits(x, (qt, st), matmul.outputs, f"{weight}_int8_matmul", block)
        replaced[i], replaced[m], replaced[c], replaced[qi], replaced[si] = (
            _field(_GRAPH_NODE, new_node),
            b"",
            b"",
            b"",
            b"",
        )
        added += initializers
        removed_names |= {weight, cast_output}
    if not replaced:
        return None
    out = [
        replaced.get(i, raw)
        for i, (number, value, raw) in enumerate(items)
        if not (
            number == _GRAPH_VALUE_INFO
            and any(n == _VALUE_INFO_NAME and v.decode() in removed_names for n, v, _ in _fields(value))
        )
    ]
    return b"".join(out) + b"".join(_field(_GRAPH_INITIALIZER, t.encode()) for t in added)


def int8_matmuls(model: bytes, block_size: int = MATMUL_BLOCK_SIZE) -> bytes:
    """The ONNX model `model` with each `MatMul` of int8 weights dequantized by column
    (`MatMul(x, Mul(Cast(q), scale))`, q and scale initializers) run as ONNX Runtime's int8
    `MatMulNBits`, and the `com.microsoft` operator set imported; the same bytes if it has none.
    Its outputs are close to, not the same as, the float32 run's. Raises ValueError for bytes that
    are not a protobuf message."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError("block_size must be a power of two, at least 16")
    try:
        items = list(_fields(model))
        rewritten = None
        out = []
        imports_microsoft = False
        for number, value, raw in items:
            if number == _MODEL_GRAPH and rewritten is None:
                rewritten = _matmuls_graph(value, block_size)
                out.append(_field(_MODEL_GRAPH, rewritten) if rewritten is not None else raw)
            else:
                imports_microsoft |= number == _MODEL_OPSET_IMPORT and any(
                    n == _OPSET_DOMAIN and v == _MICROSOFT.encode() for n, v, _ in _fields(value)
                )
                out.append(raw)
    except (IndexError, UnicodeDecodeError) as e:
        raise ValueError(f"not an ONNX model ({type(e).__name__}: {e})") from e
    if rewritten is None:
        return model
    if not imports_microsoft:
        out.append(
            _field(_MODEL_OPSET_IMPORT, _field(_OPSET_DOMAIN, _MICROSOFT.encode()) + _int_field(_OPSET_VERSION, 1))
        )
    return b"".join(out)


def gather_before_dequantize(model: bytes) -> bytes:
    """The ONNX model `model` (a serialized ModelProto) with each table that is dequantized and then
    gathered (`Gather(Mul(Cast(q), scale), ids)`, q and scale initializers) gathered first; the
    same bytes if it has none. Raises ValueError for bytes that are not a protobuf message."""
    try:
        items = list(_fields(model))
        rewritten = None
        out = []
        for number, value, raw in items:
            if number == _MODEL_GRAPH and rewritten is None:
                rewritten = _rewrite_graph(value)
                out.append(_field(_MODEL_GRAPH, rewritten) if rewritten is not None else raw)
            else:
                out.append(raw)
    except (IndexError, UnicodeDecodeError) as e:
        raise ValueError(f"not an ONNX model ({type(e).__name__}: {e})") from e
    return b"".join(out) if rewritten is not None else model
