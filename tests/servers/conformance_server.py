"""The MCP conformance suite's server fixtures, served by the Python SDK's low-level server.

`@modelcontextprotocol/conformance` tests a server by calling tools, resources and prompts
of fixed names (`test_simple_text`, `test://static-text`, `test_prompt_with_arguments`...)
that its own TypeScript "everything" server implements; that server is not published, so
this script implements the same fixtures, as each scenario's description asks, on the SDK
the gateway itself uses. It is a real upstream: `tests/test_conformance.py` runs the suite
against it directly and through the gateway.

Run `python tests/servers/conformance_server.py [--port N]`: streamable HTTP on 127.0.0.1
at `/mcp`, printing `PORT=<n>` once listening.
"""

from __future__ import annotations

import argparse
import base64
import json
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.message import ServerMessageMetadata

PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
        "0000000c4944415408d763f8cfc000000301010018dd8db00000000049454e44ae426082"
    )
).decode()
"""A 1x1 red pixel."""

WAV = base64.b64encode(
    b"RIFF" + (36 + 2).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (8000).to_bytes(4, "little")
    + (16000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    + b"data" + (2).to_bytes(4, "little") + b"\x00\x00"
).decode()  # fmt: skip
"""One silent 16-bit mono sample at 8 kHz."""

NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}

TOOLS = [
    types.Tool(name="test_simple_text", description="Returns simple text.", input_schema=NO_ARGS),
    types.Tool(name="test_image_content", description="Returns a PNG image.", input_schema=NO_ARGS),
    types.Tool(name="test_audio_content", description="Returns a WAV sound.", input_schema=NO_ARGS),
    types.Tool(name="test_embedded_resource", description="Returns an embedded resource.", input_schema=NO_ARGS),
    types.Tool(name="test_multiple_content_types", description="Text, image and resource.", input_schema=NO_ARGS),
    types.Tool(name="test_tool_with_logging", description="Logs three lines while it runs.", input_schema=NO_ARGS),
    types.Tool(name="test_tool_with_progress", description="Reports progress 0, 50, 100.", input_schema=NO_ARGS),
    types.Tool(name="test_error_handling", description="Always returns an error result.", input_schema=NO_ARGS),
    types.Tool(
        name="test_sampling",
        description="Asks the client's model (sampling).",
        input_schema={"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
    ),
    types.Tool(
        name="test_elicitation",
        description="Asks the user (elicitation).",
        input_schema={"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
    ),
    types.Tool(name="test_elicitation_sep1034_defaults", description="Elicits with defaults.", input_schema=NO_ARGS),
    types.Tool(name="test_elicitation_sep1330_enums", description="Elicits with enums.", input_schema=NO_ARGS),
    types.Tool(
        name="json_schema_2020_12_tool",
        description="Tool with JSON Schema 2020-12 features",
        input_schema={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                }
            },
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    ),
]

DEFAULTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "description": "Verified", "default": True},
    },
}

ENUMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                ]
            },
        },
    },
}


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def _ask(ctx: Any, params: types.CallToolRequestParams, request: Any, answer_type: type[Any]) -> Any:
    """Ask the client: a server-to-client request in the handshake era; at 2026-07-28, which has
    no back-channel, an `InputRequiredResult` first and the answer from the client's retry."""
    if ctx.protocol_version < "2026":
        return await ctx.session.send_request(request, answer_type, metadata=_related(ctx))
    answer = (params.input_responses or {}).get("ask")
    if answer is None:
        return types.InputRequiredResult(input_requests={"ask": request})
    return answer


def _related(ctx: Any) -> ServerMessageMetadata:
    return ServerMessageMetadata(related_request_id=ctx.request_id)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
    name, args = params.name, params.arguments or {}
    session = ctx.session
    if name == "test_simple_text":
        return _text("This is a simple text response for testing.")
    if name == "test_image_content":
        return types.CallToolResult(content=[types.ImageContent(type="image", data=PNG, mime_type="image/png")])
    if name == "test_audio_content":
        return types.CallToolResult(content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")])
    if name == "test_embedded_resource":
        resource = types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
        )
        return types.CallToolResult(content=[types.EmbeddedResource(type="resource", resource=resource)])
    if name == "test_multiple_content_types":
        resource = types.TextResourceContents(
            uri="test://mixed-content-resource", mime_type="application/json", text=json.dumps({"test": "data"})
        )
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text="Multiple content types test:"),
                types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                types.EmbeddedResource(type="resource", resource=resource),
            ]
        )
    if name == "test_tool_with_logging":
        for i, line in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
            if i:
                await anyio.sleep(0.05)
            await session.send_log_message("info", line, related_request_id=ctx.request_id)
        return _text("Tool with logging executed successfully")
    if name == "test_tool_with_progress":
        for i, progress in enumerate((0, 50, 100)):
            if i:
                await anyio.sleep(0.05)
            await session.report_progress(progress, 100)
        return _text("Tool with progress executed successfully")
    if name == "test_error_handling":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="This tool intentionally returns an error for testing")],
            is_error=True,
        )
    if name == "test_sampling":
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=args["prompt"]))
        ask = types.CreateMessageRequestParams(messages=[message], max_tokens=100)
        request = types.CreateMessageRequest(params=ask)
        answer = await _ask(ctx, params, request, types.CreateMessageResult)
        if isinstance(answer, types.InputRequiredResult):
            return answer
        content = answer.content
        return _text(f"LLM response: {content.text if isinstance(content, types.TextContent) else content}")
    if name in ("test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums"):
        schema = {
            "test_elicitation": {
                "type": "object",
                "properties": {
                    "username": {"type": "string", "description": "User's response"},
                    "email": {"type": "string", "description": "User's email address"},
                },
                "required": ["username", "email"],
            },
            "test_elicitation_sep1034_defaults": DEFAULTS_SCHEMA,
            "test_elicitation_sep1330_enums": ENUMS_SCHEMA,
        }[name]
        message = args.get("message", "Please answer")
        elicit = types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))
        result = await _ask(ctx, params, elicit, types.ElicitResult)
        if isinstance(result, types.InputRequiredResult):
            return result
        return _text(f"User response: action={result.action}, content={json.dumps(result.content)}")
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"Unknown tool: {name}")], is_error=True)


RESOURCES = [
    types.Resource(uri="test://static-text", name="static-text", description="A text", mime_type="text/plain"),
    types.Resource(uri="test://static-binary", name="static-binary", description="A PNG", mime_type="image/png"),
    types.Resource(uri="test://watched-resource", name="watched-resource", description="Subscribable"),
]


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    if uri == "test://static-binary":
        contents: types.TextResourceContents | types.BlobResourceContents = types.BlobResourceContents(
            uri=uri, mime_type="image/png", blob=PNG
        )
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        ident = uri.removeprefix("test://template/").removesuffix("/data")
        contents = types.TextResourceContents(
            uri=uri, mime_type="application/json", text=json.dumps({"id": ident, "templateTest": True})
        )
    elif uri in ("test://static-text", "test://watched-resource"):
        contents = types.TextResourceContents(
            uri=uri, mime_type="text/plain", text="This is the content of the static text resource."
        )
    else:
        raise ValueError(f"unknown resource: {uri}")
    return types.ReadResourceResult(contents=[contents])


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A prompt without arguments"),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt with two arguments",
        arguments=[
            types.PromptArgument(name="arg1", description="First argument", required=True),
            types.PromptArgument(name="arg2", description="Second argument", required=True),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt with an embedded resource",
        arguments=[types.PromptArgument(name="resourceUri", description="The resource", required=True)],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
]


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    args = params.arguments or {}

    def user(content: types.ContentBlock) -> types.PromptMessage:
        return types.PromptMessage(role="user", content=content)

    if params.name == "test_simple_prompt":
        messages = [user(types.TextContent(type="text", text="This is a simple prompt for testing."))]
    elif params.name == "test_prompt_with_arguments":
        text = f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"
        messages = [user(types.TextContent(type="text", text=text))]
    elif params.name == "test_prompt_with_embedded_resource":
        resource = types.TextResourceContents(
            uri=args.get("resourceUri", "test://example-resource"), mime_type="text/plain", text="Embedded content."
        )
        messages = [
            user(types.EmbeddedResource(type="resource", resource=resource)),
            user(types.TextContent(type="text", text="Please process the embedded resource above.")),
        ]
    elif params.name == "test_prompt_with_image":
        messages = [
            user(types.ImageContent(type="image", data=PNG, mime_type="image/png")),
            user(types.TextContent(type="text", text="Please analyze the image above.")),
        ]
    else:
        raise ValueError(f"unknown prompt: {params.name}")
    return types.GetPromptResult(messages=messages)


def create_server() -> Server[Any]:
    async def list_tools(ctx: Any, params: object) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def list_resources(ctx: Any, params: object) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=RESOURCES)

    async def list_templates(ctx: Any, params: object) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            uri_template="test://template/{id}/data", name="template", description="Data by id"
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def list_prompts(ctx: Any, params: object) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=PROMPTS)

    async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
        values = [v for v in ("paris", "park", "party") if v.startswith(params.argument.value)]
        return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))

    async def empty(ctx: Any, params: object) -> types.EmptyResult:
        return types.EmptyResult()

    with warnings.catch_warnings():  # logging/setLevel is what the suite's 2025-era client sends
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        return Server(
            "conformance-fixtures",
            version="1.0.0",
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_resources=list_resources,
            on_list_resource_templates=list_templates,
            on_read_resource=read_resource,
            on_subscribe_resource=empty,
            on_unsubscribe_resource=empty,
            on_list_prompts=list_prompts,
            on_get_prompt=get_prompt,
            on_completion=complete,
            on_set_logging_level=empty,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    from http_runner import serve_http

    serve_http(create_server().streamable_http_app(), args.port)


if __name__ == "__main__":
    main()
