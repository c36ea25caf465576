"""The scheduler's own CPU per scrape: no-op sources, so what is measured is the
scrape loop (ticks, the backoff check, the hand-over to the pool and back), not a
fetch, a parse or a store write.

For each fleet shape (targets x interval) it starts a ``CollectorService`` whose
``run_source`` only counts, lets it settle, and reads this process's CPU time
(``time.process_time``: user + system of every thread) over a window. For
comparison it runs the same no-op job under APScheduler as the collector used to
schedule it (one interval job per source on a thread pool as large as the fleet).

    python -m bench.scheduler_overhead [--window 30] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import threading
import time
from pathlib import Path

from collector.config import Settings
from collector.scheduler import CollectorService
from collector.store import Store

SHAPES = [(500, 5.0), (20, 1.0), (1000, 5.0)]


class _NoOp:
    def __init__(self, target: str) -> None:
        self.name, self.target = "triton", target

    def collect(self) -> list[object]:
        return []

    def close(self) -> None:
        pass


class _Counting(CollectorService):
    scrapes = 0

    def run_source(self, source: object) -> bool:  # type: ignore[override]
        self.scrapes += 1  # under the GIL; a lost increment or two does not matter here
        return True


def _measure(count: int, interval_s: float, window_s: float, settle_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(db_url=f"sqlite:///{Path(tmp) / 'b.db'}", interval_s=interval_s)
        store = Store(settings.db_url)
        sources = [_NoOp(f"t{i}:8000") for i in range(count)]
        service = _Counting(settings, store, sources)  # type: ignore[arg-type]
        service.start()
        try:
            time.sleep(settle_s)
            n0, c0, w0 = service.scrapes, time.process_time(), time.monotonic()
            time.sleep(window_s)
            n1, c1, w1 = service.scrapes, time.process_time(), time.monotonic()
            threads = threading.active_count()
        finally:
            service.shutdown()
            store.close()
    scrapes = n1 - n0
    return {
        "scrapes": scrapes,
        "due": count * (w1 - w0) / interval_s,
        "cpu_us_per_scrape": (c1 - c0) / max(scrapes, 1) * 1e6,
        "cpu_share": (c1 - c0) / (w1 - w0),
        "threads": threads,
    }


def _measure_apscheduler(count: int, interval_s: float, window_s: float) -> dict[str, float]:
    from datetime import datetime, timedelta

    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    done = [0]

    def job() -> None:
        done[0] += 1

    scheduler = BackgroundScheduler(
        executors={"default": ThreadPoolExecutor(max_workers=count + 2)},
        job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 5},
        timezone="UTC",
    )
    first = datetime.now().astimezone()
    for i in range(count):
        scheduler.add_job(
            job,
            IntervalTrigger(seconds=interval_s, jitter=0.5),
            id=str(i),
            next_run_time=first + timedelta(seconds=0.05 * i),
        )
    scheduler.start()
    try:
        time.sleep(min(0.05 * count, 30) + interval_s)
        n0, c0, w0 = done[0], time.process_time(), time.monotonic()
        time.sleep(window_s)
        n1, c1, w1 = done[0], time.process_time(), time.monotonic()
        threads = threading.active_count()
    finally:
        scheduler.shutdown(wait=True)
    return {
        "scrapes": n1 - n0,
        "due": count * (w1 - w0) / interval_s,
        "cpu_us_per_scrape": (c1 - c0) / max(n1 - n0, 1) * 1e6,
        "cpu_share": (c1 - c0) / (w1 - w0),
        "threads": threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per shape")
    parser.add_argument("--quick", action="store_true", help="skip APScheduler's comparison")
    args = parser.parse_args()
    print(
        f"{'scheduler':<12} {'targets':>7} {'interval':>8} {'scrapes':>8} {'due':>8} "
        f"{'CPU us/scrape':>13} {'CPU share':>9} {'threads':>7}"
    )
    for count, interval in SHAPES:
        runs = [("batchscope", _measure(count, interval, args.window, settle_s=interval + 1.5))]
        if not args.quick and importlib.util.find_spec("apscheduler") is not None:
            runs.append(("apscheduler", _measure_apscheduler(count, interval, args.window)))
        for name, r in runs:
            print(
                f"{name:<12} {count:>7} {interval:>7g}s {r['scrapes']:>8.0f} {r['due']:>8.0f} "
                f"{r['cpu_us_per_scrape']:>13.1f} {r['cpu_share']:>8.2%} {r['threads']:>7.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
