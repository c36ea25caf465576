"""``SnapshotKeeper``: the latest snapshot, built ahead of the scrape that reads it.

Reading a snapshot means reading the analysis window of every model from the store
(``build_status``), which takes hundreds of milliseconds with tens of models; the
store only changes once per collector interval. So the keeper builds a snapshot in
the background once per interval while someone scrapes, and a scrape serves the
newest one: every family of a scrape still comes from one snapshot, judged at its
``taken_at``, at most about an interval before the scrape. A scrape that finds none
young enough (the first, or after a pause in scraping) builds one itself.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from collector.exporter.snapshot import ExporterSnapshot

__all__ = ["SnapshotKeeper"]

log = logging.getLogger("batchscope.exporter")

#: Without a scrape for this long nobody is reading: stop building ahead.
IDLE_AFTER_S = 300.0
#: How often the background thread looks whether a build is due.
_TICK_S = 0.1
#: A build starts this much earlier than its own last duration before the scrape.
_MARGIN_S = 0.25
#: Gaps between scrapes remembered to learn the scrape period.
_GAPS_KEPT = 4


class SnapshotKeeper:
    """Holds the snapshot ``take(now)`` built last.

    ``current()`` returns it while it is at most ``max_age_s`` old, else builds one.
    ``run(stop)`` (a thread's target) builds one whenever ``due_at`` says, while a
    scrape came within ``IDLE_AFTER_S``.
    """

    def __init__(
        self,
        take: Callable[[float], ExporterSnapshot],
        *,
        period_s: float,
        max_age_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._take = take
        self.period_s = period_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._latest: ExporterSnapshot | None = None
        self._last_read_at = -math.inf
        self._gaps: list[float] = []  # between recent scrapes, newest last
        self._build_s = 0.0  # how long the last build took
        self._build_lock = threading.Lock()  # one build at a time

    def _young(self, now: float) -> ExporterSnapshot | None:
        latest = self._latest
        if latest is not None and 0.0 <= now - latest.taken_at <= self.max_age_s:
            return latest
        return None

    def current(self) -> ExporterSnapshot:
        """The snapshot a scrape reads now."""
        now = self._clock()
        if math.isfinite(self._last_read_at) and now > self._last_read_at:
            self._gaps = [*self._gaps, now - self._last_read_at][-_GAPS_KEPT:]
        self._last_read_at = now
        young = self._young(now)
        if young is not None:
            return young
        with self._build_lock:
            # Another scrape, or the background, may have built one meanwhile.
            young = self._young(self._clock())
            return young if young is not None else self._build()

    def refresh(self) -> ExporterSnapshot:
        """Build a snapshot now and keep it."""
        with self._build_lock:
            return self._build()

    def _build(self) -> ExporterSnapshot:
        started = time.perf_counter()
        snapshot = self._take(self._clock())
        self._build_s = time.perf_counter() - started
        self._latest = snapshot
        return snapshot

    def due_at(self) -> float:
        """When the next build ahead should start: just before the next scrape is
        expected (the last scrape plus the shortest recent gap, less the last build's
        time and a margin; the one after, when that build is done), but not before the
        store can hold anything new (one ``period_s`` after the latest build); ``inf``
        while nobody scrapes."""
        latest = self._latest
        if latest is None or self._clock() - self._last_read_at > IDLE_AFTER_S:
            return math.inf
        earliest = latest.taken_at + self.period_s
        if not self._gaps:
            return earliest
        gap = min(self._gaps)
        start = self._last_read_at + gap - self._build_s - _MARGIN_S
        if latest.taken_at >= start:  # built for the coming scrape already
            start += gap
        return max(earliest, start)

    def run(self, stop: threading.Event) -> None:
        """Build ahead whenever ``due_at`` says, until ``stop`` is set; never raises."""
        while not stop.wait(_TICK_S):
            if self._clock() < self.due_at():
                continue
            try:
                self.refresh()
            except Exception:  # the store is busy or gone: a scrape will say so
                log.exception("building the next snapshot failed; scrapes build their own")
