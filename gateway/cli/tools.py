"""`mcp-gateway tools`, `call` and `search`: the merged tools, one call, and the router's ranking for a request."""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import mcp_types as types

from gateway.cli.check_report import print_table
from gateway.cli.common import EXIT_FAILED, EXIT_OK, Usage, load, recorded_store, with_registry
from gateway.cli.remote import RemoteError, add_key_option, admin_call, running_gateway
from gateway.config.settings import Settings
from gateway.errors import GatewayError, error_result
from gateway.plugins import PluginManager
from gateway.registry import Registry
from gateway.router.second_stage import SecondStage
from gateway.router.service import RouterService, build_router
from gateway.serving.exposure import NO_TOOL_FITS
from gateway.state.deployment import fingerprint_store

__all__ = ["add_parsers", "run_call", "run_search", "run_tools"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tools = commands.add_parser("tools", help="list the merged tools, or approve a changed or quarantined one")
    tools.add_argument("action", nargs="?", choices=["list", "approve"], default="list")
    tools.add_argument("name", nargs="?", help="approve: the tool, as prefix__tool or server/tool")
    tools.add_argument("--server", help="only this server's tools")
    tools.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_key_option(tools)
    tools.set_defaults(run=run_tools)

    search = commands.add_parser("search", help="rank the live catalog's tools for a request")
    search.add_argument("query", help="the request, in plain words")
    search.add_argument("--k", type=int, default=None, help="how many tools (1-50; default $GATEWAY_ROUTING__K or 8)")
    search.add_argument("--json", action="store_true", help="print JSON for scripts")
    search.set_defaults(run=run_search)

    call = commands.add_parser("call", help="call one tool and print its result")
    call.add_argument("tool", help="the exposed tool name, e.g. clock__now")
    call.add_argument("--args", default="{}", help="arguments as a JSON object")
    call.add_argument("--json", action="store_true", help="print the whole result as JSON")
    call.set_defaults(run=run_call)


def run_tools(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "approve":
        return _approve(settings, args.name, args.key)
    _, registry, _, _ = load(settings, serving=False)
    return anyio.run(_tools, registry, args.server, args.json)


def run_call(args: argparse.Namespace, settings: Settings) -> int:
    _, registry, _, _ = load(settings, serving=False)
    return anyio.run(_call, registry, args.tool, args.args, args.json)


def run_search(args: argparse.Namespace, settings: Settings) -> int:
    _, registry, pm, _ = load(settings, serving=False)
    return anyio.run(_search, registry, pm, args.query, args.k, args.json)


def _approve(settings: Settings, name: str | None, key: str | None) -> int:
    """`tools approve NAME`: trust a tool's current definition (a change, or a quarantined description).

    Through the running gateway's admin API when one serves HTTP (it is callable at once, and the
    approval is audited), else in the deployment's store, the shared database or the data dir (a running
    gateway notices it within seconds)."""
    runtime = running_gateway(settings)
    if name and runtime is not None and runtime.url is not None:
        try:
            answer = admin_call(runtime, "POST", f"/tools/{name}/approve", key)
        except RemoteError as exc:
            print(f"mcp-gateway: {exc}", file=sys.stderr)
            return EXIT_FAILED
        for approved in answer.get("approved", []):
            print(f"approved {approved} on the gateway at {runtime.url}")
        return EXIT_OK
    store = fingerprint_store(settings.database_url, settings.data_dir, f"cli-{settings.replica_id}")
    if not name:
        pending = ", ".join(t.exposed for t in store.pending()) or "none"
        raise Usage(f"tools approve needs a tool name (prefix__tool or server/tool); changed tools: {pending}")
    found = store.find(name)
    if not found:
        raise Usage(f"no tool {name!r} has been seen; run `mcp-gateway check` first, or give server/tool")
    for stored in found:
        store.approve(stored)
        print(f"approved {stored.exposed} (server {stored.server!r}, tool {stored.tool!r})")
    print("A running gateway serves it again within seconds.", file=sys.stderr)
    return EXIT_OK


async def _tools(registry: Registry, server: str | None, as_json: bool) -> int:
    if server is not None and server not in registry.upstreams:
        raise Usage(f"unknown server {server!r}; servers: {', '.join(registry.upstreams) or 'none'}")

    async def body(reg: Registry) -> list[types.Tool]:
        return [e.item for e in reg.catalog.tools.values() if server is None or e.server_id == server]

    tools = await with_registry(registry, body)
    if as_json:
        print(json.dumps([t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools], indent=2))
    else:
        print_table(
            [[t.name, (t.description or "").strip().split("\n")[0][:80]] for t in tools], ["TOOL", "DESCRIPTION"]
        )
    return EXIT_OK


async def _call(registry: Registry, tool: str, raw_args: str, as_json: bool) -> int:
    try:
        arguments = json.loads(raw_args)
    except json.JSONDecodeError as exc:
        raise Usage(f"--args is not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise Usage('--args must be a JSON object, like \'{"timezone": "Europe/Paris"}\'')

    owner = registry.owner_of(tool)
    async with registry.running():
        # Only the server that owns the tool matters: a slow or hanging other one must not delay the call.
        with anyio.move_on_after(registry.settings.startup_timeout + 5):
            if owner is not None:
                await owner.wait_settled()
            else:
                await registry.wait_settled()
        try:
            result = await registry.call_tool(tool, arguments)
        except GatewayError as exc:
            result = error_result(exc)
    if as_json:
        print(
            json.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True), indent=2, ensure_ascii=False)
        )
    else:
        for block in result.content:
            print(_describe_block(block))
    return EXIT_FAILED if result.is_error else EXIT_OK


async def _search(registry: Registry, pm: PluginManager, query: str, k: int | None, as_json: bool) -> int:
    settings = registry.settings
    k = settings.routing.k if k is None else k
    if not query.strip() or not 1 <= k <= 50:
        raise Usage("search needs a non-empty QUERY and --k from 1 to 50")
    async with registry.running():
        await registry.wait_settled(settings.startup_timeout + 5)
        store = recorded_store(settings)
        second = SecondStage(settings.second_stage, settings.routing.no_fit_threshold)
        try:
            router = RouterService(registry, settings, lambda: build_router(settings, pm), store)
            router.router = await anyio.to_thread.run_sync(router.make_router)
            await router.sync()
            full = router.router
            if full is not None and full.dense:  # the full texts too, as a serving gateway ranks once it has them
                await anyio.to_thread.run_sync(full.enrich)
            await router.refresh_signals()  # rank as the serving gateway does, with what it learnt
            # both stages, as search_tools and POST /route run them (no client model to sample here)
            hits = await router.search(query, second.wanted(k), settings.routing.threshold)
            routing = await second.refine(query, hits, k)
            degraded = router.router is not None and router.router.degraded
            status = router.status
        finally:
            await second.aclose()
            if store is not None:
                store.close()
    if degraded:  # the embedding endpoint is down: say so, the ranking is BM25's
        print(f"mcp-gateway: ranked with {status}", file=sys.stderr)
    if second.enabled:
        print(f"mcp-gateway: second stage: {routing.stage}", file=sys.stderr)
    hits = routing.hits
    if as_json:
        hint = {} if routing.fits else {"hint": True}
        print(json.dumps([{"name": h.name, "score": round(h.score, 4), **hint} for h in hits], indent=2))
    elif not hits:
        print("No tool matches.")
    else:
        if not routing.fits:
            print(f"{NO_TOOL_FITS} The closest tools, as hints only:")
        rows = [
            [str(i), h.name, f"{h.score:.3f}", (h.record.tool.description or "").strip().split("\n")[0][:70]]
            for i, h in enumerate(hits, 1)
        ]
        print_table(rows, ["#", "TOOL", "SCORE", "DESCRIPTION"])
    return EXIT_OK


def _describe_block(block: types.ContentBlock) -> str:
    """A content block for a person: text as is, binary content as a one-line summary."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        contents = block.resource
        if isinstance(contents, types.TextResourceContents):
            return f"[resource {contents.uri}]\n{contents.text}"
        return f"[resource {contents.uri}: {contents.mime_type or 'binary'}]"
    return json.dumps(block.model_dump(by_alias=True, mode="json", exclude_none=True))
