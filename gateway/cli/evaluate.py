"""`mcp-gateway eval`: the router measured on a static catalog and queries (and, with `--replay`, learning)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from gateway.cli.common import EXIT_OK, Usage
from gateway.config.settings import Settings
from gateway.plugins import get_plugin_manager
from gateway.router.service import learning_parameters, load_router_embedder

__all__ = ["add_parsers", "run_eval"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser("eval", help="measure the router on a static catalog and queries")
    evaluate.add_argument("--catalog", type=Path, required=True, help="catalog JSON (LiveMCPBench format)")
    evaluate.add_argument("--queries", type=Path, required=True, help="queries JSONL with expected tools")
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
    evaluate.add_argument("--seed", type=int, default=0, help="--replay: first seed of the random splits (default 0)")
    evaluate.add_argument(
        "--repeats", type=int, default=5, help="--replay: splits averaged, seeds SEED, SEED+1, ... (default 5)"
    )
    evaluate.set_defaults(run=run_eval)


def run_eval(args: argparse.Namespace, settings: Settings) -> int:
    replay = _Replay(args.train_fraction, args.seed, args.repeats) if args.replay else None
    return _eval(settings, args.catalog, args.queries, args.k, args.json, replay)


@dataclass(frozen=True)
class _Replay:
    train_fraction: float
    seed: int
    repeats: int


def _eval(settings: Settings, catalog: Path, queries: Path, raw_ks: str, as_json: bool, replay: _Replay | None) -> int:
    from gateway.router.eval import format_report, load_catalog, load_queries, run_eval
    from gateway.router.replay import format_replay, run_replay

    try:
        ks = sorted({int(k) for k in raw_ks.split(",") if k.strip()})
    except ValueError:
        raise Usage(f"--k takes comma-separated integers, like 1,5,10; got {raw_ks!r}") from None
    if not ks or any(not 1 <= k <= 50 for k in ks):
        raise Usage("--k values must be from 1 to 50")
    for path in (catalog, queries):
        if not path.is_file():
            raise Usage(f"no such file: {path}")
    if replay is not None and not 0 < replay.train_fraction < 1:
        raise Usage("--train-fraction must be between 0 and 1 (both excluded)")
    if replay is not None and not 1 <= replay.repeats <= 100:
        raise Usage("--repeats must be from 1 to 100")
    pm, _ = get_plugin_manager(settings)
    embedder = load_router_embedder(settings, pm)
    report = run_eval(catalog, queries, ks, embedder, threshold=settings.routing.threshold)
    print(format_report(report))
    figures = report.to_json()
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
