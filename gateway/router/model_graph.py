"""Keep a quantized embedding table quantized in memory: one rewrite of an ONNX graph, on its bytes.

The bundled model stores its weights as int8 with a float scale per row, dequantized in the
graph (`Cast` to float, `Mul` by the scale). ONNX Runtime folds those constants when it loads
the model, so the word-embedding table (30,522 × 384) is held as 47 MB of float32 for the
process's life, of which a text uses a few rows. `gather_before_dequantize` reorders
`Gather(Mul(Cast(q), scale), ids)` into `Mul(Cast(Gather(q, ids)), Gather(scale, ids))`: the
table stays int8 (12 MB) and only the rows of a text's word pieces are dequantized, each
element by the same float operations as before, so the vectors are bit for bit the same
(tests/test_model_graph.py checks it).

The rewrite reads and writes protobuf's wire format directly (ModelProto field 7 is the graph,
GraphProto field 1 a node, NodeProto fields 1/2/3/4 inputs, outputs, name, op type): the
`onnx` package is not a dependency. Anything it does not recognise is left as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["gather_before_dequantize"]

_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_VALUE_INFO = 1, 5, 13
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP = 1, 2, 3, 4
_TENSOR_NAME = 8
_VALUE_INFO_NAME = 1
_LENGTH_DELIMITED = 2


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


def _rewrite_graph(graph: bytes) -> bytes | None:
    """The graph with every dequantized table gathered before dequantizing; None if none is."""
    items = list(_fields(graph))
    nodes = {i: _Node.parse(value) for i, (number, value, _) in enumerate(items) if number == _GRAPH_NODE}
    initializers = set()
    for number, value, _ in items:
        if number == _GRAPH_INITIALIZER:
            initializers |= {v.decode() for n, v, _ in _fields(value) if n == _TENSOR_NAME}
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for i, node in nodes.items():
        for name in node.inputs:
            consumers.setdefault(name, []).append(i)
        for name in node.outputs:
            producer[name] = i
    replaced: dict[int, bytes] = {}
    removed_names: set[str] = set()
    for g, gather in nodes.items():
        if gather.op != "Gather" or len(gather.inputs) != 2:
            continue
        table, ids = gather.inputs
        m = producer.get(table)
        if m is None or nodes[m].op != "Mul" or len(nodes[m].inputs) != 2 or consumers.get(table) != [g]:
            continue
        cast_output, scale = nodes[m].inputs
        c = producer.get(cast_output)
        if c is None or nodes[c].op != "Cast" or consumers.get(cast_output) != [m]:
            continue
        quantized = nodes[c].inputs[0]
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
