"""How a vector is stored in an embedding cache row: one format for the SQLite and PostgreSQL backends.

Vectors are stored as little-endian float32 bytes with their dimension, and come back bit-for-bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gateway.router.base import Vector

__all__ = ["vector_of", "vector_rows"]

_DTYPE = np.dtype("<f4")


def vector_rows(items: Mapping[str, Vector]) -> list[tuple[str, int, bytes]]:
    """`(key, dim, little-endian float32 bytes)` rows to store, for every cache backend."""
    rows = []
    for key, vector in items.items():
        array = np.ascontiguousarray(vector, dtype=_DTYPE).reshape(-1)
        rows.append((key, int(array.shape[0]), array.tobytes()))
    return rows


def vector_of(dim: object, blob: object) -> Vector | None:
    """A stored row's vector; None for a row that is not what `vector_rows` writes (skipped as a miss)."""
    data = bytes(blob) if isinstance(blob, bytes | bytearray | memoryview) else None
    if data is None or not isinstance(dim, int) or len(data) != dim * _DTYPE.itemsize:
        return None
    return np.frombuffer(data, dtype=_DTYPE).astype(np.float32)
