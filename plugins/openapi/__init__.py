"""OpenAPI explorer: any number of OpenAPI 3.x APIs as two tools, `search_api` and `call_api`.

A model finds an endpoint (by service, or by a plain-language search ranked with the
gateway's own router), reads its request and response schema in a compact form, and
calls it with the credentials the gateway holds, without the API's hundreds of
operations ever being tools of their own.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from gateway.config.settings import Settings
from gateway.hookspecs import RegisterServer, hookimpl

from .call import ApiResponse, CallError, Credentials, response_text, send
from .config import AuthConfig, Config, SpecConfig, missing_variables
from .explorer import Explorer, NotFound
from .render import describe_operation, describe_schema, short
from .validate import InputError, check_inputs

__all__ = ["AuthConfig", "Config", "Explorer", "SpecConfig", "create_server", "gateway_register_servers"]

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = 5
MAX_LIMIT = 20
MAX_LISTED = 200

SEARCH_ANNOTATIONS = ToolAnnotations(
    title="Search the APIs", read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False
)
CALL_ANNOTATIONS = ToolAnnotations(
    title="Call an API operation",
    read_only_hint=False,
    destructive_hint=True,
    idempotent_hint=False,
    open_world_hint=True,
)


def _text(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


def _list_services(explorer: Explorer) -> str:
    counts = explorer.services()
    lines = []
    for spec in explorer.specs.values():
        tags = sorted((tag, n) for (name, tag), n in counts.items() if name == spec.name)
        lines.append(
            f"{spec.title} ({spec.name}, {len(spec.operations)} operations, base URL {spec.base_url or 'none'}):"
        )
        lines.extend(f"- {explorer.service_name(spec.name, tag)}: {n}" for tag, n in tags)
    for name, reason in explorer.failures.items():
        lines.append(f"API {name!r} failed to load: {reason}")
    if not lines:
        return "No API is configured: add specs under `plugins: {openapi: {specs: [...]}}` in the gateway's YAML file."
    lines.append("Next: search_api(service=NAME) lists a service's endpoints, search_api(query=...) searches them all.")
    return "\n".join(lines)


def _list_service(explorer: Explorer, name: str) -> str:
    spec_name, tag = explorer.service(name)
    ops = [op for op in explorer.specs[spec_name].operations.values() if tag in op.tags]
    lines = [f"{explorer.service_name(spec_name, tag)}: {len(ops)} operations"]
    for op in ops[:MAX_LISTED]:
        summary = f" — {short(op.summary, 100)}" if op.summary else ""
        lines.append(f"- {op.id}: {op.title}{summary}{' [deprecated]' if op.deprecated else ''}")
    if len(ops) > MAX_LISTED:
        lines.append(f"… {len(ops) - MAX_LISTED} more; narrow down with search_api(query=...)")
    lines.append("Next: search_api(operationId=ID) shows an operation's parameters, body and responses.")
    return "\n".join(lines)


async def _search(explorer: Explorer, query: str, limit: int, service: str | None) -> str:
    if service:
        spec_name, tag = explorer.service(service)
    hits, dense = await explorer.search(query, MAX_LIMIT * 3 if service else limit)
    ops = {op.id: op for op in explorer.operations()}
    chosen = [
        (hit, ops[hit.name])
        for hit in hits
        if not service or (ops[hit.name].spec == spec_name and tag in ops[hit.name].tags)
    ][:limit]
    ranking = "semantic + keyword" if dense else "keyword (BM25) only"
    if not chosen:
        return f"No operation matches {query!r} ({ranking} ranking). Try other words, or list a service."
    lines = [f"{len(chosen)} best operations for {query!r} ({ranking} ranking; score 0..1):"]
    for hit, op in chosen:
        summary = f" — {short(op.summary, 100)}" if op.summary else ""
        lines.append(f"- {op.id} ({hit.score:.2f}): {op.title}{summary}")
    lines.append("Next: search_api(operationId=ID) for the parameters, then call_api(operationId=ID, ...).")
    return "\n".join(lines)


def create_server(config: Config, config_file: Path, settings: Settings | None = None) -> MCPServer[Any]:
    """The `openapi` server over the configured APIs. `settings` gives the embedding model and cache
    (None: keyword search only, as in tests that do not need the model)."""
    explorer = Explorer(config, config_file, settings)
    server: MCPServer[Any] = MCPServer(
        "openapi",
        instructions=(
            "Explore and call HTTP APIs described by OpenAPI specs: search_api() lists services, "
            "search_api(query=...) finds operations, search_api(operationId=...) shows one, "
            "search_api(schema=...) shows a data type, call_api(...) sends a request."
        ),
    )
    server.explorer = explorer  # type: ignore[attr-defined]  # for tests and benchmarks

    @server.tool(annotations=SEARCH_ANNOTATIONS)
    async def search_api(
        query: Annotated[
            str | None, Field(description="Plain-language description of what to do, e.g. 'close an issue'.")
        ] = None,
        service: Annotated[str | None, Field(description="A service (tag) name: lists its endpoints.")] = None,
        operationId: Annotated[  # noqa: N803 - the OpenAPI name, as clients know it
            str | None, Field(description="An operation id: shows its parameters, body and responses.")
        ] = None,
        schema: Annotated[
            str | None, Field(description="A schema name, full (google.protobuf.Timestamp) or short (Timestamp).")
        ] = None,
        limit: Annotated[
            int, Field(description="Most operations a query returns.", ge=1, le=MAX_LIMIT)
        ] = DEFAULT_LIMIT,
    ) -> CallToolResult:
        """Find API operations and read their schemas. No arguments: the services with their operation counts;
        `service`: its endpoints; `query`: the best-matching operations, scored 0..1 (with `service`: within it);
        `operationId`: its request and response schema; `schema`: a data type, with enum values."""
        await explorer.load()
        try:
            if operationId:
                op = explorer.operation(operationId)
                return _text(describe_operation(explorer.specs[op.spec], op))
            if schema:
                spec, name = explorer.schema(schema)
                return _text(describe_schema(spec, name))
            if query is not None:
                if not query.strip():
                    raise ToolError("query is empty; describe the task in a few words, e.g. 'list open issues'")
                return _text(await _search(explorer, query.strip(), limit, service))
            if service:
                return _text(_list_service(explorer, service))
            return _text(_list_services(explorer))
        except NotFound as exc:
            raise ToolError(str(exc)) from None

    @server.tool(annotations=CALL_ANNOTATIONS)
    async def call_api(
        operationId: Annotated[str, Field(description="The operation to call, as search_api reports it.")],  # noqa: N803
        path_params: Annotated[dict[str, Any] | None, Field(description="Values of the path's {placeholders}.")] = None,
        query: Annotated[dict[str, Any] | None, Field(description="Query string parameters.")] = None,
        body: Annotated[Any, Field(description="The request body: a JSON value (or a string for text bodies).")] = None,
        headers: Annotated[dict[str, str] | None, Field(description="Extra request headers.")] = None,
    ) -> Annotated[CallToolResult, ApiResponse]:
        """Send a request to an API operation. Inputs are checked against the spec first; credentials are added
        by the gateway. Returns the status, the headers that matter and the body (cut past the size limit)."""
        await explorer.load()
        try:
            op = explorer.operation(operationId)
        except NotFound as exc:
            raise ToolError(str(exc)) from None
        spec = explorer.specs[op.spec]
        spec_config = explorer.spec_configs[op.spec]
        validator = await anyio.to_thread.run_sync(explorer.validator, spec)
        try:
            inputs = check_inputs(
                spec, op, validator, path_params=path_params or {}, query=query or {}, headers=headers or {}, body=body
            )
            credentials = Credentials.from_environment(spec_config, explorer.environ)
            response = await send(spec, spec_config, op, inputs, credentials)
        except InputError as exc:
            raise ToolError(f"invalid input for {op.id}: {exc}; nothing was sent") from None
        except CallError as exc:
            raise ToolError(str(exc)) from None
        return CallToolResult(
            content=[TextContent(type="text", text=response_text(response))],
            structured_content=response.model_dump(mode="json"),
        )

    return server


@hookimpl
def gateway_register_servers(register: RegisterServer, settings: Settings, config: Config | None) -> None:
    """Serve the configured APIs as the `openapi` server (nothing when no spec is configured)."""
    config = config or Config()
    if not config.specs:
        return
    for spec in config.specs:
        missing = missing_variables(spec, os.environ)
        if missing:
            logger.warning("openapi: API %r: credential variable(s) not set: %s", spec.name, ", ".join(missing))
    names = ", ".join(s.name for s in config.specs)
    register(
        "openapi",
        create_server(config, Path(settings.config), settings),
        description=f"Search and call HTTP APIs described by OpenAPI specs ({names}).",
        capabilities=["api", "http", "rest", "openapi"],
    )
