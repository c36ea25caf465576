"""Writes held in memory while the store is out, written in order when it is back.

A store that cannot take a write for a while (SQLite locked by another writer past
its busy timeout, a full disk, PostgreSQL restarting) must not cost the scrapes made
meanwhile. ``WriteBuffer.submit`` runs a write at once while nothing is held; when it
fails with a store outage (``is_outage``) it is held instead, and so is every write
submitted after it until the held ones are written, so the store receives them in the
order they were made. A thread of the buffer's own writes the held ones, oldest first,
retrying with a growing pause (``retry_s`` doubling up to ``retry_max_s``); a scrape
never waits for it.

What is held is bounded by ``max_writes`` writes and ``max_bytes`` bytes (the pickled
size of the records a write carries, a measure of the memory it holds): over either,
the oldest held write is dropped, counted (``BufferCounts.dropped``) and logged. A
write the store refuses for another reason than an outage (a bug, a constraint) is
logged and counted as ``rejected`` instead of blocking the writes behind it. What was
committed before an outage is never touched: every write is one transaction, and a
failed one changes nothing.

Each outage is logged when it starts (the store's error), when the first write is
dropped, and when it ends (how long it lasted, how many writes were held, written
and dropped); ``on_outage`` is then given that ``StoreOutage`` (the collector keeps it
in the store, where ``batchscope status`` shows it).
"""

from __future__ import annotations

import collections
import logging
import pickle
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from collector.errors import ConfigError
from collector.store.rows import StoreOutage

__all__ = ["BufferCounts", "WriteBuffer", "is_outage", "payload_bytes"]

log = logging.getLogger("batchscope.store")


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the store cannot take writes for now (locked, full,
    unreachable, restarting), as opposed to refusing this write for good."""
    if isinstance(exc, ConfigError):  # a database that could not be opened at first use
        cause = exc.__cause__
        return cause is not None and is_outage(cause)
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def payload_bytes(*records: object) -> int:
    """The pickled size of ``records``: what a held write is counted as."""
    try:
        return len(pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # not picklable: a coarse floor
        return sum(sys.getsizeof(r) for r in records)


def _reason(exc: BaseException) -> str:
    """The store's error in one short line (never the statement or its parameters)."""
    if isinstance(exc, ConfigError) and exc.__cause__ is not None:
        exc = exc.__cause__
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {lines[0] if lines else ''}"[:300]


@dataclass(frozen=True)
class BufferCounts:
    """What the buffer did since it was made. ``held`` and ``held_bytes``: now;
    the others count writes since start: ``buffered`` were held, ``written`` of
    those were written later, ``dropped`` were dropped as the oldest over the bound,
    ``rejected`` were refused by the store for good, ``lost_at_stop`` were still held
    when the buffer stopped with the store still out. ``outages``: how many times the
    store went out; ``out_since``: when the current outage began (None when none)."""

    held: int
    held_bytes: int
    buffered: int
    written: int
    dropped: int
    rejected: int
    lost_at_stop: int
    outages: int
    out_since: float | None

    @property
    def lost(self) -> int:
        """Held writes that never reached the store."""
        return self.dropped + self.rejected + self.lost_at_stop


@dataclass
class _Held:
    write: Callable[[], object]
    what: str
    size: int


@dataclass
class _Outage:
    since: float
    reason: str
    buffered_before: int
    written_before: int
    dropped_before: int
    told_drop: bool = False


class WriteBuffer:
    """See the module docstring. ``start()`` starts the thread that writes what is
    held; ``stop(timeout_s)`` makes one last attempt to write it."""

    def __init__(
        self,
        *,
        max_writes: int,
        max_bytes: int,
        retry_s: float = 0.2,
        retry_max_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        on_outage: Callable[[StoreOutage], None] | None = None,
    ) -> None:
        if max_writes < 1 or max_bytes < 1:
            raise ValueError(f"bounds must be at least 1, got {max_writes} and {max_bytes}")
        self.max_writes = max_writes
        self.max_bytes = max_bytes
        self._retry_s = retry_s
        self._retry_max_s = retry_max_s
        self._clock = clock
        self._held: collections.deque[_Held] = collections.deque()
        self._held_bytes = 0
        # The held write being written now: still held (counted, with its bytes)
        # until the store took it.
        self._in_flight: _Held | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._buffered = self._written = self._dropped = 0
        self._rejected = self._lost_at_stop = self._outages = 0
        self._outage: _Outage | None = None
        self._on_outage = on_outage

    # ------------------------------------------------------------------ writes

    def submit(self, write: Callable[[], object], *, what: str, size: Callable[[], int]) -> None:
        """Run ``write`` now, or hold it (see the module docstring); ``size()`` is
        asked only when it is held. An error that is not an outage propagates (and
        nothing is held) when the write ran now."""
        with self._lock:
            holding = bool(self._held) or self._in_flight is not None
        if not holding:
            try:
                write()
                return
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self._hold(_Held(write, what, size()), exc)
                return
        self._hold(_Held(write, what, size()), None)

    def _hold(self, item: _Held, error: BaseException | None) -> None:
        with self._lock:
            if self._outage is None:
                self._start_outage(error)
            self._held.append(item)
            self._held_bytes += item.size
            self._buffered += 1
            self._enforce_bound()
        self._wake.set()

    def _start_outage(self, error: BaseException | None) -> None:
        reason = _reason(error) if error is not None else "unknown"
        self._outages += 1
        self._outage = _Outage(self._clock(), reason, self._buffered, self._written, self._dropped)
        log.warning(
            "store write failed (%s): holding writes in memory (up to %d writes, %d bytes) "
            "and writing them once the store is back",
            reason,
            self.max_writes,
            self.max_bytes,
        )

    def _enforce_bound(self) -> None:
        """Drop the oldest held writes while over a bound (under the lock)."""
        while self._held and (
            self._held_count() > self.max_writes or self._held_size() > self.max_bytes
        ):
            dropped = self._held.popleft()
            self._held_bytes -= dropped.size
            self._dropped += 1
            outage = self._outage
            if outage is not None and not outage.told_drop:
                outage.told_drop = True
                log.warning(
                    "store still out: held writes over the bound (%d writes, %d bytes); "
                    "dropping the oldest (first: %s), counted as dropped",
                    self.max_writes,
                    self.max_bytes,
                    dropped.what,
                )

    def _drain(self) -> bool:
        """Write what is held, oldest first; False when the store is still out."""
        while True:
            with self._lock:
                ended = self._end_outage() if not self._held else None
                if not self._held:
                    break
                item = self._held.popleft()
                self._held_bytes -= item.size
                self._in_flight = item
            try:
                item.write()
            except Exception as exc:
                with self._lock:
                    self._in_flight = None
                    if is_outage(exc):
                        self._held.appendleft(item)
                        self._held_bytes += item.size
                        self._enforce_bound()
                        return False
                    self._rejected += 1
                log.error(
                    "held write refused by the store, not retried (%s): %s",
                    item.what,
                    _reason(exc),
                )
                continue
            with self._lock:
                self._in_flight = None
                self._written += 1
        if ended is not None and self._on_outage is not None:
            try:
                self._on_outage(ended)
            except Exception:
                log.exception("could not keep the store outage's record")
        return True

    def _end_outage(self) -> StoreOutage | None:
        outage, self._outage = self._outage, None
        if outage is None:
            return None
        ended = StoreOutage(
            started_at=outage.since,
            ended_at=self._clock(),
            held=self._buffered - outage.buffered_before,
            written=self._written - outage.written_before,
            dropped=self._dropped - outage.dropped_before,
            reason=outage.reason,
        )
        log.warning(
            "store back after %.1f s: %d held write(s) written, %d dropped over the bound",
            ended.ended_at - ended.started_at,
            ended.written,
            ended.dropped,
        )
        return ended

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        """Start writing what gets held, on a thread of the buffer's own."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="store-buffer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = self._retry_s
        while True:
            self._wake.wait()
            if self._stopping.is_set():
                return
            self._wake.clear()
            if self._drain():
                delay = self._retry_s
                continue
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, self._retry_max_s)
            self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> int:
        """Stop the thread, then try once more to write what is held (after the last
        write was submitted); what is still held then is counted as lost and logged.
        Returns how many writes were lost so."""
        thread, self._thread = self._thread, None
        self._stopping.set()
        self._wake.set()
        if thread is not None:
            thread.join(timeout_s)
        with self._lock:
            held = bool(self._held)
        # A thread still in a write keeps the order only if nothing overtakes it.
        busy = thread is not None and thread.is_alive()
        if held and (busy or not self._drain()):
            with self._lock:
                left = len(self._held)
                self._lost_at_stop += left
                self._held.clear()
                self._held_bytes = 0
            log.error("store still out at stop: %d held write(s) not written", left)
            return left
        return 0

    def _held_count(self) -> int:
        return len(self._held) + (self._in_flight is not None)

    def _held_size(self) -> int:
        in_flight = self._in_flight.size if self._in_flight is not None else 0
        return self._held_bytes + in_flight

    def counts(self) -> BufferCounts:
        with self._lock:
            outage = self._outage
            return BufferCounts(
                held=self._held_count(),
                held_bytes=self._held_size(),
                buffered=self._buffered,
                written=self._written,
                dropped=self._dropped,
                rejected=self._rejected,
                lost_at_stop=self._lost_at_stop,
                outages=self._outages,
                out_since=outage.since if outage is not None else None,
            )
