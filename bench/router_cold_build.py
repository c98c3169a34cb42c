"""Cold and warm index builds of catalogs of real tool descriptions, full texts included.

    python bench/router_cold_build.py --set ../shared/eval/livemcpbench --set ../shared/eval/metatool --tools 2500

Two catalogs are built, each with an empty on-disk embedding cache (`SqliteEmbeddingCache`
in a temporary folder) and the bundled model loaded first, as the gateway loads it:

1. the first `--set`'s catalog as it is (LiveMCPBench: 527 tools);
2. `--tools` tools made by repeating all the sets' catalogs in turn: copy 0 as they are,
   copy i > 0 with each server renamed `<server>-copy<i>` and each tool `<tool>_copy<i>`,
   descriptions and schemas unchanged (real descriptions are long: MetaTool's run up to
   8,000 characters), so every document differs and is embedded.

For each: `Router.update` (every short text embedded: the index is searchable), then
`Router.enrich` (every full text embedded, which the gateway does in the background),
timed apart and together; then a warm start: a new `Router` and a new cache on the same
file, `update` (+ `enrich`, with nothing left to embed), as after a restart.

`--document-workers 1,2` compares values of `GATEWAY_EMBEDDING__DOCUMENT_WORKERS` in this
process (one embedder each, loaded first), in turn, `--repeats` times each, and prints
each build and the medians (1 is the path before document workers: texts on the query
session, full texts one at a time):

    python bench/router_cold_build.py --set ../shared/eval/livemcpbench --set ../shared/eval/metatool \
        --tools 2500 --document-workers 1,2 --repeats 2 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mcp_types as types  # noqa: E402

from gateway.config.settings import Settings  # noqa: E402
from gateway.router.base import Embedder, ToolRecord  # noqa: E402
from gateway.router.cache import SqliteEmbeddingCache  # noqa: E402
from gateway.router.eval import load_catalog  # noqa: E402
from gateway.router.index import Router  # noqa: E402
from gateway.router.model_loading import load_embedder  # noqa: E402


def repeated_catalog(catalogs: list[list[ToolRecord]], size: int) -> list[ToolRecord]:
    """`size` tools: the catalogs in turn, renamed from the second round on."""
    out: list[ToolRecord] = []
    copy = 0
    while len(out) < size:
        for records in catalogs:
            for r in records:
                if len(out) == size:
                    return out
                if copy == 0:
                    out.append(r)
                    continue
                server = f"{r.server_id}-copy{copy}"
                tool = f"{r.original_name}_copy{copy}"
                name = f"{server}__{tool}"
                exposed = r.tool.model_copy(update={"name": name})
                assert isinstance(exposed, types.Tool)
                out.append(
                    replace(r, name=name, server_id=server, server_name=server, original_name=tool, tool=exposed)
                )
        copy += 1
    return out


def build(embedder: Embedder, records: list[ToolRecord], folder: Path) -> dict[str, Any]:
    cache = SqliteEmbeddingCache(folder / "embeddings.sqlite")
    router = Router(embedder, cache=cache)
    started = time.perf_counter()
    router.update(records)
    searchable = time.perf_counter() - started
    started = time.perf_counter()
    router.enrich()
    enriched = time.perf_counter() - started
    warm_cache = SqliteEmbeddingCache(folder / "embeddings.sqlite")
    warm = Router(embedder, cache=warm_cache)
    started = time.perf_counter()
    warm.update(records)
    warm_update = time.perf_counter() - started
    started = time.perf_counter()
    left = warm.enrich()
    warm_enrich = time.perf_counter() - started
    return {
        "tools": len(records),
        "cold_searchable_s": round(searchable, 2),
        "cold_full_texts_s": round(enriched, 2),
        "cold_total_s": round(searchable + enriched, 2),
        "warm_s": round(warm_update + warm_enrich, 3),
        "warm_embedded": left,
    }


def _workers(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--document-workers takes integers separated by commas, not {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--document-workers takes integers >= 1, not {text!r}")
    return values


def _report(label: str, figures: dict[str, Any]) -> None:
    print(
        f"{label}: {figures['tools']} tools, cold {figures['cold_searchable_s']} s searchable"
        f" + {figures['cold_full_texts_s']} s full texts = {figures['cold_total_s']} s;"
        f" warm {figures['warm_s']} s ({figures['warm_embedded']} embedded)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--set", type=Path, action="append", default=[], dest="sets")
    parser.add_argument("--tools", type=int, default=2500)
    parser.add_argument(
        "--document-workers",
        type=_workers,
        default=None,
        help="comma-separated values of GATEWAY_EMBEDDING__DOCUMENT_WORKERS to compare in turn (default: the setting)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="builds per variant, in turn (default 1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.sets:
        parser.error("give at least one --set DIR")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    settings = Settings()
    catalogs = [load_catalog(d / "catalog.json") for d in args.sets]
    catalog_list = (
        (args.sets[0].name, catalogs[0]),
        (f"{args.tools} repeated", repeated_catalog(catalogs, args.tools)),
    )
    variants: dict[str, Embedder] = {}
    for workers in args.document_workers or [settings.embedding.document_workers]:
        embedding = settings.embedding.model_copy(update={"document_workers": workers})
        embedder = load_embedder(embedding, settings.data_dir)
        assert embedder is not None
        variants[f"workers={getattr(embedder, 'document_workers', 1)}"] = embedder
    out: dict[str, Any] = {}
    for label, records in catalog_list:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, embedder in variants.items():
                with tempfile.TemporaryDirectory(prefix="router-cold-") as tmp:
                    figures = build(embedder, records, Path(tmp))
                runs[name].append(figures)
                _report(f"{label} [{name}]" if len(variants) > 1 else label, figures)
        out[label] = {
            name: {
                "runs": figures,
                "median_cold_total_s": round(statistics.median(f["cold_total_s"] for f in figures), 2),
                "median_warm_s": round(statistics.median(f["warm_s"] for f in figures), 3),
            }
            for name, figures in runs.items()
        }
        if len(variants) > 1 or args.repeats > 1:
            for name, result in out[label].items():
                median = f"median cold {result['median_cold_total_s']} s, warm {result['median_warm_s']} s"
                print(f"{label} [{name}]: {median}", flush=True)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
