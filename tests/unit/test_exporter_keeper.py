"""The snapshot keeper: a scrape is served one whole snapshot, young enough; the next
one is built ahead just before the next scrape is due, never more often than the
store can change, and not at all while nobody scrapes."""

from __future__ import annotations

import math
import threading
import time

import pytest

from collector.analysis.status import StatusReport
from collector.exporter.keeper import IDLE_AFTER_S, SnapshotKeeper
from collector.exporter.snapshot import ExporterSnapshot


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _snapshot(now: float) -> ExporterSnapshot:
    return ExporterSnapshot(
        taken_at=now,
        window_s=60.0,
        status=StatusReport(generated_at=now, window_s=60.0),
        latest_stats=(),
        findings=(),
        recommendations=(),
        version="t",
    )


class Builds:
    """``take``: counts the builds."""

    def __init__(self) -> None:
        self.taken: list[float] = []

    def __call__(self, now: float) -> ExporterSnapshot:
        self.taken.append(now)
        return _snapshot(now)


def test_a_scrape_reads_the_kept_snapshot_while_it_is_young() -> None:
    clock, builds = Clock(), Builds()
    keeper = SnapshotKeeper(builds, period_s=5.0, max_age_s=10.0, clock=clock)
    first = keeper.current()
    clock.now += 9.0
    assert keeper.current() is first
    clock.now += 2.0  # 11 s old: too old to serve
    second = keeper.current()
    assert second is not first and second.taken_at == clock.now
    assert builds.taken == [1000.0, 1011.0]


def test_the_next_build_is_due_just_before_the_next_scrape() -> None:
    clock, builds = Clock(), Builds()
    keeper = SnapshotKeeper(builds, period_s=5.0, max_age_s=10.0, clock=clock)
    assert keeper.due_at() == math.inf  # nobody has scraped
    keeper.current()  # a scrape at 1000, building the first snapshot
    assert keeper.due_at() == 1005.0  # no scrape period known yet: once per interval
    for _ in range(2):  # Prometheus every 15 s
        clock.now += 15.0
        keeper.refresh()  # as the background would have
        keeper.current()
    due = keeper.due_at()
    assert 1030.0 + 15.0 - 1.0 < due < 1045.0  # less the build's time and a margin
    # A scraper faster than the collector: no more than one build per interval.
    for _ in range(4):
        clock.now += 1.0
        keeper.current()
    assert keeper.due_at() == pytest.approx(1030.0 + 5.0)


def test_no_build_ahead_while_nobody_scrapes() -> None:
    clock, builds = Clock(), Builds()
    keeper = SnapshotKeeper(builds, period_s=5.0, max_age_s=10.0, clock=clock)
    keeper.current()
    clock.now += IDLE_AFTER_S + 1
    assert keeper.due_at() == math.inf


def test_the_background_builds_ahead_of_a_steady_scraper() -> None:
    """A build takes 0.15 s; scrapes every 0.5 s after the first find the next
    snapshot already built, younger than a build plus the margin, and return at once."""
    builds = Builds()

    def slow_take(now: float) -> ExporterSnapshot:
        time.sleep(0.15)
        return builds(now)

    keeper = SnapshotKeeper(slow_take, period_s=0.2, max_age_s=0.45)
    stop = threading.Event()
    thread = threading.Thread(target=keeper.run, args=(stop,), daemon=True)
    thread.start()
    waits: list[float] = []
    try:
        for _ in range(6):
            t0 = time.perf_counter()
            served = keeper.current()
            waits.append(time.perf_counter() - t0)
            assert time.time() - served.taken_at < 0.45
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert waits[0] >= 0.15  # the first scrape builds its own
    # The third on: the scrape period is known, so the build came ahead of them.
    assert max(waits[2:]) < 0.05, waits
    # About one per scrape (6) once their period is known, not one per tick (30).
    assert len(builds.taken) <= 8, builds.taken
