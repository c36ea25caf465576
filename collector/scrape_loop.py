"""The scrape loop: every source on its own interval, run by a bounded pool of workers.

One thread keeps a heap of due times. Each source keeps its own grid of ticks, at a
phase within the interval taken from a hash of its name, so a thousand sources
spread over the interval instead of firing together (as Prometheus spreads its
targets); the first tick after start comes within the first second. At each tick
the source is handed to the pool, unless its previous scrape is still queued or
running: that tick is skipped and counted, so one source never runs twice at once,
and a slow source costs one worker, not a pile of them. A source in backoff is not
handed over at all.

The pool holds at most ``workers`` threads, started only when every one started is
busy, and hands a tick to the worker idle for the shortest time: a collector of a
few targets runs on one or two threads however large the bound (fewer threads, each
with its stack and its allocator caches warm), and a fleet gets the bound.

``PeriodicJob`` runs one slow job (analyses, housekeeping, re-reading file_sd) on its
own thread every ``every_s``, skipping the ticks a long run overlaps.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from collector.sources.base import Source

__all__ = ["LoopCounts", "PeriodicJob", "ScrapeLoop"]

log = logging.getLogger("batchscope.collector")

# The first tick of every source comes within this many seconds of its start.
_FIRST_SPREAD_S = 1.0
# The loop wakes at most this often (and at most 20 times an interval), handing over
# every tick due by then: a thread's wake-up costs tens of microseconds of CPU (more
# in a virtual machine), so 100 ticks a second take a few wake-ups, not 100. A tick
# is late by this much at most, well within a scrape's own jitter.
_QUANTUM_S = 0.05


def _phase(source: Source) -> float:
    """Where in the interval (0..1) the source's ticks fall: stable per source."""
    return zlib.crc32(f"{source.name}:{source.target}".encode()) / 2**32


class _Entry:
    __slots__ = ("aligned", "busy", "closed", "grid", "offset", "retired", "skipped", "source")

    def __init__(self, source: Source, grid: float, offset: float) -> None:
        self.source = source
        self.grid = grid  # the source's current tick (monotonic s)
        self.offset = offset  # a point of the source's own grid
        self.aligned = False  # on that grid (after the first tick)
        self.busy = False  # handed to the pool and not finished
        self.retired = False  # removed: no more ticks; closed once idle
        self.closed = False
        self.skipped = 0


class _Worker:
    """A pool thread's hand-over slot: ``wake`` is held while it waits; releasing it
    (with ``entry`` set, or None to end) wakes that one thread and no other."""

    __slots__ = ("entry", "wake")

    def __init__(self) -> None:
        self.entry: _Entry | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


@dataclass(frozen=True)
class LoopCounts:
    """What the loop did since start: ticks handed to the pool, ticks skipped because
    the source's previous scrape was still running, ticks held back by backoff."""

    dispatched: int
    skipped_busy: int
    held_by_backoff: int


class ScrapeLoop:
    """Runs ``run(source)`` for every added source every ``interval_s`` on at most
    ``workers`` threads. ``ready(source)`` (cheap, on the loop's thread) says whether
    the source is due at all (backoff); ``close(source)`` is called once per removed
    source, when no scrape of it runs any more."""

    def __init__(
        self,
        run: Callable[[Source], object],
        *,
        interval_s: float,
        workers: int,
        jitter_s: float = 0.0,
        ready: Callable[[Source], bool] = lambda _source: True,
        close: Callable[[Source], None] = lambda _source: None,
    ) -> None:
        self._run, self._ready, self._close = run, ready, close
        self.interval_s = interval_s
        self._jitter_s = min(jitter_s, interval_s / 2)
        self._max_workers = workers
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Entry]] = []
        self._seq = itertools.count()
        self._entries: dict[int, _Entry] = {}  # by id(source)
        # Under ``_cond``: the idle workers, the one idle for the shortest time last;
        # the ticks waiting for a worker when all are busy; every thread started.
        self._idle: list[_Worker] = []
        self._backlog: deque[_Entry] = deque()
        self._workers: list[threading.Thread] = []
        self._loop_thread: threading.Thread | None = None
        self._stopping = False
        self._anchor = time.monotonic()
        self._quantum_s = min(_QUANTUM_S, interval_s / 20)
        self.dispatched = self.skipped_busy = self.held_by_backoff = 0

    # ------------------------------------------------------------------ sources

    def add(self, source: Source) -> None:
        """Tick ``source`` from now on: first within a second, then on its own grid."""
        with self._cond:
            if id(source) in self._entries:
                return
            now, phase = time.monotonic(), _phase(source)
            first = now + phase * min(self.interval_s, _FIRST_SPREAD_S)
            entry = _Entry(source, first, self._anchor + phase * self.interval_s)
            self._entries[id(source)] = entry
            self._push(entry, entry.grid)
            self._cond.notify()

    def remove(self, source: Source) -> None:
        """No more ticks of ``source``; it is closed now, or when its scrape ends."""
        with self._cond:
            entry = self._entries.pop(id(source), None)
        if entry is not None:
            entry.retired = True  # before reading busy: see _finish
            if not entry.busy:
                self._close_once(entry)

    def skipped(self, source: Source) -> int:
        """Ticks of ``source`` skipped because its previous scrape still ran."""
        entry = self._entries.get(id(source))
        return entry.skipped if entry is not None else 0

    def counts(self) -> LoopCounts:
        return LoopCounts(self.dispatched, self.skipped_busy, self.held_by_backoff)

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        self._stopping = False
        self._workers = []  # those of an earlier start have ended or been given up
        self._loop_thread = threading.Thread(target=self._loop, name="scrape-loop", daemon=True)
        self._loop_thread.start()

    @property
    def running(self) -> bool:
        return not self._stopping and self._loop_thread is not None and self._loop_thread.is_alive()

    @property
    def workers_started(self) -> int:
        """The pool's threads so far: at most ``workers``, fewer while fewer sufficed."""
        return len(self._workers)

    def stop(self, wait_s: float) -> None:
        """Stop ticking, let the scrapes in flight end (at most ``wait_s``), and close
        every source as soon as no scrape of it runs."""
        with self._cond:
            self._stopping = True  # no worker is started after this
            self._cond.notify()
            for worker in self._idle:
                worker.wake.release()  # with no entry: it ends
            self._idle.clear()
            for entry in self._backlog:
                entry.busy = False  # never ran: closed below
            self._backlog.clear()
            threads = [*self._workers, *([self._loop_thread] if self._loop_thread else [])]
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = [t.name for t in self._workers if t.is_alive()]
        if late:
            log.warning("%d scrape(s) still running at shutdown; not waited for", len(late))
        with self._cond:
            entries = list(self._entries.values())
            self._entries.clear()
            self._heap.clear()
        for entry in entries:
            entry.retired = True
            if not entry.busy:
                self._close_once(entry)

    def _push(self, entry: _Entry, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), entry))

    def _loop(self) -> None:
        heap, cond = self._heap, self._cond
        while True:
            with cond:
                if self._stopping:
                    return
                try:
                    now = time.monotonic()
                    while heap and heap[0][0] <= now:
                        entry = heapq.heappop(heap)[2]
                        if not entry.retired:
                            self._tick(entry, now)
                    timeout = max(heap[0][0] - now, self._quantum_s) if heap else None
                except Exception:  # a bug here must not end the scraping
                    log.exception("scrape loop: unexpected failure; carrying on")
                    timeout = self._quantum_s
                cond.wait(timeout)

    def _tick(self, entry: _Entry, now: float) -> None:
        # The next tick first: whatever fails below, the source keeps its ticks.
        self._push_next(entry, now)
        if entry.busy:
            entry.skipped += 1
            self.skipped_busy += 1
        elif not self._ready(entry.source):
            self.held_by_backoff += 1
        else:
            entry.busy = True
            self.dispatched += 1
            self._hand_over(entry)

    def _hand_over(self, entry: _Entry) -> None:
        """To the worker idle for the shortest time, else to a new one while under the
        bound, else to the backlog the next free worker takes from (under ``_cond``)."""
        if self._idle:
            worker = self._idle.pop()
            worker.entry = entry
            worker.wake.release()
        elif len(self._workers) < self._max_workers:
            thread = threading.Thread(
                target=self._work,
                args=(entry,),
                name=f"scrape-{len(self._workers)}",
                daemon=True,
            )
            self._workers.append(thread)
            thread.start()
        else:
            self._backlog.append(entry)

    def _push_next(self, entry: _Entry, now: float) -> None:
        interval = self.interval_s
        grid = entry.grid + interval
        if grid <= now or not entry.aligned:
            # After the first tick (half an interval on at least), or when the loop was
            # held up: the next point of the source's own grid.
            earliest = now if entry.aligned else now + interval / 2
            grid = entry.offset + (math.floor((earliest - entry.offset) / interval) + 1) * interval
            entry.aligned = True
        entry.grid = grid
        self._push(entry, grid + (random.uniform(0, self._jitter_s) if self._jitter_s else 0))

    def _work(self, first: _Entry) -> None:
        worker = _Worker()
        entry: _Entry | None = first
        while entry is not None:
            self._scrape(entry)
            with self._cond:
                if self._stopping:
                    return
                if self._backlog:
                    entry = self._backlog.popleft()
                    continue
                self._idle.append(worker)
            worker.wake.acquire()  # until _hand_over or stop releases it
            entry, worker.entry = worker.entry, None

    def _scrape(self, entry: _Entry) -> None:
        try:
            if not (self._stopping or entry.retired):
                self._run(entry.source)
        except BaseException:  # run_source never raises; this is a last line
            log.exception("%s/%s: scrape failed", entry.source.name, entry.source.target)
        finally:
            entry.busy = False  # before reading retired: see remove
            if entry.retired:
                self._close_once(entry)

    def _close_once(self, entry: _Entry) -> None:
        with self._cond:
            if entry.closed:
                return
            entry.closed = True
        try:
            self._close(entry.source)
        except Exception:
            log.exception("%s/%s: close failed", entry.source.name, entry.source.target)


class PeriodicJob:
    """``job()`` every ``every_s`` on its own thread (the first run one period after
    start); a run longer than the period skips the ticks it overlaps."""

    def __init__(self, name: str, every_s: float, job: Callable[[], object]) -> None:
        self.name, self.every_s, self._job = name, every_s, job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> bool:
        """Wait for a run in progress; whether the thread has ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        start = time.monotonic()
        due = start + self.every_s
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            try:
                self._job()
            except BaseException:  # as the scrape workers: the job runs again
                log.exception("%s failed; it runs again next time", self.name)
            now = time.monotonic()
            due += self.every_s
            if due <= now:
                due = start + math.ceil((now - start) / self.every_s) * self.every_s
