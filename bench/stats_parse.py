"""Statistics-API parse speed on the simulated fleet's documents: the checked
``parse_model_stats`` and the ``ModelStatsParser`` a scraper keeps per target, each
in microseconds per document, and their ratio.

The documents are one simulated server's statistics (``collector.testbed.fleet_documents``)
a second apart, as a collector scraping every second reads them: every model's counters
moved, and about two in five of its batch sizes saw an execution. The parser is measured
warm (it has read the document before the first one timed). Every document is first
checked to give the same records both ways. Each figure is the best of a few rounds.

Usage: ``python -m bench.stats_parse [--models 20] [--documents 60] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import operator
import time
from collections.abc import Callable, Sequence

from collector.sources.triton_json import ModelStatsParser, parse_model_stats
from collector.testbed.fleet_documents import FleetTemplates, ModelLoad


def fleet_documents(models: int, count: int, target: int = 3) -> list[bytes]:
    """``count`` statistics documents of one simulated server, one second apart."""
    templates = FleetTemplates.build(models)
    loads = [ModelLoad.for_model(target, m) for m in range(models)]
    values_in_order = operator.itemgetter(*templates.stats_order)
    documents = []
    for second in range(count):
        elapsed = 3600.0 + second
        values: list[int] = []
        for m, load in enumerate(loads):
            values += load.values(elapsed, 1_700_000_000_000 + second * 1000, (second + m) % 9)
        documents.append((templates.stats_fmt % values_in_order(values)).encode())
    return documents


def _seconds_per_document(
    parse: Callable[[bytes], object], documents: Sequence[bytes], rounds: int
) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for body in documents:
            parse(body)
        best = min(best, (time.perf_counter() - t0) / len(documents))
    return best


def stats_parse_speed(models: int = 20, documents: int = 60, rounds: int = 7) -> dict[str, float]:
    """Seconds per document of each parser, and the ratio checked / fast."""
    bodies = fleet_documents(models, documents + 1)
    parser = ModelStatsParser()
    for body in bodies:
        if parser.parse(body) != parse_model_stats(body):
            raise AssertionError("ModelStatsParser differs from parse_model_stats")
    checked = _seconds_per_document(parse_model_stats, bodies[1:], max(rounds // 3, 1))
    # A fresh parser that read the document before, as a scraper's has.
    best = float("inf")
    for _ in range(rounds):
        parser = ModelStatsParser()
        parser.parse(bodies[0])
        best = min(best, _seconds_per_document(parser.parse, bodies[1:], 1))
    return {
        "models": float(models),
        "bytes": float(len(bodies[0])),
        "checked_s": checked,
        "fast_s": best,
        "ratio": checked / best,
    }


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--models", type=int, default=20)
    cli.add_argument("--documents", type=int, default=60)
    cli.add_argument("--rounds", type=int, default=7)
    args = cli.parse_args(argv)
    r = stats_parse_speed(args.models, args.documents, args.rounds)
    print(
        f"{args.models} models, {r['bytes']:.0f} bytes per document:"
        f" parse_model_stats {r['checked_s'] * 1e6:.0f} us,"
        f" ModelStatsParser {r['fast_s'] * 1e6:.0f} us, ratio {r['ratio']:.1f}x"
    )


if __name__ == "__main__":
    main()
