"""The settings sections of tool search: the embedding model, routing, code mode, the second
stage and learning from use (`GATEWAY_EMBEDDING__*`, `GATEWAY_ROUTING__*`...).

Apart from `gateway.config.settings` so the sections the router and code mode read sit together,
and `Settings` stays a short list of what the gateway is made of."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

__all__ = [
    "CodeModeSettings",
    "EmbeddingSettings",
    "LearningSettings",
    "RoutingSettings",
    "SecondStageSettings",
]


class EmbeddingSettings(BaseModel):
    """The embedding model of the semantic router."""

    enabled: bool = Field(default=True, description="False: route with BM25 alone, load no model.")
    model: str | None = Field(
        default=None,
        description=(
            "A fastembed model name (downloaded by fastembed from its model hub on first use); "
            "unset: the bundled all-MiniLM-L6-v2 int8 model, installed with the gateway."
        ),
    )
    model_path: Path | None = Field(
        default=None, description="A local directory with a fastembed-compatible ONNX model and its tokenizer."
    )
    threads: int | None = Field(default=None, ge=1, description="ONNX Runtime threads; unset: all cores.")
    document_workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "Document batches embedded at once in bulk, each single-threaded on a second model "
            "session (about 60 MB, released 30 s after the last bulk call); 1: one at a time on the "
            "query session, no second session; "
            "unset: `threads`, else one per core."
        ),
    )
    batch_size: int = Field(
        default=8,
        ge=1,
        le=4096,
        description="Documents embedded per batch (8: the fastest for tools' short texts on a 2-core CPU).",
    )
    max_query_tokens: int = Field(
        default=64,
        ge=8,
        le=512,
        description=(
            "Word pieces of a search request the model reads (the rest is cut; BM25 reads it all); "
            "applies to the bundled model and models of its layout."
        ),
    )
    int8_matmul: bool = Field(
        default=False,
        description=(
            "True: the bundled model's matrix weights stay int8 and run on int8 kernels (about 30 MB less "
            "a session; vectors within cosine 0.999 of the float32 run's, cached under their own id)."
        ),
    )
    # --- issue 30: your own model, on this machine (model_sha256) or behind an endpoint (url ...)
    model_sha256: dict[str, str] = Field(
        default_factory=dict,
        description=(
            'With `model_path`: the sha256 of the directory\'s files, as JSON (`{"model.onnx": "9f2c..."}`); '
            "every file named is checked when the model loads, and a mismatch routes with BM25 alone."
        ),
    )
    url: str | None = Field(
        default=None,
        description=(
            "An OpenAI-compatible embeddings endpoint (`http://127.0.0.1:11434/v1`: Ollama, vLLM, "
            "text-embeddings-inference, Infinity, LiteLLM, OpenAI); `/embeddings` is appended unless the URL "
            "ends with it. Set: tools and requests are embedded there, by the model `model`."
        ),
    )
    api_key_env: str | None = Field(
        default=None,
        description="With `url`: the environment variable holding the endpoint's API key (sent as a bearer token).",
    )
    request_batch: int = Field(
        default=64, ge=1, le=2048, description="With `url`: most texts sent in one request to the endpoint."
    )
    timeout: float = Field(
        default=30.0, gt=0, le=600, description="With `url`: seconds a request of documents may take."
    )
    query_timeout: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description=(
            "With `url`: seconds a search request's embedding may take; past it, or with the endpoint "
            "down, that search is ranked with BM25 alone (keep it under `GATEWAY_ROUTING__SEARCH_TIMEOUT`)."
        ),
    )
    retry_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="With `url`: after a failure, seconds before the endpoint is tried again (BM25 meanwhile).",
    )


class RoutingSettings(BaseModel):
    """How tools are exposed and ranked."""

    mode: Literal["auto", "all", "search", "dynamic", "code"] = Field(
        default="auto",
        description=(
            "auto: all while a client may see at most auto_max_tools tools, dynamic beyond (clients degrade "
            "past 30-50 tools); all: every tool in tools/list; search: pinned tools plus search_tools and "
            "call_tool; dynamic: as search, and found tools are added to the session's tools/list; code: "
            "search_tools, describe_tools and execute, a Python program calling every tool (docs/code-mode.md)."
        ),
    )
    auto_max_tools: int = Field(
        default=40, ge=1, le=10_000, description="auto mode: the most tools a client is shown whole (all mode)."
    )
    k: int = Field(default=8, ge=1, le=50, description="Tools returned by a search unless the caller asks otherwise.")
    threshold: float = Field(default=0.0, ge=0.0, le=1.0, description="Results scoring below this are dropped.")
    no_fit_threshold: float = Field(
        default=0.17,
        ge=0.0,
        le=1.0,
        description=(
            "When the best result scores below this, search_tools and POST /route answer 'no tool fits this "
            "request' and list the closest tools as hints, not matches (0: always answer). 0.17: the most "
            "refusals losing at most 0.02 recall@5 on every dev set (mcp-gateway eval --abstain)."
        ),
    )
    pinned: list[str] = Field(default_factory=list, description="Exposed tool names always listed and returned.")
    search_timeout: float = Field(default=5.0, gt=0, description="Seconds a search_tools call may take.")
    max_query_chars: int = Field(
        default=4_000,
        ge=100,
        le=1_000_000,
        description=(
            "Characters of a search_tools or POST /route request that are ranked; the rest is cut before any "
            "work (the model reads 64 word pieces of it anyway), so a huge request costs what a long one does."
        ),
    )
    dynamic_max_tools: int = Field(
        default=32, ge=1, le=500, description="dynamic mode: most tools a session's list grows to (least recent out)."
    )


class CodeModeSettings(BaseModel):
    """Code mode (`routing.mode: code`): the sandbox a model's program runs in, and its limits
    (docs/code-mode.md). Each limit is named in the error a program gets when it hits it."""

    wall_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="Seconds a program may run in all, its tool calls included."
    )
    cpu_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Seconds of interpreter time a program may use (time waiting for tool calls not counted).",
    )
    memory_mb: int = Field(default=256, ge=1, le=65_536, description="Heap a program may use, in MiB.")
    max_recursion_depth: int = Field(
        default=200, ge=10, le=10_000, description="Deepest call stack a program may build."
    )
    max_tool_calls: int = Field(default=200, ge=1, le=100_000, description="Tool calls one program run may make.")
    max_output_bytes: int = Field(
        default=20_000,
        ge=256,
        le=10_000_000,
        description=(
            "Bytes of return value and of printed output each given back to the model; the rest is cut, with a note."
        ),
    )
    allow_writes: list[str] = Field(
        default_factory=list,
        description=(
            "Exposed tool names (fnmatch globs: `notes__*` for a whole server, `notes__add` for one tool) a program "
            "may call although they are not annotated readOnlyHint: true. Empty: programs only read."
        ),
    )
    confirm_writes: bool = Field(
        default=True,
        description=(
            "Ask a client that supports elicitation, once per run, whether the program may call the write tools "
            "allow_writes does not name; yes lets that run call them all. Off: only allow_writes counts."
        ),
    )
    confirm_seconds: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="Seconds the client has to answer that question; no answer in time is a no.",
    )
    workers: int = Field(default=2, ge=1, le=64, description="Most sandbox worker processes running programs at once.")
    warm_workers: int = Field(default=1, ge=0, le=64, description="Worker processes kept started while idle.")


class SecondStageSettings(BaseModel):
    """A second look at the router's top candidates (issue 30): a reranker endpoint or an LLM judge.

    Bounded in time and candidates; on any failure (down, slow, nonsense) the first stage's
    ranking stands. See docs/router.md, "Choosing a model"."""

    kind: Literal["off", "rerank", "judge"] = Field(
        default="off",
        description=(
            "off: the router's ranking as is; rerank: a `/rerank` endpoint (text-embeddings-inference, "
            "Infinity, Cohere, Jina, Voyage) reorders the top candidates; judge: an LLM says which candidates "
            "fit the request, or that none does (the client's own model through MCP sampling when the client "
            "offers it and `sampling` is on, else the chat endpoint at `url`)."
        ),
    )
    url: str | None = Field(
        default=None,
        description=(
            "rerank: the endpoint (`/rerank` is appended unless the URL ends with it); judge: an "
            "OpenAI-compatible chat endpoint (`/chat/completions` appended likewise), used when the client "
            "offers no sampling; unset: the judge asks the client only."
        ),
    )
    model: str | None = Field(default=None, description="The model the endpoint runs (sent as `model`).")
    api_key_env: str | None = Field(
        default=None, description="The environment variable holding the endpoint's API key (a bearer token)."
    )
    sampling: bool = Field(
        default=True,
        description="judge: ask the client's own model through MCP sampling when the client declares sampling.",
    )
    candidates: int = Field(
        default=10, ge=2, le=50, description="The first stage's best tools the second stage looks at."
    )
    timeout: float = Field(
        default=10.0,
        gt=0,
        le=120,
        description="Seconds the second stage may take; past it the first stage's ranking stands.",
    )
    max_tokens: int = Field(default=200, ge=16, le=4096, description="judge: most tokens of the model's answer.")

    @model_validator(mode="after")
    def _check_rerank_url(self) -> SecondStageSettings:
        if self.kind == "rerank" and not self.url:
            raise ValueError("kind rerank needs url: the reranker's /rerank endpoint (GATEWAY_SECOND_STAGE__URL)")
        return self


class LearningSettings(BaseModel):
    """How the router learns from use (executions and feedback); see docs/architecture.md."""

    enabled: bool = Field(default=True, description="False: rank by content alone, read no usage signals.")
    max_boost: float = Field(default=0.25, ge=0, le=1, description="Most a tool's 0..1 score is raised by use.")
    max_penalty: float = Field(
        default=0.15, ge=0, le=1, description="Most a tool's 0..1 score is lowered by failures and thumbs-down."
    )
    max_prior: float = Field(
        default=0.03, ge=0, le=1, description="Most signals not tied to a search (calls by name) move a tool."
    )
    half_life_days: float = Field(default=30.0, gt=0, description="A signal's weight halves every this many days.")
    min_similarity: float = Field(
        default=0.3, ge=0, lt=1, description="Signals from requests less similar than this (cosine) are ignored."
    )
    half_weight_signals: float = Field(
        default=2.0, gt=0, description="Agreeing signals from the same request that move a tool half the bound."
    )
    max_signals: int = Field(default=100_000, ge=1, description="Most signals kept in memory (the newest).")
    refresh_seconds: float = Field(default=30.0, gt=0, description="Seconds between reads of new signals.")
