"""One immutable state of the router's index (`Snapshot`): the tools, their vectors and BM25 terms.

Apart from `Router` (`gateway.router.index`), which builds a new one on each update and swaps it in
with one assignment, so searches on other threads read a whole state and never a half-built one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gateway.router.base import Matrix, ToolRecord
from gateway.router.bm25 import BM25Index

__all__ = ["Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """One immutable state of the index; rows are in name order."""

    records: tuple[ToolRecord, ...] = ()
    names: tuple[str, ...] = ()
    matrix: Matrix | None = None
    """The vectors searched: short and full text blended, or the short text alone while
    the tool's full text has no vector yet."""
    short_matrix: Matrix | None = None
    """The vectors of the short texts (`dense_document`)."""
    full_keys: tuple[str, ...] = ()
    """Per row, the cache key of the full text (empty without `full_document_weight`)."""
    full_texts: tuple[str, ...] = ()
    blended: int = 0
    """How many rows of `matrix` have their full text's vector in them."""
    bm25: BM25Index = field(default_factory=BM25Index)
    server_of: npt.NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    """Row -> index of the tool's server (only with `server_weight`)."""
    server_matrix: Matrix | None = None
    server_bm25: BM25Index | None = None
    row_of: dict[str, int] = field(default_factory=dict)
    """Tool name -> row."""
