"""`mcp-gateway eval`: the router measured on a static catalog and queries (and, with `--replay`, learning)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli.common import EXIT_OK, Usage
from gateway.config.settings import Settings
from gateway.plugins import get_plugin_manager
from gateway.router.service import describe_embedder, learning_parameters, load_router_embedder

if TYPE_CHECKING:
    from gateway.router.base import Embedder, EmbeddingCache

__all__ = ["add_parsers", "run_eval"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser("eval", help="measure the router on static catalogs and queries")
    evaluate.add_argument(
        "--catalog",
        type=Path,
        action="append",
        default=[],
        help="catalog JSON (LiveMCPBench format); repeat it beside --queries for several sets, or give one for all",
    )
    evaluate.add_argument(
        "--queries", type=Path, action="append", default=[], help="queries JSONL with expected tools (repeatable)"
    )
    evaluate.add_argument(
        "--set",
        type=Path,
        action="append",
        default=[],
        dest="sets",
        metavar="DIR",
        help="a set's folder holding catalog.json and queries.jsonl (repeatable)",
    )
    evaluate.add_argument(
        "--long",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also a set of long requests, each joining 3-5 of DIR's single-tool requests (router/long_requests.py)",
    )
    evaluate.add_argument(
        "--baselines", action="store_true", help="also run plain BM25, dense and RRF on every set, in the same run"
    )
    evaluate.add_argument(
        "--abstain",
        action="store_true",
        help="also measure 'no tool fits': hide each request's expected servers and count what still passes "
        "routing.no_fit_threshold, for a grid of thresholds (gateway/router/abstain.py)",
    )
    evaluate.add_argument(
        "--cold", action="store_true", help="embed everything anew (default: reuse the data dir's embedding cache)"
    )
    evaluate.add_argument("--k", default="1,5,10", help="comma-separated cut-offs (default 1,5,10)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object, last on stdout")
    evaluate.add_argument(
        "--replay",
        action="store_true",
        help="also learn from simulated feedback on part of the queries; measure the rest without and with learning",
    )
    evaluate.add_argument(
        "--train-fraction", type=float, default=0.5, help="--replay: share of the queries trained on (default 0.5)"
    )
    evaluate.add_argument(
        "--seed", type=int, default=0, help="--replay: first seed of the random splits; --long: its seed (default 0)"
    )
    evaluate.add_argument(
        "--repeats", type=int, default=5, help="--replay: splits averaged, seeds SEED, SEED+1, ... (default 5)"
    )
    evaluate.set_defaults(run=run_eval)


def run_eval(args: argparse.Namespace, settings: Settings) -> int:
    replay = _Replay(args.train_fraction, args.seed, args.repeats) if args.replay else None
    ks = _ks(args.k)
    pairs = _pairs(args.catalog, args.queries, args.sets)
    for folder in args.long:
        if not (folder / "catalog.json").is_file() or not (folder / "queries.jsonl").is_file():
            raise Usage(f"--long {folder}: a folder holding catalog.json and queries.jsonl is needed")
    if len(pairs) == 1 and not args.long and not args.baselines and not args.abstain:
        return _eval(settings, pairs[0][0], pairs[0][1], ks, args.json, replay, cold=args.cold)
    if replay is not None:
        raise Usage(
            "--replay measures one set: give one --catalog and --queries, without --baselines, --long or --abstain"
        )
    return _eval_sets(
        settings,
        pairs,
        args.long,
        ks,
        args.json,
        baselines=args.baselines,
        cold=args.cold,
        seed=args.seed,
        abstain=args.abstain,
    )


def _ks(raw_ks: str) -> list[int]:
    try:
        ks = sorted({int(k) for k in raw_ks.split(",") if k.strip()})
    except ValueError:
        raise Usage(f"--k takes comma-separated integers, like 1,5,10; got {raw_ks!r}") from None
    if not ks or any(not 1 <= k <= 50 for k in ks):
        raise Usage("--k values must be from 1 to 50")
    return ks


def _pairs(catalogs: list[Path], queries: list[Path], sets: list[Path]) -> list[tuple[Path, Path]]:
    """(catalog, queries) of each set: the --catalog/--queries pairs in order (one --catalog
    serves every --queries), then the --set folders."""
    if queries and not catalogs:
        raise Usage("--queries needs a --catalog")
    if catalogs and not queries:
        raise Usage("--catalog needs --queries")
    if len(catalogs) > 1 and len(catalogs) != len(queries):
        raise Usage("give one --catalog for all --queries, or one --catalog per --queries, in the same order")
    pairs = [(catalogs[min(i, len(catalogs) - 1)], q) for i, q in enumerate(queries)]
    pairs += [(folder / "catalog.json", folder / "queries.jsonl") for folder in sets]
    if not pairs:
        raise Usage("give --catalog and --queries, or --set DIR")
    for catalog, query_file in pairs:
        for path in (catalog, query_file):
            if not path.is_file():
                raise Usage(f"no such file: {path}")
    return pairs


def _backend_line(embedder: Embedder | None) -> str:
    """Which embedding backend the figures are of, and whether it failed on the way (they are BM25's then)."""
    line = f"embedding: {describe_embedder(embedder)}"
    failure = getattr(embedder, "failure", None)
    if failure:
        line += f" (FAILED during the run, so these figures are partly BM25 alone's: {failure})"
    return line


def _backend_figures(embedder: Embedder | None) -> dict[str, str | None]:
    return {"embedding": describe_embedder(embedder), "embedding_failure": getattr(embedder, "failure", None)}


def _cache(settings: Settings, cold: bool) -> EmbeddingCache | None:
    """The data dir's embedding cache (or the deployment's database), unless `cold`."""
    if cold:
        return None
    from gateway.router.cache import open_embedding_cache

    return open_embedding_cache(settings.database_url, settings.data_dir)


@dataclass(frozen=True)
class _Replay:
    train_fraction: float
    seed: int
    repeats: int


def _eval(
    settings: Settings,
    catalog: Path,
    queries: Path,
    ks: list[int],
    as_json: bool,
    replay: _Replay | None,
    *,
    cold: bool,
) -> int:
    from gateway.router.eval import format_report, load_catalog, load_queries, run_eval
    from gateway.router.replay import format_replay, run_replay

    if replay is not None and not 0 < replay.train_fraction < 1:
        raise Usage("--train-fraction must be between 0 and 1 (both excluded)")
    if replay is not None and not 1 <= replay.repeats <= 100:
        raise Usage("--repeats must be from 1 to 100")
    pm, _ = get_plugin_manager(settings)
    embedder = load_router_embedder(settings, pm)
    cache = _cache(settings, cold) if embedder is not None else None
    report = run_eval(catalog, queries, ks, embedder, threshold=settings.routing.threshold, cache=cache)
    print(_backend_line(embedder))
    print(format_report(report))
    figures = report.to_json()
    figures.update(_backend_figures(embedder))
    if replay is not None:
        try:
            replayed = run_replay(
                load_catalog(catalog),
                load_queries(queries),
                ks,
                embedder,
                learning=learning_parameters(settings.learning),
                train_fraction=replay.train_fraction,
                seeds=range(replay.seed, replay.seed + replay.repeats),
                threshold=settings.routing.threshold,
            )
        except ValueError as exc:
            raise Usage(f"--replay: {exc}") from None
        print(format_replay(replayed))
        figures["replay"] = replayed.to_json()
    if as_json:
        print(json.dumps(figures))
    return EXIT_OK


def _eval_sets(
    settings: Settings,
    pairs: list[tuple[Path, Path]],
    long: list[Path],
    ks: list[int],
    as_json: bool,
    *,
    baselines: bool,
    cold: bool,
    seed: int,
    abstain: bool,
) -> int:
    from gateway.router.eval_sets import EvalSet, format_multi_report, load_set, run_sets
    from gateway.router.long_requests import long_requests

    sets = [load_set(catalog, queries) for catalog, queries in pairs]
    for folder in long:
        source = load_set(folder / "catalog.json", folder / "queries.jsonl")
        sets.append(EvalSet(f"{source.name}-long", source.records, long_requests(source.queries, seed=seed)))
    names = [s.name for s in sets]
    for i, s in enumerate(sets):  # two folders of the same name: number them
        if names.count(s.name) > 1:
            sets[i] = EvalSet(f"{s.name}-{i + 1}", s.records, s.queries)
    pm, _ = get_plugin_manager(settings)
    embedder = load_router_embedder(settings, pm)
    cache = _cache(settings, cold) if embedder is not None else None
    report = run_sets(sets, ks, embedder, settings.routing.threshold, baselines=baselines, cache=cache)
    print(_backend_line(embedder))
    print(format_multi_report(report))
    figures = report.to_json()
    figures.update(_backend_figures(embedder))
    if abstain:
        from gateway.router.abstain import format_abstain, pick_threshold, run_abstain

        configured = settings.routing.no_fit_threshold
        refusals = [run_abstain(s.name, s.records, s.queries, embedder, cache=cache) for s in sets]
        print(format_abstain(refusals, configured))
        picked = pick_threshold(refusals)
        figures["abstain"] = {
            "configured": configured,
            "picked": picked,
            "sets": {r.name: r.to_json() for r in refusals},
        }
    if as_json:
        print(json.dumps(figures))
    return EXIT_OK
