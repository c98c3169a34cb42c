"""A second look at the router's best candidates: a reranker endpoint or an LLM judge (issue 30).

The first stage (embeddings + BM25, `Router.search`) ranks every tool in milliseconds; the
bundled model is small and sometimes misses what a person finds obvious. A second stage
looks again at the first stage's top `candidates` only:

- `rerank`: a `/rerank` endpoint in the shape text-embeddings-inference, Infinity, Cohere,
  Jina and Voyage share (`{"query", "documents"}` -> `results[{index, relevance_score}]`)
  reorders them. Whether a tool fits is still the first stage's threshold: a reranker's
  scores have no common scale.
- `judge`: an LLM reads the request and the candidates and answers which fit, best first,
  or that none does. It asks the client's own model through MCP sampling when the client
  offers it (`gateway.serving.sampling_judge`), else an OpenAI-compatible chat endpoint.
  The judge decides "no tool fits" in place of the threshold.

Both are bounded in time (`timeout`) and in candidates; on any failure (an endpoint down
or slow, an answer that is not what was asked, a judge naming no candidate) the first
stage's answer stands, and `Routing.stage` says what happened. Scores stay the first
stage's, so a client can still compare them; only the order and the verdict change.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import httpx2

from gateway.router.base import SearchHit
from gateway.router.documents import truncate
from gateway.router.endpoints import EndpointError, api_key_from_env, endpoint_url, post_json_async

if TYPE_CHECKING:
    from gateway.config.routing_settings import SecondStageSettings

__all__ = [
    "Ask",
    "JUDGE_SYSTEM_PROMPT",
    "Routing",
    "SecondStage",
    "first_stage",
    "judge_prompt",
    "parse_verdict",
]

logger = logging.getLogger(__name__)

Ask = Callable[[str, str, int], Awaitable[str]]
"""An LLM as the judge uses it: `ask(system, user, max_tokens)` -> the model's text answer."""

JUDGE_SYSTEM_PROMPT = (
    "You choose tools for a request. You are given the request and numbered candidate tools. "
    'Answer with JSON only, on one line: {"fits": [numbers of the candidates that can do the request, best first]}, '
    'or {"fits": []} when none of them can. Do not explain.'
)
_DESCRIPTION_CHARS = 300


@dataclass(frozen=True)
class Routing:
    """The tools for a request after both stages, and whether any fits."""

    hits: list[SearchHit]
    fits: bool
    """False: no tool fits the request; `hits` are then hints, not matches."""
    stage: str
    """What decided: `first stage`, `rerank`, `judge (sampling)`, `judge (chat)`, or why the first
    stage's answer stands (`first stage; the judge failed: ...`)."""


def first_stage(hits: Sequence[SearchHit], no_fit_threshold: float, k: int, stage: str = "first stage") -> Routing:
    """The first stage's answer: its top `k`, fitting when the best scores at least the threshold."""
    return Routing(hits=list(hits[:k]), fits=bool(hits) and hits[0].score >= no_fit_threshold, stage=stage)


def judge_prompt(query: str, candidates: Sequence[SearchHit]) -> str:
    """The user message of the judge: the request, then each candidate as `n. name: description`."""
    lines = [f"Request: {query}", "", "Candidates:"]
    for i, hit in enumerate(candidates, 1):
        description = truncate(hit.record.tool.description or "", _DESCRIPTION_CHARS)
        lines.append(f"{i}. {hit.name}: {description}" if description else f"{i}. {hit.name}")
    return "\n".join(lines)


_JSON_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)


def parse_verdict(answer: str, candidates: Sequence[SearchHit]) -> list[int] | None:
    """The candidates' indexes (0-based) the judge's answer names, best first; [] for "none fits";
    None for an answer that is not a verdict (then the first stage stands).

    Numbers and names are both accepted (models do either); a verdict naming only unknown
    candidates is nonsense, not "none fits".
    """
    for match in _JSON_OBJECT.finditer(answer):
        try:
            value = json.loads(match.group())
        except json.JSONDecodeError:
            continue
        if not isinstance(value, dict) or not isinstance(value.get("fits"), list):
            continue
        named = value["fits"]
        if not named:
            return []
        by_name = {hit.name: i for i, hit in enumerate(candidates)}
        picked: list[int] = []
        for item in named:
            index: int | None = None
            if isinstance(item, bool):
                index = None
            elif isinstance(item, int) and 1 <= item <= len(candidates):
                index = item - 1
            elif isinstance(item, str) and item.strip().isdigit() and 1 <= int(item) <= len(candidates):
                index = int(item) - 1
            elif isinstance(item, str):
                index = by_name.get(item.strip())
            if index is not None and index not in picked:
                picked.append(index)
        return picked or None
    return None


class SecondStage:
    """The configured second stage (`GATEWAY_SECOND_STAGE__*`); `refine` never raises."""

    def __init__(self, settings: SecondStageSettings, no_fit_threshold: float) -> None:
        self.settings = settings
        self.no_fit_threshold = no_fit_threshold
        self._key: str | None = None
        self._client: httpx2.AsyncClient | None = None
        self._rerank_field = "documents"
        """`documents` (Cohere, Jina, Voyage, Infinity), or `texts` once a server asked for it (TEI)."""
        if settings.kind != "off" and settings.url:
            try:
                self._key = api_key_from_env(settings.api_key_env)
            except ValueError as e:  # said once now; the endpoint's refusal says it again per search
                logger.warning("router: the second stage's endpoint gets no API key: %s", e)

    @property
    def enabled(self) -> bool:
        return self.settings.kind != "off"

    def wanted(self, k: int) -> int:
        """How many first-stage results to ask for, to return `k` after the second stage."""
        return max(k, self.settings.candidates) if self.enabled else k

    async def refine(self, query: str, hits: Sequence[SearchHit], k: int, ask: Ask | None = None) -> Routing:
        """The top `k` after the second stage; the first stage's answer when there is none or it fails.

        `ask` is the client's own model (MCP sampling) when the client offers it: the judge prefers it."""
        kind = self.settings.kind
        if kind == "off" or len(hits) < 1:
            return first_stage(hits, self.no_fit_threshold, k)
        candidates = list(hits[: self.settings.candidates])
        how: str = "rerank"
        asking: Ask = self._chat
        if kind == "judge":
            if ask is not None and self.settings.sampling:
                how, asking = "judge (sampling)", ask
            elif self.settings.url:
                how, asking = "judge (chat)", self._chat
            else:
                return first_stage(hits, self.no_fit_threshold, k, "first stage; no judge for this client")
        try:
            with anyio.fail_after(self.settings.timeout):
                if kind == "rerank":
                    order = await self._rerank(query, candidates)
                    reordered = [candidates[i] for i in order] + list(hits[len(candidates) :])
                    return Routing(reordered[:k], first_stage(hits, self.no_fit_threshold, k).fits, "rerank")
                answer = await asking(JUDGE_SYSTEM_PROMPT, judge_prompt(query, candidates), self.settings.max_tokens)
        except TimeoutError:
            return self._failed(hits, k, f"no answer within {self.settings.timeout:g} s")
        except (EndpointError, ValueError) as e:
            return self._failed(hits, k, str(e))
        picked = parse_verdict(answer, candidates)
        if picked is None:
            return self._failed(hits, k, f"an answer that is not a verdict: {truncate(answer, 120)!r}")
        if not picked:
            return Routing(list(hits[:k]), False, how)
        rest = [hit for i, hit in enumerate(candidates) if i not in picked] + list(hits[len(candidates) :])
        return Routing(([candidates[i] for i in picked] + rest)[:k], True, how)

    def _failed(self, hits: Sequence[SearchHit], k: int, why: str) -> Routing:
        kind = self.settings.kind
        logger.warning("router: the second stage (%s) failed, the first stage's ranking stands: %s", kind, why)
        return first_stage(hits, self.no_fit_threshold, k, f"first stage; the {self.settings.kind} failed: {why}")

    def _http(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _rerank(self, query: str, candidates: Sequence[SearchHit]) -> list[int]:
        """The candidates' indexes, most relevant first, as the reranker orders them."""
        from gateway.router.documents import tool_document

        assert self.settings.url
        url = endpoint_url(self.settings.url, "/rerank")
        documents = [truncate(tool_document(hit.record), 1000) for hit in candidates]
        body: dict[str, Any] = {"query": query, self._rerank_field: documents}
        if self.settings.model:
            body["model"] = self.settings.model
        timeout = self.settings.timeout
        try:
            answer = await post_json_async(self._http(), url, body, key=self._key, timeout=timeout)
        except EndpointError as e:
            if self._rerank_field == "documents" and "HTTP 422" in str(e) and "texts" in str(e):
                self._rerank_field = "texts"  # text-embeddings-inference names them `texts`
                return await self._rerank(query, candidates)
            raise
        return _rerank_order(url, answer, len(candidates))

    async def _chat(self, system: str, user: str, max_tokens: int) -> str:
        """One OpenAI-compatible chat completion: the model's text answer."""
        assert self.settings.url
        url = endpoint_url(self.settings.url, "/chat/completions")
        body: dict[str, Any] = {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if self.settings.model:
            body["model"] = self.settings.model
        answer = await post_json_async(self._http(), url, body, key=self._key, timeout=self.settings.timeout)
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as e:
            raise EndpointError(f"{url} answered no choices[0].message.content") from e
        if not isinstance(content, str):
            raise EndpointError(f"{url} answered a message without text")
        return content


def _rerank_order(url: str, answer: Any, count: int) -> list[int]:
    """Indexes by decreasing relevance from a `/rerank` answer: `{"results": [...]}` (Cohere, Jina,
    Infinity), `{"data": [...]}` (Voyage) or a bare list (TEI), items `{index, relevance_score | score}`."""
    items = answer.get("results", answer.get("data")) if isinstance(answer, dict) else answer
    if not isinstance(items, list):
        raise EndpointError(f"{url} answered no list of results")
    scored: list[tuple[float, int]] = []
    for item in items:
        if not isinstance(item, dict):
            raise EndpointError(f"{url} answered a result that is not an object")
        index, score = item.get("index"), item.get("relevance_score", item.get("score"))
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise EndpointError(f"{url} answered a result index {index!r} outside 0..{count - 1}")
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise EndpointError(f"{url} answered a result without a numeric relevance_score")
        scored.append((float(score), index))
    seen = {index for _, index in scored}
    order = [index for _, index in sorted(scored, key=lambda pair: (-pair[0], pair[1]))]
    return order + [i for i in range(count) if i not in seen]  # top_n answers: the rest keep their order
