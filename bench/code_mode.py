"""What code mode saves a model, and what it costs the gateway.

    python bench/code_mode.py            # figures on stdout
    python bench/code_mode.py --json     # and one JSON object as the last line

Part 1, tokens and turns. Six multi-step tasks over real servers (the bundled clock, notes and
sql plugins in memory; the filesystem and memory servers from npm over stdio, from the
compatibility cache, installed on first use) are done three ways, every call really made
through a gateway in process (a fresh one per mode, so each starts from the same state):

- all: the model sees every tool's definition and calls tools one by one; independent calls go
  in one turn (parallel tool calls), each dependent step is another turn;
- dynamic: it starts with `search_tools` and `call_tool`, searches once per tool it needs (the
  found tools' definitions join its list), then calls as in `all`;
- code: it searches once, asks `describe_tools` for the signatures it needs, then writes one
  program per step it cannot plan ahead (each task's programs are written out in `tasks` below);
  "code, tools known" is a model that already knows the signatures (its second such task).

"Tokens the model sees" = the tool list it is given + every request it writes (arguments, a
query, a program) + every result it reads (the text content), each counted once, with the
bundled model's word-piece tokenizer (all-MiniLM-L6-v2's vocabulary, shipped in the wheel).
A model's own tokenizer differs, by about as much for every mode; the ratios are what to read.
Turns = model turns, the final answer included.

Part 2, the gateway's costs, medians over rounds in this process, on a gateway with only the demo
server: a `mem__echo` call through the call chain; the same call made from a program (a run of N
sequential calls minus an empty run, per call); the start of a run (a warm worker's checkout and
the `import tools` feed) and a whole empty run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio  # noqa: E402
import mcp_types as types  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import plugins.sql  # noqa: E402
from gateway.codemode import CodeMode  # noqa: E402
from gateway.config.routing_settings import CodeModeSettings, EmbeddingSettings, RoutingSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.router.service import RouterService, build_router  # noqa: E402
from gateway.serving.server import GatewayServer  # noqa: E402
from gateway.upstreams.upstream import UpstreamSpec  # noqa: E402
from plugins.clock import create_server as create_clock  # noqa: E402
from plugins.notes import create_server as create_notes  # noqa: E402
from tests.servers.demo_server import create_server as create_demo  # noqa: E402

TOKENIZER = REPO / "gateway" / "router" / "assets" / "all-MiniLM-L6-v2" / "tokenizer.json"
ALLOW_WRITES = ["notes__add_note", "sql__execute_sql", "memory__create_*"]


def tokenizer() -> Callable[[str], int]:
    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.no_truncation()
    tok.no_padding()
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def definition(tool: types.Tool) -> str:
    """A tool as a model is given it: name, description, input schema."""
    return json.dumps({"name": tool.name, "description": tool.description or "", "input_schema": tool.input_schema})


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


Call = tuple[str, dict[str, Any]]


@dataclass
class Task:
    """One multi-step task: the calls a model makes in `all` mode, in waves (one wave = one turn:
    its calls do not depend on one another); the searches it makes in `dynamic` mode; and, in
    `code` mode, its search, the names it describes and its programs (one per turn)."""

    name: str
    waves: list[list[Call]] | Callable[[dict[str, Any]], list[list[Call]]]
    searches: list[str]
    describe: list[str]
    programs: list[str]
    check: Callable[[str], bool] = field(default=lambda text: True)


def tasks(folder: Path) -> list[Task]:
    top3 = (
        "SELECT c.name, COUNT(o.id) AS orders FROM customers c JOIN orders o ON o.customer_id = c.id "
        "GROUP BY c.name ORDER BY orders DESC, c.name LIMIT 3"
    )
    by_status = "SELECT status, COUNT(*) FROM orders GROUP BY status ORDER BY status"
    deadlines = ["2026-12-24", "2027-01-15", "2027-02-01", "2027-03-31", "2027-06-30"]
    files = sorted(folder.iterdir())
    largest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:3]
    return [
        Task(
            "notes: add three notes, find the budget ones",
            [
                [
                    ("notes__add_note", {"title": t, "text": f"About {t}.", "tags": g})
                    for t, g in [("Budget 2026", ["money"]), ("Trip to Lyon", ["travel"]), ("Budget review", ["money"])]
                ],
                [("notes__search_notes", {"query": "budget"})],
            ],
            ["take a new note", "search notes by words"],
            ["notes__add_note", "notes__search_notes"],
            [
                'import asyncio\nnotes = [("Budget 2026", ["money"]), ("Trip to Lyon", ["travel"]), '
                '("Budget review", ["money"])]\nawait asyncio.gather(*[tools.notes__add_note(title=t, '
                'text="About " + t + ".", tags=g) for t, g in notes])\nfound = await '
                'tools.notes__search_notes(query="budget")\nsorted(h["title"] for h in found["hits"])'
            ],
            lambda text: "Budget 2026" in text and "Budget review" in text,
        ),
        Task(
            "sql: schema, top 3 customers by orders, orders by status",
            [
                [("sql__describe_schema", {})],
                [
                    ("sql__execute_sql", {"sql": top3, "dry_run": False}),
                    ("sql__execute_sql", {"sql": by_status, "dry_run": False}),
                ],
            ],
            ["database tables and columns", "run SQL on the database"],
            ["sql__describe_schema", "sql__execute_sql"],
            [
                'schema = await tools.sql__describe_schema(format="json")\n'
                '{t["name"]: [c["name"] for c in t["columns"]] for t in schema["tables"]}',
                "import asyncio\ntop, status = await asyncio.gather(\n"
                f"    tools.sql__execute_sql(sql={top3!r}, dry_run=False),\n"
                f"    tools.sql__execute_sql(sql={by_status!r}, dry_run=False),\n)\n"
                '{"top": top["results"][0]["rows"], "by_status": status["results"][0]["rows"]}',
            ],
            lambda text: "paid" in text and "shipped" in text,
        ),
        Task(
            "clock: business days from now to five deadlines",
            lambda found: [
                [("clock__now", {"timezone": "UTC"})],
                [("clock__date_difference", {"start": found.get("today", ""), "end": d}) for d in deadlines],
            ],
            ["current date and time", "days between two dates"],
            ["clock__now", "clock__date_difference"],
            [
                "import asyncio\nnow = await tools.clock__now(timezone='UTC')\ntoday = now['iso'][:10]\n"
                "spans = await asyncio.gather(*[tools.clock__date_difference(start=today, end=d)\n"
                f"    for d in {deadlines!r}])\n"
                f"dict(zip({deadlines!r}, [s['business_days'] for s in spans]))"
            ],
        ),
        Task(
            "filesystem: list a folder, read the three largest files' first lines",
            [
                [("fs__list_directory_with_sizes", {"path": str(folder), "sortBy": "size"})],
                [("fs__read_text_file", {"path": str(p)}) for p in largest],
            ],
            ["list a directory with file sizes", "read a text file"],
            ["fs__list_directory_with_sizes", "fs__read_text_file"],
            [
                f"listing = await tools.fs__list_directory_with_sizes(path={str(folder)!r}, sortBy='size')\n"
                "names = [l.split()[1] for l in listing['content'].splitlines() if l.startswith('[FILE]')][:3]\n"
                "firsts = {}\nfor n in names:\n"
                f"    text = await tools.fs__read_text_file(path={str(folder)!r} + '/' + n)\n"
                "    firsts[n] = text['content'].splitlines()[0]\nfirsts"
            ],
            lambda text: largest[0].name in text,
        ),
        Task(
            "memory: create people and relations, query them back",
            [
                [
                    (
                        "memory__create_entities",
                        {
                            "entities": [
                                {"name": n, "entityType": "person", "observations": [j]}
                                for n, j in [("Ada", "mathematician"), ("Grace", "admiral"), ("Alan", "mathematician")]
                            ]
                        },
                    )
                ],
                [
                    (
                        "memory__create_relations",
                        {"relations": [{"from": "Ada", "to": "Alan", "relationType": "inspired"}]},
                    )
                ],
                [("memory__search_nodes", {"query": "mathematician"})],
            ],
            ["create entities in the knowledge graph", "create relations", "search the knowledge graph"],
            ["memory__create_entities", "memory__create_relations", "memory__search_nodes"],
            [
                "people = [('Ada', 'mathematician'), ('Grace', 'admiral'), ('Alan', 'mathematician')]\n"
                "await tools.memory__create_entities(entities=[{'name': n, 'entityType': 'person', "
                "'observations': [j]} for n, j in people])\n"
                "await tools.memory__create_relations(relations=[{'from': 'Ada', 'to': 'Alan', "
                "'relationType': 'inspired'}])\nfound = await tools.memory__search_nodes(query='mathematician')\n"
                "sorted(e['name'] for e in found['entities'])"
            ],
            lambda text: "Ada" in text and "Alan" in text,
        ),
        Task(
            "sql + notes: note the top customer's order count",
            lambda found: [
                [("sql__execute_sql", {"sql": top3, "dry_run": False})],
                [
                    (
                        "notes__add_note",
                        {"title": "Top customer", "text": found.get("top_customer", ""), "tags": ["sales"]},
                    )
                ],
            ],
            ["run SQL on the database", "take a new note"],
            ["sql__execute_sql", "notes__add_note"],
            [
                f"rows = (await tools.sql__execute_sql(sql={top3!r}, dry_run=False))['results'][0]['rows']\n"
                "name, count = rows[0]\nnote = await tools.notes__add_note(title='Top customer', "
                "text=name + ' has ' + str(count) + ' orders', tags=['sales'])\nnote['name']"
            ],
            lambda text: "top-customer" in text,
        ),
    ]


@asynccontextmanager
async def gateway(tmp: Path, mode: str, npm: dict[str, Path], folder: Path) -> AsyncIterator[GatewayServer]:
    settings = Settings(
        data_dir=tmp / "data",
        routing=RoutingSettings(mode=mode),  # type: ignore[arg-type]
        embedding=EmbeddingSettings(enabled=False),
        codemode=CodeModeSettings(allow_writes=ALLOW_WRITES),
    )
    env = {**os.environ, "MEMORY_FILE_PATH": str(tmp / "memory.jsonl")}
    specs = [
        UpstreamSpec(id="clock", prefix="clock", transport="memory", target=create_clock()),
        UpstreamSpec(id="notes", prefix="notes", transport="memory", target=create_notes(tmp / "notes")),
        UpstreamSpec(
            id="sql",
            prefix="sql",
            transport="memory",
            target=plugins.sql.create_server(plugins.sql.Config(), tmp / "data"),
        ),
        UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_demo("mem")),
        UpstreamSpec(
            id="fs",
            prefix="fs",
            transport="stdio",
            target=StdioServerParameters(command=str(npm["filesystem"]), args=[str(folder)], env=env),
        ),
        UpstreamSpec(
            id="memory",
            prefix="memory",
            transport="stdio",
            target=StdioServerParameters(command=str(npm["memory"]), args=[], env=env),
        ),
    ]
    registry = Registry(specs, settings)
    async with registry.running():
        router = RouterService(registry, settings, lambda: build_router(settings, None))
        registry.task_group.start_soon(router.run)
        await registry.wait_settled(60)
        yield GatewayServer(registry, settings, router)


def found_facts(results: list[str]) -> dict[str, Any]:
    """What a model would read off earlier results to write a dependent call (tasks with a callable `waves`)."""
    facts: dict[str, Any] = {}
    for text in results:
        if " in UTC" in text and "unix time" in text:
            facts["today"] = text.split()[1][:10]
        if text.startswith("|") or "name" in text:
            for line in text.splitlines():
                cells = [c.strip() for c in line.strip("|").split("|")]
                if len(cells) == 2 and cells[1].isdigit() and "top_customer" not in facts:
                    facts["top_customer"] = f"{cells[0]} has {cells[1]} orders"
    return facts


async def run_tool_mode(gw: GatewayServer, task: Task, mode: str, count: Callable[[str], int]) -> dict[str, Any]:
    """`all` or `dynamic`: the calls one by one, wave by wave; what the model saw and its turns."""
    async with Client(gw.server) as client:
        listed = (await client.list_tools()).tools
        seen = sum(count(definition(t)) for t in listed)
        turns = 0
        if mode == "dynamic":
            for query in task.searches:
                result = await client.call_tool("search_tools", {"query": query, "limit": 5})
                seen += count(json.dumps({"query": query, "limit": 5})) + count(text_of(result))
                turns += 1
            relisted = (await client.list_tools()).tools
            seen += sum(count(definition(t)) for t in relisted if t.name not in {x.name for x in listed})
        results: list[str] = []
        waves = task.waves if isinstance(task.waves, list) else None
        index = 0
        while True:
            if waves is None:
                waves_now = task.waves(found_facts(results))  # type: ignore[operator]
            else:
                waves_now = waves
            if index >= len(waves_now):
                break
            for name, arguments in waves_now[index]:
                result = await client.call_tool(name, arguments)
                if result.is_error:
                    raise RuntimeError(f"{task.name}: {name} failed: {text_of(result)}")
                request = {"name": name, "arguments": arguments} if mode == "dynamic" else arguments
                seen += count(json.dumps(request)) + count(text_of(result))
                results.append(text_of(result))
            turns += 1
            index += 1
        return {"tokens": seen, "turns": turns + 1, "calls": sum(len(w) for w in waves_now)}


async def run_code_mode(gw: GatewayServer, task: Task, count: Callable[[str], int]) -> dict[str, Any]:
    async with Client(gw.server) as client:
        seen = sum(count(definition(t)) for t in (await client.list_tools()).tools)
        query = " and ".join(task.searches)
        found = await client.call_tool("search_tools", {"query": query, "limit": 8})
        seen += count(json.dumps({"query": query, "limit": 8})) + count(text_of(found))
        described = await client.call_tool("describe_tools", {"names": task.describe})
        seen += count(json.dumps({"names": task.describe})) + count(text_of(described))
        last = ""
        for program in task.programs:
            result = await client.call_tool("execute", {"code": program})
            if result.is_error:
                raise RuntimeError(f"{task.name}: the program failed: {text_of(result)}")
            seen += count(program) + count(text_of(result))
            last = text_of(result)
        if not task.check(last):
            raise RuntimeError(f"{task.name}: wrong answer: {last}")
        return {"tokens": seen, "turns": 2 + len(task.programs) + 1, "answer": last}


async def overhead(tmp: Path, rounds: int, calls: int) -> dict[str, float]:
    """Medians (ms), on a gateway with the demo server alone (nothing else running beside it): a call
    through the chain (`Registry.call_tool`), the same call from a program (a run of `calls`
    sequential calls minus an empty run, per call), a run's start and an empty run. Interleaved
    round by round, so both see the same machine load."""
    settings = Settings(data_dir=tmp / "data", embedding=EmbeddingSettings(enabled=False))
    registry = Registry([UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_demo("mem"))], settings)
    chain, inner, empty, checkout = [], [], [], []
    program = f"for i in range({calls}):\n    await tools.mem__echo(text='x')\n"
    async with registry.running():
        await registry.wait_settled(30)
        code = CodeMode(settings.codemode, lambda: registry.task_group)
        offered = {name: entry.item for name, entry in registry.catalog.tools.items()}

        async def call(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
            return await registry.call_tool(name, arguments)

        await code.execute("1", offered, call)  # the pool's first start is not a run's cost
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(calls):
                await registry.call_tool("mem__echo", {"text": "x"})
            chain.append((time.perf_counter() - started) * 1000 / calls)
            started = time.perf_counter()
            _, outcome = await code.execute("1", offered, call)
            empty_ms = (time.perf_counter() - started) * 1000
            empty.append(empty_ms)
            checkout.append(outcome.checkout_ms)
            started = time.perf_counter()
            _, outcome = await code.execute(program, offered, call)
            assert outcome.error is None, outcome.error
            inner.append(((time.perf_counter() - started) * 1000 - empty_ms) / calls)
    return {
        "chain_call_ms": statistics.median(chain),
        "inner_call_ms": statistics.median(inner),
        "run_start_ms": statistics.median(checkout),
        "empty_run_ms": statistics.median(empty),
    }


def make_folder(root: Path) -> Path:
    folder = root / "files"
    folder.mkdir()
    for index, size in enumerate([120, 5200, 800, 16000, 2400, 9000, 60, 300]):
        lines = [f"file {index} line {n}: " + "lorem ipsum dolor sit amet " * 2 for n in range(size // 60 + 1)]
        (folder / f"report-{index}.txt").write_text("\n".join(lines)[:size])
    return folder


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from bench.compat import install
    from bench.compat.servers import SERVERS

    chosen = [s for s in SERVERS if s.id in ("filesystem", "memory")]
    cache = install.install_servers(chosen)
    npm = {s.id: Path(install.server_command(s, cache)) for s in chosen}
    count = tokenizer()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        folder = make_folder(root)
        per_mode: dict[str, list[dict[str, Any]]] = {}
        for mode in ("all", "dynamic", "code"):
            (root / mode).mkdir()
            with anyio.fail_after(600):
                async with gateway(root / mode, mode, npm, folder) as gw:
                    per_mode[mode] = [
                        await (run_code_mode(gw, t, count) if mode == "code" else run_tool_mode(gw, t, mode, count))
                        for t in tasks(folder)
                    ]
        (root / "overhead").mkdir()
        with anyio.fail_after(600):
            costs = await overhead(root / "overhead", args.rounds, args.calls)
        for index, task in enumerate(tasks(folder)):
            rows.append({"task": task.name, **{m: per_mode[m][index] for m in per_mode}})
    return {"tasks": rows, "overhead": costs, "rounds": args.rounds, "calls": args.calls}


def report(figures: dict[str, Any]) -> None:
    print("| task | calls | tokens all | dynamic | code | code/all | turns all | dynamic | code | code, tools known |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    totals = {"all": 0, "dynamic": 0, "code": 0}
    for row in figures["tasks"]:
        tokens = {m: row[m]["tokens"] for m in totals}
        for m in totals:
            totals[m] += tokens[m]
        print(
            f"| {row['task']} | {row['all']['calls']} | {tokens['all']:,} | {tokens['dynamic']:,} | {tokens['code']:,} "
            f"| {tokens['code'] / tokens['all']:.2f} | {row['all']['turns']} | {row['dynamic']['turns']} "
            f"| {row['code']['turns']} | {row['code']['turns'] - 2} |"
        )
    print(
        f"| all six | | {totals['all']:,} | {totals['dynamic']:,} | {totals['code']:,} "
        f"| {totals['code'] / totals['all']:.2f} | | | | |"
    )
    costs = figures["overhead"]
    print()
    print(f"medians over {figures['rounds']} rounds of {figures['calls']} calls:")
    inner, chain = costs["inner_call_ms"], costs["chain_call_ms"]
    print(f"  a call through the chain (Registry.call_tool, mem__echo in memory): {chain:.2f} ms")
    print(f"  the same call from a program (sandbox -> worker pipe -> chain): {inner:.2f} ms")
    print(f"    added per inner call: {inner - chain:+.2f} ms (x{inner / chain:.2f})")
    print(f"  a run's start (worker checkout + `import tools`): {costs['run_start_ms']:.2f} ms")
    print(f"  an empty run (a program of `1`: checkout, two feeds, the report): {costs['empty_run_ms']:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="calls per round for the latency figures")
    parser.add_argument("--json", action="store_true", help="print one JSON object last on stdout")
    args = parser.parse_args()
    figures = anyio.run(main_async, args)
    report(figures)
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
