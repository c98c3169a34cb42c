"""Mean-pooling sentence encoders run on their ONNX Runtime session directly.

fastembed wraps each call in generators, batching and dict building that cost about a
quarter of a millisecond per query, and pads every text of a batch to the longest one
after tokenizing the batch again. For the models whose output is the attention-masked
mean of the last hidden state (the bundled all-MiniLM-L6-v2 and the other
sentence-transformers models of that layout), `MeanPoolingEncoder` runs a session and a
tokenizer opened as fastembed opens them (`fastembed_encoder`), without that wrapper:

- a query is tokenized without padding, truncated to `max_query_tokens`, and run alone;
- documents are tokenized once, sorted by their number of word pieces (so that a batch
  is padded as little as possible) and run in batches, rows returned in input order.

The vectors are fastembed's, to float rounding (tests/test_embedder.py checks it).
`token_vectors` gives the hidden states before pooling, one unit vector per word piece,
which is what late interaction (ColBERT-style MaxSim) scores with; bench/router_rerank.py
measures it as a second stage.

Memory (docs/benchmarks.md, "Memory"): ONNX Runtime keeps what a run allocated in its arena for
the next run, so one batch of long texts would hold some 170 MB for good; after a call with a
large batch (`ARENA_KEEP_TOKENS`) the arena of the session that ran it is shrunk (`shrink_arena`). One tokenizer serves
documents and queries (a query's word pieces are cut as the truncating tokenizer would), and the
sessions are opened here (`open_session`), so fastembed loads neither a session nor a tokenizer
of its own for these models.

Documents in bulk (many batches) can run on a second session with one thread, by several
worker threads at once (`document_session`, `document_session_options`): on 2 cores two
single-threaded runs side by side embed the texts of 2,500 tools in about 0.83 of the time of
one two-threaded run at a time, and they slow down less when another process takes
a core, since no run waits at a barrier for a thread that lost its core
(`bench/router_cold_build.py`; docs/benchmarks.md, "Start-up"). The vectors are the same: a text's
vector does not depend on its batch, its padding or the number of threads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.router.base import Matrix, Vector
from gateway.router.model_graph import gather_before_dequantize, int8_matmuls

logger = logging.getLogger(__name__)

__all__ = [
    "ARENA_KEEP_TOKENS",
    "ARENA_SHRINKAGE",
    "MeanPoolingEncoder",
    "cut_ids",
    "document_session",
    "document_session_options",
    "drop_model_bytes",
    "fastembed_encoder",
    "length_batches",
    "load_tokenizer",
    "mean_pooling_encoder",
    "open_session",
    "padded",
    "session_options",
    "shrink_arena",
]

ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"
"""ONNX Runtime's run option that frees, at the end of a run, the arena's chunks no run holds."""

ARENA_KEEP_TOKENS = 256
"""Padded word pieces of a batch (its texts times its longest) up to which the arena is kept after
a call: measured on the bundled model, a batch grows it by 6 MB at 1 x 128, 9 MB at 8 x 32,
22 MB at 8 x 64, 56 MB at 8 x 128, 169 MB at 8 x 256. Kept, the next call reuses it."""


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """The indexes of texts of these lengths in batches of at most `batch_size`, shortest first.

    A batch is padded to its longest text, so texts of similar lengths go together; equal
    lengths keep their input order (the sort is stable), so the plan is deterministic."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def padded(batch: Sequence[Sequence[int]]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Token ids padded with 0 to the longest row, and the attention mask (1 over real tokens)."""
    width = max((len(ids) for ids in batch), default=0)
    ids = np.zeros((len(batch), width), dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    for row, piece_ids in enumerate(batch):
        ids[row, : len(piece_ids)] = piece_ids
        mask[row, : len(piece_ids)] = 1
    return ids, mask


def session_options(threads: int | None) -> Any:
    """ONNX Runtime options of a session: every graph optimization and, if given, `threads` for
    both thread pools, as fastembed sets them for its own sessions (the vectors are the same)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
    return options


def document_session_options() -> Any:
    """ONNX Runtime options of the document session: one thread per run (the parallelism is
    the worker threads running batches side by side), nodes run one after the other."""
    import onnxruntime as ort

    options = session_options(1)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options


def open_session(model_file: Path, options: Any, *, int8_matmul: bool = False) -> Any:
    """A CPU session of `model_file`, its quantized embedding table kept quantized
    (`gather_before_dequantize`: the same vectors). ONNX Runtime folds the other int8 weights into
    float32 (a session of the bundled model holds about 57 MB) unless `int8_matmul`: then they stay
    int8 and run on int8 kernels (`int8_matmuls`: about 30 MB; vectors close to, not equal to, the
    float32 run's, so the caller's model id must say which it ran)."""
    import onnxruntime as ort

    model = gather_before_dequantize(model_file.read_bytes())
    if int8_matmul:
        model = int8_matmuls(model)
    session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    drop_model_bytes(session)
    return session


def drop_model_bytes(session: Any) -> bool:
    """Let go of the model bytes that ONNX Runtime's Python `InferenceSession` keeps; True if it held them.

    A session made from bytes keeps them (`_model_bytes`, "holding the memory indefinitely" says
    its own comment) only to be made again by `set_providers`, which the router never calls: for
    the bundled model that is 23 MB a session for nothing (docs/benchmarks.md, "Memory"). The
    session has its own copy of the weights; its runs do not read them."""
    if getattr(session, "_model_bytes", None) is None:
        return False
    session._model_bytes = None
    return True


def document_session(model_file: Path, *, int8_matmul: bool = False) -> Any:
    """A single-threaded CPU session of `model_file`, which several threads may run at once.

    It holds its own copy of the weights (`open_session`)."""
    return open_session(model_file, document_session_options(), int8_matmul=int8_matmul)


def shrink_arena(session: Any) -> None:
    """Give back what `session`'s memory arena holds beyond the runs in progress.

    ONNX Runtime frees arena chunks only at the end of a run that asks for it, so this is a
    run of one token with that option (well under a millisecond): after a batch of long
    documents it frees about 200 MB that the arena would otherwise keep for the process's life."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry(ARENA_SHRINKAGE, "cpu:0")
    one = np.zeros((1, 1), dtype=np.int64)
    feed = {"input_ids": one, "attention_mask": np.ones_like(one)}
    if "token_type_ids" in {i.name for i in session.get_inputs()}:
        feed["token_type_ids"] = one
    session.run([session.get_outputs()[0].name], feed, options)


def cut_ids(ids: list[int], max_tokens: int) -> list[int]:
    """Word-piece ids (special tokens at both ends) cut to `max_tokens` as a truncating tokenizer
    cuts one text: the first `max_tokens - 2` pieces between the two special tokens."""
    return ids if len(ids) <= max_tokens else ids[: max_tokens - 1] + ids[-1:]


class MeanPoolingEncoder:
    """Embeds with an ONNX session whose first output is `(batch, tokens, dim)` hidden states.

    `tokenizer` is a `tokenizers.Tokenizer` (its padding is turned off; it is not copied); `session` an
    `onnxruntime.InferenceSession` taking `input_ids`, `attention_mask` and, if the model
    has it, `token_type_ids`. `document_session`, if given, is another session of the same
    model that `embed_documents` runs with several workers. Calls that run `session` must be
    serialized by the caller; `embed_documents` with workers may run beside them.
    """

    def __init__(
        self,
        session: Any,
        tokenizer: Any,
        *,
        max_query_tokens: int,
        document_session: Any | None = None,
        open_document_session: Callable[[], Any] | None = None,
    ) -> None:
        if max_query_tokens < 2:
            raise ValueError("max_query_tokens must be at least 2 (the special tokens)")
        self._session = session
        self.document_session = document_session
        """The session that `embed_documents` runs with workers (None: there is none, or it
        was released)."""
        self._open_document_session = open_document_session
        self._input_names = {i.name for i in session.get_inputs()}
        self._output_name = session.get_outputs()[0].name
        self._tokenizer = tokenizer
        self._tokenizer.no_padding()
        self.max_query_tokens = max_query_tokens

    def _run(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64], session: Any = None) -> Matrix:
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray((session or self._session).run([self._output_name], feed)[0], dtype=np.float32)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), np.float32(1e-9))
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return np.asarray(pooled / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)

    def embed_query(self, text: str, session: Any = None) -> Vector:
        """One text, unpadded, at most `max_query_tokens` word pieces (special tokens included);
        on `session` if given (e.g. the document session), else the main one."""
        ids = np.asarray([cut_ids(self._tokenizer.encode(text).ids, self.max_query_tokens)], dtype=np.int64)
        return self._run(ids, np.ones_like(ids), session)[0]

    def token_vectors(self, text: str, max_tokens: int) -> tuple[list[int], Matrix]:
        """The word pieces of `text` (at most `max_tokens`, special tokens included) and their
        hidden states, before pooling: one L2-normalized row per piece, without the special
        tokens ([CLS], [SEP]) that every text shares."""
        if max_tokens < 3:
            raise ValueError("max_tokens must be at least 3 (the special tokens and one word piece)")
        ids = cut_ids(self._tokenizer.encode(text).ids, max_tokens)
        array = np.asarray([ids], dtype=np.int64)
        feed = {"input_ids": array, "attention_mask": np.ones_like(array)}
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(array)
        hidden = np.asarray(self._session.run([self._output_name], feed)[0][0], dtype=np.float32)[1:-1]
        norms = np.linalg.norm(hidden, axis=1, keepdims=True)
        return ids[1:-1], np.asarray(hidden / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)

    @property
    def has_document_session(self) -> bool:
        """Whether documents can run on a session of their own (open now, or reopenable)."""
        return self.document_session is not None or self._open_document_session is not None

    def open_document_session(self) -> Any | None:
        """The document session, opened if it is not open (None if there is none).

        If it cannot be opened, that is logged once as a warning and it is not tried again:
        documents then run on the main session."""
        if self.document_session is None and self._open_document_session is not None:
            try:
                self.document_session = self._open_document_session()
            except Exception as e:  # noqa: BLE001 - onnxruntime raises anything; the main session works
                self._open_document_session = None
                logger.warning(
                    "router: no second session of the model for document workers (%s: %s); documents are "
                    "embedded one batch at a time on the query session (set GATEWAY_EMBEDDING__DOCUMENT_WORKERS=1 "
                    "to skip the attempt)",
                    type(e).__name__,
                    e,
                )
        return self.document_session

    def release_document_session(self) -> None:
        """Let the document session's copy of the weights go until documents come in bulk again."""
        self.document_session = None

    def tokenize_documents(self, texts: Sequence[str]) -> list[list[int]]:
        """The word pieces of each text (special tokens included), as `embed_documents` reads them."""
        return [e.ids for e in self._tokenizer.encode_batch(list(texts))]

    def embed_documents(
        self,
        texts: Sequence[str],
        batch_size: int,
        *,
        workers: int = 1,
        before_batch: Callable[[], None] | None = None,
        hold: contextlib.AbstractContextManager[Any] | None = None,
    ) -> Matrix:
        """Rows in input order; batches of texts with similar numbers of word pieces.

        With `workers` > 1, a `document_session` and more than one batch, the batches are
        run by that many threads on the document session; otherwise one after the other on
        the main session. `before_batch` is called before each batch is run (the embedder
        lets waiting queries go first there); `hold` (the caller's lock of the main session)
        is held while each batch runs on the main session, and only then. After a batch of more
        than `ARENA_KEEP_TOKENS` padded word pieces, the arena of the session that ran them is
        shrunk after the last one."""
        encoded = self.tokenize_documents(texts)
        batches = length_batches([len(ids) for ids in encoded], batch_size)
        session = self.document_session if workers > 1 and len(batches) > 1 else None
        held = hold if hold is not None and session is None else contextlib.nullcontext()

        def run(batch: list[int]) -> Matrix:
            if before_batch is not None:
                before_batch()
            ids, mask = padded([encoded[i] for i in batch])
            with held:
                return self._run(ids, mask, session)

        if session is not None:
            with ThreadPoolExecutor(max_workers=min(workers, len(batches)), thread_name_prefix="embed") as pool:
                vectors = list(pool.map(run, batches))
        else:
            vectors = [run(batch) for batch in batches]
        if any(len(batch) * max(len(encoded[i]) for i in batch) > ARENA_KEEP_TOKENS for batch in batches):
            with held:
                shrink_arena(session or self._session)
        if not vectors:
            return np.zeros((0, 0), dtype=np.float32)
        result = np.empty((len(encoded), vectors[0].shape[1]), dtype=np.float32)
        for batch, rows in zip(batches, vectors, strict=True):
            result[np.asarray(batch, dtype=np.intp)] = rows
        return result


def load_tokenizer(model_dir: Path) -> Any:
    """The `tokenizers.Tokenizer` of `model_dir` (`tokenizer.json`) as fastembed's `load_tokenizer`
    makes it for a mean-pooling model: truncated at `tokenizer_config.json`'s limit, the special
    tokens of `special_tokens_map.json` added; no padding (the encoder pads its batches itself).

    The bundled model loads it here rather than through fastembed: importing fastembed (its image
    preprocessing, its model hub client) costs about 20 MB of an idle gateway (docs/benchmarks.md, "Memory")."""
    import json

    from tokenizers import AddedToken, Tokenizer

    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    limits = [v for v in (config.get("model_max_length"), config.get("max_length")) if type(v) is int and v > 0]
    if not limits:
        raise ValueError(f"{model_dir / 'tokenizer_config.json'} names no model_max_length or max_length")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    truncation = tokenizer.truncation or {}
    tokenizer.enable_truncation(
        max_length=min(limits), direction=config.get("truncation_side") or truncation.get("direction", "right")
    )
    special = model_dir / "special_tokens_map.json"
    tokens = json.loads(special.read_text(encoding="utf-8")) if special.is_file() else {}
    for value in tokens.values():
        for token in value if isinstance(value, list) else [value]:
            tokenizer.add_special_tokens([AddedToken(**token) if isinstance(token, dict) else token])
    tokenizer.no_padding()
    return tokenizer


def mean_pooling_encoder(
    model_file: Path,
    tokenizer: Any,
    max_query_tokens: int,
    *,
    threads: int | None = None,
    document_workers: int = 1,
    int8_matmul: bool = False,
) -> MeanPoolingEncoder:
    """A `MeanPoolingEncoder` of `model_file` and `tokenizer`: its session (`threads`, as fastembed
    would open it) and, with `document_workers` > 1, a single-threaded `document_session` of the
    same file, opened when documents first come in bulk (`MeanPoolingEncoder.open_document_session`),
    not here: a gateway whose index comes from the cache, or is small, never holds it;
    `int8_matmul`: both run their matrix weights int8 (`open_session`)."""
    session = open_session(model_file, session_options(threads), int8_matmul=int8_matmul)
    return MeanPoolingEncoder(
        session,
        tokenizer,
        max_query_tokens=max_query_tokens,
        open_document_session=partial(document_session, model_file, int8_matmul=int8_matmul)
        if document_workers > 1
        else None,
    )


def fastembed_encoder(
    model: Any, max_query_tokens: int, *, threads: int | None = None, document_workers: int = 1
) -> MeanPoolingEncoder | None:
    """A direct encoder of a `fastembed.TextEmbedding` made with `lazy_load=True`, if it is a
    mean-pooling model (fastembed's `PooledEmbedding`); None for any other kind. Its session and
    its tokenizer (fastembed's `load_tokenizer`) are opened here (`mean_pooling_encoder`), so that
    fastembed holds neither unless it is run itself.

    The caller knows that the model takes no query prefix (fastembed adds none for these)."""
    from fastembed.common.preprocessor_utils import load_tokenizer as fastembed_tokenizer
    from fastembed.text.pooled_embedding import PooledEmbedding

    inner = getattr(model, "model", None)
    if not isinstance(inner, PooledEmbedding) or inner.model_description.additional_files:
        return None
    model_file = Path(inner._model_dir) / inner.model_description.model_file
    tokenizer, _ = fastembed_tokenizer(Path(inner._model_dir))
    return mean_pooling_encoder(
        model_file, tokenizer, max_query_tokens, threads=threads, document_workers=document_workers
    )
