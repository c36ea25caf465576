"""What the store's fault tests share: a collector over a simulated Triton fleet, and
looks into the store from outside the collector (plain connections, no ``Store``)."""

from __future__ import annotations

import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from collector.config import Settings, target_from_url
from collector.scheduler import CollectorService, build_sources, store_pool_size
from collector.store import Store
from collector.testbed.fleet import Fleet

__all__ = [
    "StoredScrapes",
    "fleet_collector",
    "settings_for",
    "stored_scrapes",
    "wait_for_process_line",
]


def settings_for(fleet: Fleet, db_url: str, **overrides: object) -> Settings:
    """Triton scrapes only, of every target of ``fleet``, a few times a second."""
    values: dict[str, object] = {
        "targets": tuple(
            target_from_url(url, metrics)
            for url, metrics in zip(fleet.urls, fleet.metrics_urls, strict=True)
        ),
        "db_url": db_url,
        "interval_s": 0.25,
        "timeout_s": 2.0,
        "jitter_s": 0.0,
        "backoff_max_s": 1.0,
        "sources": ("triton",),
        **overrides,
    }
    return Settings(**values)  # type: ignore[arg-type]


@contextmanager
def fleet_collector(settings: Settings) -> Iterator[CollectorService]:
    """A started collector over ``settings``' store; shut down (its held writes tried
    once more) and its store closed on the way out."""
    store = Store(settings.db_url, pool_size=store_pool_size(settings))
    try:
        store.open()
        service = CollectorService(settings, store, build_sources(settings))
        service.start()
        try:
            yield service
        finally:
            service.shutdown()
    finally:
        store.close()


@dataclass(frozen=True)
class StoredScrapes:
    """The successful Triton scrapes the store holds, read from outside."""

    # (target, collected_at) of each scrape, in the order its rows were written.
    scrapes: list[tuple[str, float]]
    sample_ids: list[int]  # every model sample's id
    down_transitions: int  # a scrape that failed leaves one

    def in_window(self, start: float, end: float) -> int:
        return sum(1 for _, at in self.scrapes if start <= at <= end)

    def in_write_order(self) -> bool:
        """Whether each target's scrapes were written in the order they were made."""
        last: dict[str, float] = {}
        for target, at in self.scrapes:
            if at < last.get(target, -1.0):
                return False
            last[target] = at
        return True


def stored_scrapes(db_url: str) -> StoredScrapes:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.name, s.collected_at, s.id FROM model_samples s "
                    "JOIN models m ON m.id = s.model_id JOIN targets t ON t.id = m.target_id "
                    "ORDER BY s.id"
                )
            ).all()
            down = conn.execute(text("SELECT count(*) FROM target_transitions WHERE NOT up"))
            down_count = int(down.scalar_one())
    finally:
        engine.dispose()
    seen: dict[tuple[str, float], None] = {}
    for name, at, _ in rows:
        seen.setdefault((str(name), float(at)), None)
    return StoredScrapes(list(seen), [int(r[2]) for r in rows], down_count)


def wait_for_process_line(proc: subprocess.Popen[str], expected: str, timeout_s: float) -> None:
    """Read ``proc``'s stdout until a line equals ``expected`` (bounded)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([proc.stdout], [], [], left)[0]:
            break
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"process exited ({proc.poll()}) before saying {expected!r}")
        if line.strip() == expected:
            return
    raise AssertionError(f"no {expected!r} within {timeout_s:g} s")
