"""Exposure modes: which tools a client sees, and the gateway's own search tools.

- `auto` (the default): `all` while the catalog this client may see has at most
  `routing.auto_max_tools` tools (40), `dynamic` beyond. Models choose worse among many
  tools, and several clients degrade or cap the count past 30-50 tools (docs/settings.md, "Routing"),
  so a small catalog is shown whole and a large one through the router. The catalog
  changing (a server connecting, leaving, listing more tools) already sends
  `notifications/tools/list_changed`, so a client re-lists and sees the other mode.
- `all`: every tool in `tools/list` (plain aggregation).
- `search`: the pinned tools plus two gateway tools, `search_tools(query, limit)` and
  `call_tool(name, arguments)`; the model finds what it needs by searching.
- `dynamic`: as `search`, and each search also adds the tools it found to this
  session's `tools/list` (bounded, least recently found out first) and sends
  `notifications/tools/list_changed`, so clients that never call the gateway tools
  still end up with the right ones.
- `code`: `search_tools`, `describe_tools` (typed signatures on demand) and `execute` (a
  Python program calling every tool the client may see, in a sandbox; `gateway.codemode`,
  docs/code-mode.md). A task of several calls costs one model turn, and only what the
  program returns reaches the model's context. `auto` never picks it: a model must be told
  to write programs, which a client that expects plain tools does not do.

The mode is `routing.mode` for the deployment; an HTTP client may ask for another
with `?mode=` on the endpoint URL. An unknown value there is refused (HTTP 400, see
`unknown_mode`) rather than quietly replaced by the deployment's mode: a typo would
otherwise show the client a catalog it did not ask for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast, get_args

import mcp_types as types

from gateway.records.feedback import FEEDBACK_TOOL
from gateway.router.base import SearchHit

__all__ = [
    "CALL_TOOL",
    "CODE_SEARCH_TOOL",
    "DESCRIBE_TOOLS",
    "EXECUTE",
    "GATEWAY_TOOL_NAMES",
    "SEARCH_TOOL",
    "ArgumentError",
    "MODES",
    "NO_TOOL_FITS",
    "Mode",
    "SessionTools",
    "mode_for",
    "openai_function",
    "parse_call_arguments",
    "parse_search_arguments",
    "resolve_mode",
    "tool_payload",
    "unknown_mode",
]

Mode = Literal["auto", "all", "search", "dynamic", "code"]
MODES: tuple[Mode, ...] = get_args(Mode)
Shown = Literal["all", "search", "dynamic", "code"]
"""What a client is shown: a mode, `auto` resolved (`resolve_mode`)."""
MAX_LIMIT = 50

NO_TOOL_FITS = "No tool fits this request."
"""What search_tools, POST /route and `mcp-gateway search` answer when the best tool scores under
`routing.no_fit_threshold` (or the second stage's judge says none fits); the closest tools follow
as hints, not matches."""

SEARCH_TOOL = types.Tool(
    name="search_tools",
    description=(
        "Find the tools that can do a task. Describe the task in plain words; the result lists the "
        "best matching tools, best first, each with its name, description, input schema and a score "
        "from 0 to 1. Then call one with call_tool(name, arguments). When nothing fits, it says so and "
        "lists the closest tools as hints only."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "description": "What you want to do, in plain words."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "description": "How many tools to return (1-50).",
            },
        },
        "required": ["query"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
)

CALL_TOOL = types.Tool(
    name="call_tool",
    description=("Call a tool found with search_tools, by its exact name, with arguments that match its input schema."),
    input_schema={
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "The tool's name, as search_tools gave it."},
            "arguments": {"type": "object", "description": "The tool's arguments.", "additionalProperties": True},
        },
        "required": ["name"],
    },
)

CODE_SEARCH_TOOL = SEARCH_TOOL.model_copy(
    update={
        "description": (
            "Find the tools that can do a task. Describe the task in plain words; the result lists the best "
            "matching tools, best first, each with its name, description and a score from 0 to 1. Then get "
            "their signatures with describe_tools and call them from a program with execute. When nothing "
            "fits, it says so and lists the closest tools as hints only."
        )
    }
)
"""`search_tools` as code mode lists it: the same tool, pointing at describe_tools and execute."""

DESCRIBE_TOOLS = types.Tool(
    name="describe_tools",
    description=(
        "Typed Python signatures of tools, by name (as search_tools gives them), with their parameters, "
        "what each returns, and whether a program may call them. Use before writing a program with execute."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "names": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": 50,
                "description": 'Tool names, e.g. ["notes__search"].',
            }
        },
        "required": ["names"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
)

EXECUTE = types.Tool(
    name="execute",
    description=(
        "Run a Python program that calls tools and returns only what you need, in one step. Every tool is "
        "an async function: `r = await tools.server__tool(arg=value)`, or `await call_tool(name, {...})`; "
        "results are Python values (structured content, else the tool's text: json.loads it when it is "
        "JSON). A failing call raises an exception you can catch (RuntimeError; PermissionError for a tool "
        "that writes and is not allowed). The value of the last expression is returned, and print() output "
        "is shown. asyncio.gather runs calls at once; json, re, math, datetime are importable; no files, "
        "network or other imports. Limits (time, memory, tool calls, output size) are named when hit."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "minLength": 1,
                "description": "The program. Its last expression is its result.",
            }
        },
        "required": ["code"],
    },
)

GATEWAY_TOOL_NAMES = frozenset(
    {SEARCH_TOOL.name, CALL_TOOL.name, FEEDBACK_TOOL.name, DESCRIBE_TOOLS.name, EXECUTE.name}
)
"""The gateway's own tools; `submit_feedback` (`gateway.records.feedback`) is listed when records are on."""


class ArgumentError(ValueError):
    """A gateway tool was called with bad arguments; the message names the parameter."""


def mode_for(request: Any, default: Mode) -> Mode:
    """The exposure mode for one request: `?mode=` on an HTTP request, else the deployment's."""
    query_params = getattr(request, "query_params", None)
    asked = query_params.get("mode") if query_params is not None else None
    if asked in MODES:
        return cast(Mode, asked)
    return default


def resolve_mode(mode: Mode, visible_tools: int, auto_max_tools: int) -> Shown:
    """`mode`, with `auto` resolved: `all` for at most `auto_max_tools` visible tools, else `dynamic`."""
    if mode == "auto":
        return "all" if visible_tools <= auto_max_tools else "dynamic"
    return mode


def unknown_mode(asked: Sequence[str]) -> str | None:
    """Why the `?mode=` values `asked` are refused, naming the valid ones; None when every one is a mode."""
    wrong = [value for value in asked if value not in MODES]
    if not wrong:
        return None
    return (
        f"Unknown mode {wrong[0]!r} in ?mode=; use one of {', '.join(MODES)}, "
        "or leave it out for the gateway's default mode."
    )


def parse_search_arguments(arguments: dict[str, Any] | None, default_limit: int) -> tuple[str, int]:
    """Validate `search_tools` arguments: a non-empty query, a limit in 1..50."""
    arguments = arguments or {}
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ArgumentError("search_tools needs `query`: a non-empty string describing the task.")
    limit = arguments.get("limit", default_limit)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ArgumentError(f"search_tools `limit` must be an integer from 1 to {MAX_LIMIT}; got {limit!r}.")
    unknown = sorted(set(arguments) - {"query", "limit"})
    if unknown:
        raise ArgumentError(f"search_tools takes `query` and `limit`; unknown argument(s): {', '.join(unknown)}.")
    return query.strip(), limit


def parse_call_arguments(arguments: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """Validate `call_tool` arguments: a tool name and an optional arguments object."""
    arguments = arguments or {}
    name = arguments.get("name")
    if not isinstance(name, str) or not name:
        raise ArgumentError("call_tool needs `name`: the exact tool name that search_tools returned.")
    inner = arguments.get("arguments")
    if inner is not None and not isinstance(inner, dict):
        raise ArgumentError(f"call_tool `arguments` must be an object; got {type(inner).__name__}.")
    if name in GATEWAY_TOOL_NAMES:
        raise ArgumentError(f"call_tool calls catalog tools; call {name} directly.")
    return name, inner


def tool_payload(hit: SearchHit, *, code: bool = False) -> dict[str, Any]:
    """One search result as a model reads it; in code mode without the schema (`describe_tools` gives
    the typed signature, on demand), which is most of a result's tokens."""
    tool = hit.record.tool
    if code:
        return {"name": hit.name, "description": tool.description or "", "score": round(hit.score, 4)}
    return {
        "name": hit.name,
        "description": tool.description or "",
        "inputSchema": tool.input_schema,
        "score": round(hit.score, 4),
    }


def openai_function(tool: types.Tool) -> dict[str, Any]:
    """A tool in the OpenAI function-calling form, for host apps."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description or "", "parameters": tool.input_schema},
    }


class SessionTools:
    """dynamic mode: the tools one session has found, most recent last, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._names: OrderedDict[str, None] = OrderedDict()

    def add(self, names: Iterable[str]) -> bool:
        """Add found tools; returns whether the visible set changed."""
        before = list(self._names)
        for name in names:
            self._names.pop(name, None)
            self._names[name] = None
        while len(self._names) > self.limit:
            self._names.popitem(last=False)
        return set(before) != set(self._names)

    def names(self) -> Sequence[str]:
        return list(self._names)
