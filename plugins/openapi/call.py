"""Send one operation's request with the configured credentials and describe the response.

Credentials are read from the environment at each call, so a rotated token is picked
up without a restart. Their values, and those of configured headers whose names look
secret, are replaced by `***` in everything this module returns or raises, including
the response body (some APIs echo request headers back). Redirects are not followed:
a 3xx is returned with its `location`, so credentials never travel to another host.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx2
from pydantic import BaseModel, Field

from .config import SpecConfig
from .spec import ApiSpec, Operation
from .validate import CheckedInputs, InputError, is_json_media

__all__ = ["ApiResponse", "CallError", "Credentials", "Redactor", "build_url", "send"]

USER_AGENT = "mcp-gateway-openapi"
MASK = "***"
RELEVANT_HEADERS = (
    "content-type", "content-length", "content-range", "location", "retry-after", "link", "etag",
    "last-modified", "x-total-count", "x-total", "x-next-page", "x-request-id", "request-id", "deprecation",
    "sunset", "warning", "www-authenticate",
)  # fmt: skip
RELEVANT_PREFIXES = ("x-ratelimit-", "ratelimit", "x-rate-limit-", "x-pagination-")
BINARY_PREFIXES = ("image/", "audio/", "video/", "font/")
BINARY_TYPES = ("application/octet-stream", "application/pdf", "application/zip", "application/gzip")
ERROR_BODY_CHARS = 1_000
RESERVED_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class CallError(Exception):
    """The request could not be made or the API answered with an error; the message is for the model."""


class ApiResponse(BaseModel):
    """What `call_api` returns."""

    status: int
    reason: str
    method: str
    url: str = Field(description="The request URL (secrets masked).")
    headers: dict[str, str] = Field(description="The response headers that matter (type, paging, rate limits...).")
    body: str = Field(description="The body: JSON re-serialized compactly, or text.")
    truncated: bool = Field(description="True when the body was longer than the size limit and was cut.")
    elapsed_ms: int


class Redactor:
    """Replaces secret values with `***` in text; every secret it knows is also masked in
    the HTTP client's log records (which show request URLs, where an API key may be)."""

    def __init__(self, secrets: Sequence[str]) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)
        _LOG_FILTER.remember(self.secrets)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
            encoded = quote(secret, safe="")
            if encoded != secret:
                text = text.replace(encoded, MASK)
        return text


class _SecretLogFilter(logging.Filter):
    """Masks every secret a `Redactor` has seen in the records of the HTTP client's logger."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def remember(self, secrets: Sequence[str]) -> None:
        self.secrets.update(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            for secret in sorted(self.secrets, key=len, reverse=True):
                message = message.replace(secret, MASK).replace(quote(secret, safe=""), MASK)
            record.msg, record.args = message, ()
        return True


_LOG_FILTER = _SecretLogFilter()
logging.getLogger("httpx2").addFilter(_LOG_FILTER)


@dataclass(frozen=True)
class Credentials:
    headers: dict[str, str]
    query: dict[str, str]
    redact: Redactor

    @classmethod
    def from_environment(cls, config: SpecConfig, environ: Mapping[str, str]) -> Credentials:
        """The spec's credentials now; CallError naming the variable (never its value) if one is unset."""
        auth = config.auth
        values: dict[str, str] = {}
        for variable in auth.variables():
            value = environ.get(variable)
            if not value:
                raise CallError(
                    f"the environment variable {variable} (credentials of API {config.name!r}) is not set "
                    "in the gateway's environment; set it and call again"
                )
            values[variable] = value
        headers: dict[str, str] = {}
        query: dict[str, str] = {}
        secrets = list(values.values()) + config.secret_header_values()
        if auth.bearer_token_env:
            headers["Authorization"] = f"Bearer {values[auth.bearer_token_env]}"
        if auth.basic_username_env and auth.basic_password_env:
            pair = f"{values[auth.basic_username_env]}:{values[auth.basic_password_env]}"
            encoded = base64.b64encode(pair.encode()).decode()
            headers["Authorization"] = f"Basic {encoded}"
            secrets.append(encoded)
        if auth.api_key_env and auth.api_key_header:
            headers[auth.api_key_header] = values[auth.api_key_env]
        if auth.api_key_env and auth.api_key_query:
            query[auth.api_key_query] = values[auth.api_key_env]
        return cls(headers, query, Redactor(secrets))


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def build_url(spec: ApiSpec, op: Operation, path: Mapping[str, Any]) -> str:
    """The base URL joined with the operation's path, path parameters percent-encoded."""
    if not spec.base_url:
        raise CallError(
            f"API {spec.name!r} has no base URL: its spec has no `servers` entry; set `base_url` for it in the "
            "gateway's YAML file"
        )
    route = op.path
    for name, value in path.items():
        text = ",".join(_scalar(v) for v in value) if isinstance(value, list) else _scalar(value)
        route = route.replace("{" + name + "}", quote(text, safe=""))
    return spec.base_url.rstrip("/") + "/" + route.lstrip("/")


def _query_pairs(op: Operation, query: Mapping[str, Any]) -> list[tuple[str, str | int | float | bool | None]]:
    """Query parameters serialized per their `style`/`explode` (form, spaceDelimited, pipeDelimited, deepObject)."""
    styles = {p.name: p for p in op.parameters if p.location == "query"}
    pairs: list[tuple[str, str | int | float | bool | None]] = []
    for name, value in query.items():
        param = styles.get(name)
        style, explode = (param.style, param.explode) if param else ("form", True)
        if isinstance(value, list):
            if explode and style == "form":
                pairs.extend((name, _scalar(v)) for v in value)
            else:
                joiner = {"spaceDelimited": " ", "pipeDelimited": "|"}.get(style, ",")
                pairs.append((name, joiner.join(_scalar(v) for v in value)))
        elif isinstance(value, dict):
            if style == "deepObject":
                pairs.extend((f"{name}[{k}]", _scalar(v)) for k, v in value.items())
            elif explode:
                pairs.extend((str(k), _scalar(v)) for k, v in value.items())
            else:
                pairs.append((name, ",".join(f"{k},{_scalar(v)}" for k, v in value.items())))
        else:
            pairs.append((name, _scalar(value)))
    return pairs


def _relevant(headers: httpx2.Headers) -> dict[str, str]:
    return {
        key: value
        for key, value in ((k.lower(), v) for k, v in headers.items())
        if key in RELEVANT_HEADERS or key.startswith(RELEVANT_PREFIXES)
    }


def _body_text(raw: bytes, content_type: str, truncated: bool, limit: int, total: str) -> tuple[str, bool]:
    """The body for a model: compact JSON, text, or a note for binary content; cut at `limit` characters."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind.startswith(BINARY_PREFIXES) or kind in BINARY_TYPES:
        size = f"{total} bytes" if total else f"more than {len(raw)} bytes" if truncated else f"{len(raw)} bytes"
        return f"[{size} of {kind} not shown: binary content]", False
    text = raw.decode("utf-8", errors="replace")
    if not truncated and (is_json_media(kind) or (not kind and text.lstrip()[:1] in ("{", "["))):
        try:
            text = json.dumps(json.loads(text), ensure_ascii=False)
        except ValueError:
            pass
    if len(text) > limit:
        text, truncated = text[:limit], True
    if truncated:
        whole = f" of {total} bytes" if total else ""
        text += (
            f"\n[truncated: showing the first {limit} bytes{whole}; ask for less, for example with paging or "
            "filtering parameters]"
        )
    return text, truncated


def _request_content(inputs: CheckedInputs) -> dict[str, Any]:
    if inputs.body is None:
        return {}
    media = inputs.media
    if is_json_media(media):
        return {"json": inputs.body, "headers": {"Content-Type": media}}
    if media.startswith("application/x-www-form-urlencoded"):
        return {"data": {k: _scalar(v) for k, v in inputs.body.items()}}
    if media.startswith("multipart/form-data"):
        return {"files": {k: (None, _scalar(v)) for k, v in inputs.body.items()}}
    if not isinstance(inputs.body, str):
        raise InputError(f"body: {media} content must be given as a string")
    return {"content": inputs.body.encode(), "headers": {"Content-Type": media}}


async def send(
    spec: ApiSpec, config: SpecConfig, op: Operation, inputs: CheckedInputs, credentials: Credentials
) -> ApiResponse:
    """Send the request; CallError for a transport failure or an HTTP error status (>= 400)."""
    redact = credentials.redact
    url = build_url(spec, op, inputs.path)
    headers: dict[str, str] = {"User-Agent": USER_AGENT, "Accept": "application/json, */*;q=0.5"}
    headers.update(config.headers)
    for name, value in inputs.headers.items():
        lowered = name.lower()
        if lowered in RESERVED_HEADERS or lowered in {h.lower() for h in credentials.headers}:
            raise InputError(f"headers.{name}: this header is set by the gateway and cannot be given")
        headers[name] = _scalar(value)
    content = _request_content(inputs)
    headers.update(content.pop("headers", {}))
    headers.update(credentials.headers)
    params = _query_pairs(op, inputs.query) + list(credentials.query.items())
    method = op.method.upper()
    shown_url = redact(str(httpx2.URL(url, params=params)))
    target = f"{method} {urlsplit(url).netloc}{op.path}"
    started = time.perf_counter()
    limit = config.max_response_bytes
    try:
        async with (
            httpx2.AsyncClient(timeout=config.timeout, follow_redirects=False) as client,
            client.stream(method, url, params=params, headers=headers, **content) as response,
        ):
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    break
    except httpx2.TimeoutException:
        raise CallError(f"{target}: no response within {config.timeout:g} s (the API's `timeout` setting)") from None
    except httpx2.ConnectError as exc:
        reason = redact(str(exc)) or "connection failed"
        raise CallError(f"{target}: could not connect ({reason}); is {spec.base_url} reachable?") from None
    except httpx2.HTTPError as exc:
        raise CallError(f"{target}: the request failed: {redact(str(exc)) or type(exc).__name__}") from None
    raw = b"".join(chunks)
    truncated = len(raw) > limit
    content_type = response.headers.get("content-type", "")
    body, truncated = _body_text(
        raw[:limit], content_type, truncated, limit, response.headers.get("content-length", "")
    )
    result = ApiResponse(
        status=response.status_code,
        reason=response.reason_phrase,
        method=method,
        url=shown_url,
        headers={k: redact(v) for k, v in _relevant(response.headers).items()},
        body=redact(body),
        truncated=truncated,
        elapsed_ms=round((time.perf_counter() - started) * 1000),
    )
    if result.status >= 400:
        excerpt = result.body if len(result.body) <= ERROR_BODY_CHARS else result.body[:ERROR_BODY_CHARS] + " …"
        retry = f" (retry after {result.headers['retry-after']} s)" if "retry-after" in result.headers else ""
        raise CallError(f"{target} failed: HTTP {result.status} {result.reason}{retry}: {excerpt or '(empty body)'}")
    return result


def response_text(response: ApiResponse) -> str:
    """The response as the model reads it: status line, headers that matter, blank line, body."""
    lines = [f"HTTP {response.status} {response.reason} ({response.method} {response.url}, {response.elapsed_ms} ms)"]
    lines.extend(f"{k}: {v}" for k, v in response.headers.items())
    return "\n".join(lines) + "\n\n" + (response.body or "(empty body)")
