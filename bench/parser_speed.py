"""Parser speed on one Triton metrics page: prometheus_client's parser alone, the
reference ``parse_metrics`` (that parser + ``map_metrics``) and the fast
``TritonMetricsParser.parse``, each in seconds per page, and the ratio
prometheus_client / fast (the target is >= 10).

The page is the recorded GPU exposition scaled to N models (``bench.run``). The fast
parser is measured warm, as a scraper runs it: one parser reads a cycle of pages whose
counters all moved since the page before, so every line's value is new while its series
is known. Every page is first checked to give the same ``TritonMetrics`` both ways.
Each figure is the best of a few rounds.

Usage: ``python -m bench.parser_speed [--models 20 100]``; from other code
``from bench.parser_speed import parser_speed`` (run from the repository root).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: this file's folder would shadow the ``collector`` package.
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH]
    sys.path.insert(0, str(_BENCH.parent))

import argparse  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.run import exposition_with_models  # noqa: E402
from collector.sources.triton_metrics import TritonMetricsParser, parse_metrics  # noqa: E402

_VALUE = re.compile(r" (\d+(?:\.\d+)?)$", re.M)


def advanced_pages(text: str, count: int) -> list[str]:
    """``count`` successive scrapes of ``text``: every number moves on each time."""
    return [
        _VALUE.sub(lambda m, step=step: f" {float(m.group(1)) + 7 * step:g}", text)
        for step in range(1, count + 1)
    ]


def _seconds_per_page(
    parse: Callable[[object], object], pages: Sequence[object], rounds: int
) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for page in pages:
            parse(page)
        best = min(best, (time.perf_counter() - t0) / len(pages))
    return best


def parser_speed(models: int = 20, pages: int = 6, rounds: int = 3) -> dict[str, float]:
    """Seconds per page of each parser on a ``models``-model page, and the ratios."""
    texts = advanced_pages(exposition_with_models(models), pages)
    bodies = [t.encode() for t in texts]
    parser = TritonMetricsParser()
    for text, body in zip(texts, bodies, strict=True):  # also warms the caches
        if parser.parse(body) != parse_metrics(text):
            raise AssertionError(f"the fast parser differs from parse_metrics ({models} models)")
    prom = _seconds_per_page(lambda t: list(text_string_to_metric_families(t)), texts, rounds)  # type: ignore[arg-type]
    old = _seconds_per_page(parse_metrics, texts, rounds)  # type: ignore[arg-type]
    new = _seconds_per_page(parser.parse, bodies, rounds + 5)  # type: ignore[arg-type]
    return {
        "models": float(models),
        "lines": float(texts[0].count("\n")),
        "prometheus_client_s": prom,
        "parse_metrics_s": old,
        "fast_s": new,
        "ratio": prom / new,
        "ratio_parse_metrics": old / new,
    }


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--models", type=int, nargs="+", default=[20, 100])
    args = cli.parse_args(argv)
    print(
        f"{'models':>6} {'lines':>6} {'prometheus_client':>18} {'parse_metrics':>14} "
        f"{'fast':>9} {'ratio':>7} {'vs parse_metrics':>17}"
    )
    for n in args.models:
        r = parser_speed(n)
        print(
            f"{n:>6} {r['lines']:>6.0f} {r['prometheus_client_s'] * 1e3:>15.2f} ms "
            f"{r['parse_metrics_s'] * 1e3:>11.2f} ms {r['fast_s'] * 1e3:>6.2f} ms "
            f"{r['ratio']:>6.1f}x {r['ratio_parse_metrics']:>16.1f}x"
        )


if __name__ == "__main__":
    main()
