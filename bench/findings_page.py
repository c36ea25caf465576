"""The findings page's read over a week of findings, against reading the whole week.

Fills a SQLite store (or ``--db URL``, a scratch database the bench may write to) with
``--findings`` findings spread over a week of ``--models`` models (most resolved after
five minutes, as the detectors' episodes are), then times, side by side in this
process, the page's read (``DashboardQueries.events``: the store filters, orders and
cuts in SQL, at most ``EVENTS_SHOWN`` rows) and the read it replaced (every finding
created in the week and every open one, as records, filtered, sorted and cut in
Python), for the page's default view (active) and for all. Each is run ``--repeat``
times; printed: the median milliseconds, the peak of Python memory during one read
(``tracemalloc``) and the ratios.

Usage: ``python -m bench.findings_page [--findings 5000] [--models 20] [--repeat 5]
[--db URL]``
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from collector.store import Store, StoredFinding
from dashboard.queries import DashboardQueries
from dashboard.queries.events import EVENTS_SHOWN, page_order

WEEK_S = 7 * 24 * 3600.0
NOW = 1_700_000_000.0 + WEEK_S
KINDS = ("idle_capacity", "queue_saturation", "batching_off", "batch_below_preferred")
SEVERITIES = ("critical", "warning", "info")


def fill(store: Store, findings: int, models: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for i in range(findings):
        created = NOW - rng.random() * WEEK_S
        fid = store.add_finding(
            kind=rng.choice(KINDS),
            severity=rng.choice(SEVERITIES),
            target="triton-a",
            subject=f"model_{i % models:02d}",
            summary=f"finding {i}",
            window_start=created - 60,
            window_end=created,
            evidence={"queue_share": 0.55, "p95_ms": 12.5, "qps": 40.0, "idle_instances": 1.5},
            created_at=created,
        )
        if rng.random() < 0.95:
            store.resolve_finding(fid, created + 300)


def whole_week(
    store: Store,
    since: float,
    *,
    state: str = "all",
    limit: int | None = EVENTS_SHOWN,
    **filters: str,
) -> tuple[list[StoredFinding], set[tuple[str, str, str, str]]]:
    """The read the page made before: every finding created since ``since`` and every
    open one, as records, filtered, sorted and cut in Python; and the filters' choices
    (target, subject, kind, severity) of all of them. The reference the page's read is
    checked against, here and in the tests."""
    every = {f.id: f for f in store.findings(since=since)}
    every.update({f.id: f for f in store.active_findings()})
    chosen = [
        f
        for f in every.values()
        if all(getattr(f, name) == value for name, value in filters.items())
        and (state == "all" or (state == "active") == (f.resolved_at is None))
    ]
    facets = {(f.target, f.subject, f.kind, f.severity) for f in every.values()}
    return sorted(chosen, key=page_order)[:limit], facets


def measure(read: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median seconds of ``read`` and the peak of Python memory during one run."""
    read()  # warm: compiled statements, connections
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        read()
        times.append(time.perf_counter() - started)
    tracemalloc.start()
    try:
        read()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return statistics.median(times), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--findings", type=int, default=5000)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", default="", help="store URL (default: a temporary SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.db or f"sqlite:///{Path(tmp) / 'findings.db'}")
        started = time.monotonic()
        fill(store, args.findings, args.models)
        print(f"{args.findings} findings over a week of {args.models} models, stored in "
              f"{time.monotonic() - started:.0f} s")  # fmt: skip
        queries = DashboardQueries(store, clock=lambda: NOW)
        print(f"{'view':7} {'rows':>5} {'page ms':>8} {'week ms':>8} {'ratio':>6} "
              f"{'page MiB':>9} {'week MiB':>9} {'ratio':>6}")  # fmt: skip
        for state in ("active", "all"):
            shown = queries.events(state=state)
            assert shown.error is None, shown.error
            assert shown.events == whole_week(store, NOW - WEEK_S, state=state)[0], (
                "the reads differ"
            )
            page_s, page_peak = measure(functools.partial(queries.events, state=state), args.repeat)
            week_s, week_peak = measure(
                functools.partial(whole_week, store, NOW - WEEK_S, state=state), args.repeat
            )
            print(
                f"{state:7} {len(shown.events):5d} {page_s * 1e3:8.1f} {week_s * 1e3:8.1f}"
                f" {week_s / page_s:6.1f} {page_peak / 2**20:9.2f} {week_peak / 2**20:9.2f}"
                f" {week_peak / page_peak:6.1f}"
            )
        store.close()


if __name__ == "__main__":
    main()
