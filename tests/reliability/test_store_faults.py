"""The store out from under a running collector, by real faults from outside: SQLite
locked by another process's write transaction, the disk under it full, the PostgreSQL
server stopped and started again. The collector scrapes a simulated Triton fleet
meanwhile; what it could not write is held in memory within its bound and written,
in order, once the store is back; what was committed before is kept.

Disk full is a tmpfs of a few MiB mounted for the test (root may mount one; the test
is skipped, saying so, where mounting is not permitted) filled by a file until
ENOSPC, then freed by deleting that file. PostgreSQL is Debian's cluster, stopped
(``pg_ctlcluster ... stop -m fast``: connections are cut mid-transaction) and started
again; the test ends only once the server accepts connections again.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from collector.config import load_settings
from collector.errors import ConfigError
from collector.exporter.service import Exporter
from collector.scheduler import CollectorService
from collector.store import Store, StoreOutage
from collector.store.buffer import BufferCounts, WriteBuffer, payload_bytes
from collector.testbed.fleet import Fleet
from tests.reliability.conftest import FaultLedger
from tests.reliability.store_support import (
    StoredScrapes,
    fleet_collector,
    settings_for,
    stored_scrapes,
    wait_for_process_line,
)
from tests.support import free_port, start_process, wait_until

# Holds the write lock of the SQLite file argv[1] until a line comes on stdin.
_LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""
_HOLD_S = 3.0  # how long the other writer keeps the lock
_WAIT_S = 30.0  # the bound of every wait for the collector


@contextlib.contextmanager
def _write_locked(db: Path) -> Iterator[Callable[[], None]]:
    """``db``'s write lock held by another process (``BEGIN EXCLUSIVE``) from entry
    until the ``release()`` this yields is called; never left held on the way out."""
    holder = start_process(
        [sys.executable, "-c", _LOCK_HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def release() -> None:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=_WAIT_S) == 0

    try:
        wait_for_process_line(holder, "locked", _WAIT_S)
        yield release
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def _made(service: CollectorService) -> int:
    """Scrapes the collector made (every one succeeded: see ``_assert_all_made``)."""
    return sum(service.health(source).attempts for source in service.sources)


def _held_now(service: CollectorService) -> BufferCounts:
    return service.store_buffer()


def _assert_kept(before: StoredScrapes, after: StoredScrapes) -> None:
    """Nothing committed before the fault is gone; the writes kept their order."""
    assert set(before.sample_ids) <= set(after.sample_ids)
    assert after.in_write_order()
    assert after.down_transitions == 0  # a store outage is not a target's failure


def _assert_outages_kept(db_url: str, counts: BufferCounts) -> list[StoreOutage]:
    """The store keeps each outage with what became of the writes held meanwhile."""
    with Store(db_url) as store:
        outages = store.store_outages()
    assert outages and all(o.ended_at > o.started_at for o in outages)
    assert sum(o.held for o in outages) == counts.buffered
    assert sum(o.written for o in outages) == counts.written
    assert sum(o.dropped for o in outages) == counts.dropped
    return outages


def _status_text(db_url: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "collector.cli", "status", "--db", db_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "batchscope.store")


def test_the_buffer_bounds_are_validated_at_start_naming_the_field() -> None:
    for field, value in (("store_buffer_max_writes", "0"), ("store_buffer_max_bytes", "lots")):
        with pytest.raises(ConfigError, match=f"invalid setting {field}"):
            load_settings(overrides={field: value})


def test_sqlite_locked_by_another_writer(
    tmp_path: Path, fault_ledger: FaultLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="batchscope.store")
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}?timeout=0.3"  # a writer waits 0.3 s for the lock, then fails
    with Fleet(3, 2, tick_s=0.1) as fleet, fleet_collector(settings_for(fleet, url)) as service:
        wait_until(lambda: len(stored_scrapes(url).scrapes) >= 6, _WAIT_S, "first scrapes")
        before = stored_scrapes(url)
        with _write_locked(db) as release:
            locked_at = time.time()
            wait_until(lambda: _held_now(service).held > 0, _WAIT_S, "a write held")
            time.sleep(max(0.0, locked_at + _HOLD_S - time.time()))  # the lock's length
            peak = service.store_buffer()
            release()
            released_at = time.time()
        wait_until(lambda: _held_now(service).held == 0, _WAIT_S, "the held writes written")
        caught_up_s = time.time() - released_at
    counts, made = service.store_buffer(), _made(service)
    after = stored_scrapes(url)

    assert peak.held >= 3
    assert (counts.written, counts.dropped, counts.lost) == (counts.buffered, 0, 0)
    assert len(after.scrapes) == made  # every scrape made is in the store
    during = after.in_window(locked_at, released_at)
    assert during >= 3
    _assert_kept(before, after)
    outages = _assert_outages_kept(url, counts)
    assert "database is locked" in outages[0].reason
    logged = _log_text(caplog)
    assert "holding writes in memory" in logged and "store back after" in logged
    fault_ledger.record(
        area="store",
        fault="SQLite write lock held 3 s by another process (BEGIN EXCLUSIVE), busy timeout 0.3 s",
        tries=1,
        outcome=f"{counts.buffered} scrape writes held in memory (peak {peak.held}, "
        f"{peak.held_bytes} bytes), all written {caught_up_s:.1f} s after the lock was "
        f"released, in order; {during} scrapes of the locked window and {made}/{made} of "
        f"the run in the store; {len(before.sample_ids)} rows committed before all kept",
        lost="nothing",
    )


def _exported(url: str) -> dict[str, float]:
    """The exporter's store families, by name (and the lost counter by reason)."""
    text = requests.get(url + "metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("batchscope_store_"):
                out[sample.name + sample.labels.get("reason", "")] = sample.value
    return out


def test_the_exporter_shows_a_locked_store_on_metrics(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    """The exporter sidecar over a store another process locks: Prometheus sees the
    outage and the writes held, while the lock lasts, and the store back after."""
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}?timeout=0.3"
    with Fleet(2, 2, tick_s=0.1) as fleet:
        exporter = Exporter(
            settings_for(fleet, url, store_buffer_max_writes=4),
            host="127.0.0.1",
            port=free_port(),
        )
        with exporter:
            wait_until(lambda: len(stored_scrapes(url).scrapes) >= 4, _WAIT_S, "first scrapes")
            assert _exported(exporter.url)["batchscope_store_up"] == 1.0
            with _write_locked(db) as release:
                wait_until(
                    lambda: (
                        _exported(exporter.url)["batchscope_store_writes_lost_totaldropped"] > 0
                    ),
                    _WAIT_S,
                    "writes dropped over the bound of 4",
                )
                during = _exported(exporter.url)
                release()
            wait_until(
                lambda: _exported(exporter.url)["batchscope_store_up"] == 1.0,
                _WAIT_S,
                "the store back",
            )
            after = _exported(exporter.url)
            counts = exporter.collector.store_buffer()
    assert during["batchscope_store_up"] == 0.0
    assert 1 <= during["batchscope_store_writes_held"] <= 4
    assert during["batchscope_store_writes_held_bytes"] > 0
    assert during["batchscope_store_outages_total"] == 1.0
    assert after["batchscope_store_writes_held"] == 0.0
    assert after["batchscope_store_outages_total"] == 1.0
    assert after["batchscope_store_writes_lost_totaldropped"] == counts.dropped > 0
    assert after["batchscope_store_writes_lost_totalrejected"] == 0.0
    fault_ledger.record(
        area="store",
        fault="SQLite locked by another process under the exporter sidecar (buffer bound 4 writes)",
        tries=1,
        outcome=f"/metrics said batchscope_store_up 0 with "
        f"{during['batchscope_store_writes_held']:.0f} writes held while locked, then 1 with 0 "
        f"held; batchscope_store_writes_lost_total{{reason=dropped}} "
        f"{after['batchscope_store_writes_lost_totaldropped']:.0f}, as the buffer counted",
        lost=f"{counts.dropped} writes over the bound, counted on /metrics",
    )


def _fill(path: Path) -> int:
    """Write ``path`` until its file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with path.open("wb", buffering=0) as out:
        while True:
            try:
                written += out.write(chunk) or 0
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
                break
    return written


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs of 8 MiB of its own, unmounted after the test."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): needs root")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], timeout=30)


def test_disk_full_then_freed(
    small_disk: Path, fault_ledger: FaultLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="batchscope.store")
    db = small_disk / "store.db"
    url = f"sqlite:///{db}"
    bound = 8  # held writes at most: a full disk for long outlasts it
    with (
        Fleet(3, 2, tick_s=0.1) as fleet,
        fleet_collector(settings_for(fleet, url, store_buffer_max_writes=bound)) as service,
    ):
        wait_until(lambda: len(stored_scrapes(url).scrapes) >= 6, _WAIT_S, "first scrapes")
        before = stored_scrapes(url)
        filler = small_disk / "filler"
        filled = _fill(filler)
        wait_until(lambda: _held_now(service).held > 0, _WAIT_S, "a write held (disk full)")
        full_at = time.time()
        wait_until(lambda: _held_now(service).dropped >= 5, _WAIT_S, "the bound passed")
        peak = service.store_buffer()
        filler.unlink()
        freed_at = time.time()
        wait_until(lambda: _held_now(service).held == 0, _WAIT_S, "the held writes written")
        caught_up_s = time.time() - freed_at
    counts, made = service.store_buffer(), _made(service)
    after = stored_scrapes(url)
    with sqlite3.connect(db) as conn:
        integrity = conn.execute("PRAGMA integrity_check").fetchall()

    assert integrity == [("ok",)]
    assert peak.held <= bound and counts.dropped >= 5
    assert counts.written == counts.buffered - counts.dropped and counts.rejected == 0
    # The scrapes not in the store are exactly the ones dropped over the bound.
    assert made - len(after.scrapes) == counts.dropped
    _assert_kept(before, after)
    _assert_outages_kept(url, counts)
    status = _status_text(url)
    assert f"{counts.dropped} dropped over the bound" in status, status
    logged = _log_text(caplog)
    assert "dropping the oldest" in logged and "store back after" in logged
    fault_ledger.record(
        area="store",
        fault="disk full: the SQLite store on an 8 MiB tmpfs filled by a file "
        f"({filled // 1024} KiB) until ENOSPC, then the file deleted",
        tries=1,
        outcome=f"no crash; {counts.buffered} scrape writes held (bound {bound}: "
        f"{counts.dropped} oldest dropped, counted and logged), {counts.written} written "
        f"{caught_up_s:.1f} s after space returned ({freed_at - full_at:.1f} s full), in "
        f"order; integrity_check ok; the drop shown by batchscope status; "
        f"{len(before.sample_ids)} rows committed before all kept",
        lost=f"{counts.dropped} scrapes dropped over the bound (counted); nothing committed",
    )


# --------------------------------------------------------------------------- PostgreSQL


def _cluster(port: int) -> tuple[str, str] | None:
    """The (version, name) of the Debian PostgreSQL cluster on ``port``."""
    try:
        listed = subprocess.run(
            ["pg_lsclusters", "--no-header"], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        return None
    for line in listed.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == str(port):
            return fields[0], fields[1]
    return None


def _accepts(url: str) -> bool:
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


def _pg_ctl(cluster: tuple[str, str], *action: str) -> None:
    done = subprocess.run(
        ["pg_ctlcluster", *cluster, *action], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.postgres
def test_postgresql_restarted_mid_write(
    pg_url: str, fault_ledger: FaultLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="batchscope.store")
    port = make_url(pg_url).port or 5432
    cluster = _cluster(port)
    if cluster is None:
        pytest.skip(f"no Debian PostgreSQL cluster (pg_lsclusters) on port {port} to restart")
    with Fleet(4, 4, tick_s=0.1) as fleet:
        settings = settings_for(fleet, pg_url, interval_s=0.2)
        with fleet_collector(settings) as service:
            wait_until(lambda: len(stored_scrapes(pg_url).scrapes) >= 8, _WAIT_S, "first scrapes")
            before = stored_scrapes(pg_url)
            try:
                # Fast shutdown: the server cuts every connection, in a transaction or not.
                _pg_ctl(cluster, "stop", "-m", "fast")
                stopped_at = time.time()
                wait_until(lambda: _held_now(service).held >= 20, _WAIT_S, "writes held")
                peak = service.store_buffer()
                _pg_ctl(cluster, "start")
                started_at = time.time()
            finally:
                if not _accepts(pg_url):
                    subprocess.run(["pg_ctlcluster", *cluster, "start"], timeout=120)
                wait_until(lambda: _accepts(pg_url), 60, "PostgreSQL to accept connections")
            wait_until(lambda: _held_now(service).held == 0, _WAIT_S, "the held writes written")
            caught_up_at = time.time()
        counts, made = service.store_buffer(), _made(service)
    after = stored_scrapes(pg_url)

    assert peak.out_since is not None and counts.out_since is None
    assert (counts.written, counts.dropped, counts.lost) == (counts.buffered, 0, 0)
    assert counts.buffered >= peak.held >= 20
    assert len(after.scrapes) == made
    during = after.in_window(peak.out_since, caught_up_at)
    assert during >= 20
    _assert_kept(before, after)
    _assert_outages_kept(pg_url, counts)
    assert "store back after" in _log_text(caplog)
    fault_ledger.record(
        area="store",
        fault="PostgreSQL stopped (fast shutdown, connections cut mid-write) and started "
        "again under a collector writing 20 scrapes/s",
        tries=1,
        outcome=f"stopped {started_at - stopped_at:.1f} s (first failed write to last held "
        f"one written: {caught_up_at - peak.out_since:.1f} s): {counts.buffered} scrape writes "
        f"held (peak {peak.held}, {peak.held_bytes} bytes); the collector reconnected and "
        f"wrote them all in order; {during} scrapes of the outage and {made}/{made} of the "
        f"run in the store; "
        f"{len(before.sample_ids)} rows committed before all kept",
        lost="nothing",
    )


def test_the_byte_bound_drops_the_oldest_and_the_rest_is_written_in_order(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    """Writes held behind another connection's write lock, bounded by bytes: the
    oldest go first, the others reach the store in the order they were made."""
    url = f"sqlite:///{tmp_path / 'store.db'}?timeout=0.1"
    errors = [f"error {i:02d} " + "x" * 400 for i in range(20)]
    each = payload_bytes(errors[0])
    with Store(url) as store:
        store.open()
        buffer = WriteBuffer(max_writes=1000, max_bytes=5 * each, retry_s=0.05, retry_max_s=0.1)
        other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        try:
            other.execute("BEGIN EXCLUSIVE")
            for i, error in enumerate(errors):
                write = functools.partial(
                    store.record_scrape, "t", "triton", kind="triton", started_at=float(i),
                    duration_s=0.1, error_kind="down" if i % 2 else None, error=error,
                )  # fmt: skip
                buffer.submit(
                    write, what=f"record {i}", size=functools.partial(payload_bytes, error)
                )
            held = buffer.counts()
            other.execute("COMMIT")
        finally:
            other.close()
        buffer.start()
        wait_until(lambda: buffer.counts().held == 0, _WAIT_S, "the held writes written")
        assert buffer.stop() == 0
        transitions = store.transitions("t")
    counts = buffer.counts()
    assert held.held == 5 and held.held_bytes <= 5 * each
    assert (counts.buffered, counts.dropped, counts.written, counts.lost) == (20, 15, 5, 15)
    # The five newest, in order: each flips the target up or down, so each is a transition.
    assert [t.at for t in transitions] == [15.0, 16.0, 17.0, 18.0, 19.0]
    fault_ledger.record(
        area="store",
        fault="SQLite locked by another connection (BEGIN EXCLUSIVE) while 20 writes came, "
        f"bound {5 * each} bytes (5 writes)",
        tries=1,
        outcome=f"held at most {held.held} writes ({held.held_bytes} bytes); the 15 oldest "
        "dropped and counted, the 5 newest written in order once the lock was released",
        lost="15 writes dropped over the bound (counted)",
    )


def test_a_held_write_being_retried_still_counts_with_its_bytes(tmp_path: Path) -> None:
    """While the buffer's thread retries a held write (here: waiting out SQLite's busy
    timeout behind another connection's lock), that write is still held: ``held`` and
    ``held_bytes`` both count it, as ``/metrics`` shows them."""
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}?timeout=0.5"
    error = "x" * 400
    with Store(url) as store:
        store.open()
        buffer = WriteBuffer(max_writes=10, max_bytes=10_000, retry_s=0.01, retry_max_s=0.01)
        with _write_locked(db) as release:
            write = functools.partial(
                store.record_scrape, "t", "triton", kind="triton", started_at=1.0,
                duration_s=0.1, error_kind="down", error=error,
            )  # fmt: skip
            buffer.submit(write, what="record", size=functools.partial(payload_bytes, error))
            buffer.start()
            # The thread spends nearly all of this in the write, waiting for the lock.
            seen: set[tuple[int, int]] = set()
            until = time.monotonic() + 1.5
            while time.monotonic() < until:
                counts = buffer.counts()
                seen.add((counts.held, counts.held_bytes))
            release()
        wait_until(lambda: buffer.counts().held == 0, _WAIT_S, "the held write written")
        assert buffer.stop() == 0
    assert seen == {(1, payload_bytes(error))}
    assert buffer.counts().held_bytes == 0
