"""``kill -9`` of ``batchscope serve`` at random points: the store it leaves always
passes SQLite's ``integrity_check`` and ``foreign_key_check``, is either untouched or
at the latest revision (never half migrated, also when the kill lands inside the first
migration of a fresh store), opens again without a failed migration, and the next
``serve`` starts and writes to it.

The runs alternate: the first kills a fresh store's ``serve`` inside its first
migration (seen from outside: the file exists and its write lock is taken, or on
PostgreSQL the migration's advisory lock is held); the odd runs wait until ``serve``
wrote (the previous kill's store took new writes) and kill it a random moment later;
the even ones kill it a random moment after its start (imports, opening, first
writes). A last ``serve`` must write again and stop cleanly. Three runs in ``make
test``; twenty (``long``) in ``make reliability``; once on PostgreSQL.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from collector.store import Store
from collector.store.engine import _PG_MIGRATION_LOCK
from collector.store.migrate import alembic_config
from collector.testbed.fleet import Fleet
from tests.reliability.conftest import FaultLedger
from tests.support import free_port, start_process, stop_process, wait_until

_START_S = 90.0  # the bound of a serve's start and first write (a loaded machine)
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


@dataclass(frozen=True)
class AfterKill:
    """What one kill left."""

    mode: str
    at_s: float  # when after the start
    samples: int  # model samples in the store after the kill
    wrote: bool  # whether this serve had written samples before it was killed
    revision: str | None  # the schema revision found (None: no schema at all)


def _serve(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return start_process(
            [sys.executable, "-m", "collector.cli", "serve", "--config", str(config)]
            + ["--port", str(free_port())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _config(path: Path, fleet: Fleet, db_url: str) -> Path:
    settings = {
        "targets": [
            {"url": url, "metrics_url": metrics}
            for url, metrics in zip(fleet.urls, fleet.metrics_urls, strict=True)
        ],
        "db_url": db_url,
        "interval_s": 0.3,
        "timeout_s": 2,
        "jitter_s": 0,
        "sources": ["triton"],
    }
    path.write_text(yaml.safe_dump(settings))
    return path


def _revision_and_samples(db_url: str) -> tuple[str | None, int]:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            revision = None
            if "alembic_version" in tables:
                revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            assert revision is not None or not tables & {"targets", "model_samples"}, (
                f"a store with tables {sorted(tables)} but no revision: half migrated"
            )
            samples = 0
            if "model_samples" in tables:
                samples = int(conn.execute(text("SELECT count(*) FROM model_samples")).scalar_one())
            return revision, samples
    finally:
        engine.dispose()


def _sqlite_checks(db: Path) -> None:
    if not db.exists():
        return
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def _sqlite_migrating(db: Path) -> Callable[[], bool]:
    """True once the store's file exists and its write lock is taken: before any
    scrape is written, only the first migration takes it."""

    def migrating() -> bool:
        if not db.exists():
            return False
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError as err:
            return "locked" in str(err)
        finally:
            probe.close()

    return migrating


def _pg_migrating(db_url: str) -> Callable[[], bool]:
    """True while some session holds the store's migration lock."""
    engine = create_engine(db_url, poolclass=NullPool)
    query = text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND ((classid::bigint << 32) | objid::bigint) = :key"
    )

    def migrating() -> bool:
        try:
            with engine.connect() as conn:
                return bool(conn.execute(query, {"key": _PG_MIGRATION_LOCK}).scalar_one())
        except OperationalError:
            return False

    return migrating


def _grew(db_url: str, samples: int) -> Callable[[], bool]:
    """True once the store holds more than ``samples`` model samples."""
    return lambda: _revision_and_samples(db_url)[1] > samples


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _kill_runs(
    tmp_path: Path,
    db_url: str,
    runs: int,
    migrating: Callable[[], bool],
    checks: Callable[[], None],
) -> tuple[list[AfterKill], int, int]:
    """``runs`` kills, then a serve that must write and stop; what each kill left,
    the samples before the last serve and after it."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    results: list[AfterKill] = []
    log = tmp_path / "serve.log"
    with Fleet(2, 2, tick_s=0.1) as fleet:
        config = _config(tmp_path / "batchscope.yaml", fleet, db_url)
        samples = 0
        for run in range(runs):
            mode = "first migration" if run == 0 else ("after a write" if run % 2 else "any")
            proc = _serve(config, log)
            started = time.monotonic()
            try:
                if mode == "first migration":
                    wait_until(migrating, _START_S, "the first migration", every_s=0.002)
                elif mode == "after a write":
                    wait_until(
                        _grew(db_url, samples),
                        _START_S,
                        f"serve to write after the previous kill (seed {seed})",
                        every_s=0.1,
                    )
                    time.sleep(rng.uniform(0.0, 1.5))  # a random point of its writes
                else:
                    time.sleep(rng.uniform(0.2, 4.0))  # a random point from its start
                assert proc.poll() is None, f"serve exited by itself: see {log.name}"
                at_s = time.monotonic() - started
                _kill(proc)
            finally:
                stop_process(proc)
            checks()
            committed = samples
            revision, samples = _revision_and_samples(db_url)
            assert revision in (None, HEAD), f"revision {revision} after a kill (seed {seed})"
            assert samples >= committed, f"committed samples lost (seed {seed})"
            results.append(
                AfterKill(mode, at_s, samples, wrote=samples > committed, revision=revision)
            )
            store = Store(db_url, create=True)
            try:
                store.open()  # needs no migration, or a whole one that succeeds
            finally:
                store.close()
            assert _revision_and_samples(db_url)[0] == HEAD
        # The last kill's store takes new writes, and serve stops cleanly on it.
        before = samples
        proc = _serve(config, log)
        try:
            wait_until(
                _grew(db_url, before),
                _START_S,
                f"the last serve to write (seed {seed})",
                every_s=0.1,
            )
        finally:
            stop_process(proc)
        assert proc.returncode == 0
        checks()
        return results, before, _revision_and_samples(db_url)[1]


def _outcome(results: list[AfterKill], before: int, after: int, checks: str) -> str:
    fresh = results[0]
    landed = "inside it (no table left)" if fresh.revision is None else "after it committed"
    at = sorted(r.at_s for r in results[1:])
    spread = f"{at[0]:.1f}-{at[-1]:.1f} s after start" if at else "none"
    wrote = sum(r.wrote for r in results[1:])
    return (
        f"kill during a fresh store's first migration landed {landed}; the other "
        f"{len(results) - 1} kills at {spread} ({wrote} of them while writing, the others "
        f"still starting), {results[-1].samples} model samples stored by the last; every "
        f"store passed {checks} and was at revision {HEAD} after opening; the last "
        f"serve wrote ({before} -> {after} samples) and stopped with status 0"
    )


def _sqlite_kill_test(tmp_path: Path, runs: int, fault_ledger: FaultLedger) -> None:
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}"
    results, before, after = _kill_runs(
        tmp_path, url, runs, _sqlite_migrating(db), lambda: _sqlite_checks(db)
    )
    fault_ledger.record(
        area="store",
        fault=f"kill -9 of batchscope serve on a SQLite store at random points, {runs} runs "
        "(integrity_check, foreign_key_check and revision after each)",
        tries=runs,
        outcome=_outcome(results, before, after, "integrity_check and foreign_key_check"),
        lost="nothing committed (only what each killed process held in memory)",
    )


def test_kill_serve_sqlite(tmp_path: Path, fault_ledger: FaultLedger) -> None:
    _sqlite_kill_test(tmp_path, 3, fault_ledger)


@pytest.mark.long
def test_kill_serve_sqlite_twenty_times(tmp_path: Path, fault_ledger: FaultLedger) -> None:
    _sqlite_kill_test(tmp_path, 20, fault_ledger)


@pytest.mark.long  # make test kills on SQLite; the fleet store in make reliability
@pytest.mark.postgres
def test_kill_serve_postgresql(tmp_path: Path, pg_url: str, fault_ledger: FaultLedger) -> None:
    results, before, after = _kill_runs(tmp_path, pg_url, 2, _pg_migrating(pg_url), lambda: None)
    fault_ledger.record(
        area="store",
        fault="kill -9 of batchscope serve on PostgreSQL, 2 runs (one inside the first "
        "migration, seen by its advisory lock), revision after each",
        tries=2,
        outcome=_outcome(
            results, before, after, "the revision check (PostgreSQL keeps its own constraints)"
        ),
        lost="nothing committed (only what each killed process held in memory)",
    )
