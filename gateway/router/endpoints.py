"""HTTP endpoints the router may use instead of its own model: one JSON POST, one error type.

The embedding endpoint (`remote_embedder`), the reranker and the judge's chat endpoint
(`second_stage`) all speak JSON over HTTP with an optional bearer key read from the
environment. Every failure (refused connection, timeout, an HTTP error status, a body that
is not the expected JSON) is one `EndpointError` whose message names the URL and the cause
in a line, which is what the router's status and log show.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx2

__all__ = ["EndpointError", "api_key_from_env", "endpoint_url", "post_json", "post_json_async"]


class EndpointError(Exception):
    """An endpoint could not answer; the message is one line naming the URL and the cause."""


def endpoint_url(base: str, suffix: str) -> str:
    """`base` with `suffix` (`/embeddings`, `/rerank`, `/chat/completions`) appended unless it ends with it."""
    trimmed = base.rstrip("/")
    return trimmed if trimmed.endswith(suffix) else trimmed + suffix


def api_key_from_env(variable: str | None) -> str | None:
    """The key in the environment variable `variable` (None when unset or empty); raises ValueError
    naming the variable when it is configured but missing, so a misconfiguration is said at start-up."""
    if not variable:
        return None
    value = os.environ.get(variable, "").strip()
    if not value:
        raise ValueError(f"the environment variable {variable} (the endpoint's API key) is not set")
    return value


def _headers(key: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return headers


def _decode(url: str, response: httpx2.Response) -> Any:
    if response.status_code >= 400:
        snippet = " ".join(response.text.split())[:200]
        raise EndpointError(f"{url} answered HTTP {response.status_code}: {snippet or '(empty body)'}")
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EndpointError(f"{url} answered something that is not JSON ({e})") from e


def post_json(client: httpx2.Client, url: str, body: dict[str, Any], *, key: str | None, timeout: float) -> Any:
    """POST `body` as JSON and return the decoded answer; raises `EndpointError` on any failure."""
    try:
        response = client.post(url, content=json.dumps(body), headers=_headers(key), timeout=timeout)
    except httpx2.TimeoutException as e:
        raise EndpointError(f"{url} did not answer within {timeout:g} s") from e
    except httpx2.HTTPError as e:
        raise EndpointError(f"{url} is unreachable ({type(e).__name__}: {e})") from e
    return _decode(url, response)


async def post_json_async(
    client: httpx2.AsyncClient, url: str, body: dict[str, Any], *, key: str | None, timeout: float
) -> Any:
    """`post_json` for the event loop (the second stage runs there, bounded by the search)."""
    try:
        response = await client.post(url, content=json.dumps(body), headers=_headers(key), timeout=timeout)
    except httpx2.TimeoutException as e:
        raise EndpointError(f"{url} did not answer within {timeout:g} s") from e
    except httpx2.HTTPError as e:
        raise EndpointError(f"{url} is unreachable ({type(e).__name__}: {e})") from e
    return _decode(url, response)
