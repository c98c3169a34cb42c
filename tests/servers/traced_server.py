"""An MCP server over streamable HTTP that traces itself, as an instrumented upstream would.

Run `python tests/servers/traced_server.py [http|sse]`; it prints `PORT=<n>` once listening on
127.0.0.1 (path `/mcp`, or `/sse` for the legacy HTTP+SSE transport). Its own TracerProvider sends
every span at once (a simple processor) over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`, as service
`traced-upstream`; the MCP SDK then makes its SERVER span of each request, continuing the trace that
the request's `_meta` carries. It also keeps the `traceparent` header of every HTTP request it gets,
which the tool `traceparent_headers` returns.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import mcp_types as types
from mcp.server.mcpserver import MCPServer, Resolve, Sample
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

HEADERS: list[str] = []


def _ask(question: str) -> Sample:
    return Sample(
        [types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))], max_tokens=20
    )


def main() -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "traced-upstream"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)

    mcp = MCPServer("traced")

    @mcp.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    @mcp.tool()
    async def ask(question: str, answer: Annotated[types.CreateMessageResult, Resolve(_ask)]) -> str:
        """Ask the client's model (sampling, in either protocol era), relayed by the gateway."""
        content = answer.content
        return f"LLM said: {content.text if isinstance(content, types.TextContent) else content}"

    @mcp.tool()
    def traceparent_headers() -> str:
        """The `traceparent` headers of the HTTP requests received so far, as a JSON list."""
        return json.dumps(HEADERS)

    app = mcp.sse_app() if sys.argv[1:] == ["sse"] else mcp.streamable_http_app()

    async def keeping_headers(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            HEADERS.extend(value.decode() for key, value in scope["headers"] if key == b"traceparent")
        await app(scope, receive, send)

    from http_runner import serve_http

    serve_http(keeping_headers)


if __name__ == "__main__":
    main()
