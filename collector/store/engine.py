"""The store's engine and sessions: one engine per ``Store``, one transaction per call.

SQLite (the default, one embedded file) and PostgreSQL (a fleet) are both first-class;
other SQLAlchemy backends may work but are untested. The schema is brought up to date
by the migrations (``collector.store.migrate``) on first use, not when the store is
made, so a process started before its database answers starts anyway and reports the
failure where it reads.

A store made with ``create=False`` (what the read commands use: status, recommend from
stored samples, dashboard, apply) never makes a database: a missing SQLite file, or a
database without batchscope's tables, is a ``ConfigError("db_url", ...)`` saying so,
and nothing is written. An existing store of an older revision is still upgraded in
place, as by any batchscope that opens it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, func, insert, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from collector.errors import ConfigError
from collector.store.bulk import json_loads, on_driver
from collector.store.migrate import holds_store_schema, upgrade_to_head
from collector.store.schema import Base

__all__ = ["SQLITE_KEPT_CONNECTIONS", "Database", "Executor", "create_store_engine"]

# What a write runs its statements on: a session, or (the scrape's hot path, which
# needs no ORM) a connection.
Executor = Session | Connection

# How long a SQLite writer waits for another writer's lock before failing.
_SQLITE_BUSY_TIMEOUT_MS = 10_000
# Connections a SQLite file store keeps open between uses: one writer at a time (SQLite
# takes one) and one reader beside it. Each kept connection holds two descriptors and
# a page cache of up to 2 MiB; a pool that kept every connection a rare peak opened
# kept those for as long as the process ran (an hour of serve went from 19 to 23
# descriptors, in steps beside its RSS's). Connections beyond these are opened for a
# peak and closed when it is over: opening one costs about 0.2 ms.
SQLITE_KEPT_CONNECTIONS = 2
# Connection execution option that makes a SQLite transaction take the write lock at
# BEGIN (see ``_configure_sqlite``).
_WRITE_OPTION = "batchscope_write"
# Serialises schema upgrades of one PostgreSQL database across processes.
_PG_MIGRATION_LOCK = 0x62_73_6D_67  # "bsmg"
# Where a missing store comes from, for the message that says it is missing.
_MADE_BY = "the commands that collect (collect, serve, demo) create one"


class Database:
    """An engine, its read and write sessions, and the schema set up on first use.

    ``url`` is a SQLAlchemy URL: ``sqlite:///batchscope.db`` (a file, relative to the
    working directory; ``?timeout=S`` sets how long a writer waits for another
    writer's lock, 10 s by default), ``sqlite://`` (in memory, one connection; tests only) or
    ``postgresql+psycopg://user@host/db``. A URL that cannot be parsed or names an
    unknown backend raises ``ConfigError("db_url", ...)`` here; a database that cannot
    be opened raises it on first use (and is tried again on the next). The password
    is never part of a message.

    ``pool_size`` is how many connections the pool keeps (SQLAlchemy's default, 5,
    when not given; up to 10 more while busy): a caller whose threads write at once
    (the collector's scrape pool and its jobs) passes how many threads may use the
    store together. A SQLite file store keeps at most ``SQLITE_KEPT_CONNECTIONS`` of
    those open between uses and opens the rest when they are needed; an in-memory one
    has one connection whatever is given.

    ``create=False`` opens only an existing store: a SQLite file that is not there, or
    a database that holds none of batchscope's tables, raises ``ConfigError("db_url",
    ...)`` on first use instead of being made (and is looked for again on the next).
    """

    def __init__(self, url: str, *, create: bool = True, pool_size: int | None = None) -> None:
        self._engine = create_store_engine(url, pool_size=pool_size)
        self._create = create
        self.url = self._engine.url.render_as_string(hide_password=True)
        self._dialect = self._engine.dialect.name
        reader = self._engine
        if self._dialect == "postgresql":
            # A read of samples and their batch stats is two queries; READ COMMITTED
            # would let a concurrent write or retention land between them. Read-only
            # transactions never fail under REPEATABLE READ.
            reader = reader.execution_options(isolation_level="REPEATABLE READ")
        self._reader = sessionmaker(reader, expire_on_commit=False)
        self._write_engine = self._engine.execution_options(**{_WRITE_OPTION: True})
        self._writer = sessionmaker(self._write_engine, expire_on_commit=False)
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        # The write cache: what this store wrote or read before, so a scrape's write
        # needs no query to find it again. Filled only after a commit, emptied for a
        # target whose write failed (``_drop_cached``) or that is gone
        # (``forget_target``). Writes of one target in this process take turns under
        # its lock (``_target_lock``), so they see what the previous one committed.
        self._target_ids: dict[str, int] = {}
        self._model_ids: dict[int, dict[tuple[str, str], int]] = {}
        self._model_keys: dict[int, frozenset[tuple[str, str]]] = {}
        self._latest_config_json: dict[int, dict[str, str]] = {}
        self._server_versions: dict[int, str] = {}
        self._source_up: dict[int, dict[str, bool]] = {}
        self._target_locks: dict[str, threading.Lock] = {}
        self._target_locks_guard = threading.Lock()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every pooled connection. The store must not be used afterwards."""
        self._engine.dispose()

    def open(self) -> None:
        """Connect and bring the schema up to date now (otherwise the first read or
        write does); raises ``ConfigError("db_url", ...)`` when the database cannot be
        opened, or (``create=False``) when it is not an existing batchscope store. For
        callers that would rather fail at start (the collector, the dashboard)."""
        if self._schema_ready:  # every write asks: no lock once it is
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            if not self._create:
                # Before connecting: connecting to a missing SQLite file makes it.
                self._require_sqlite_file()
            try:
                with self._engine.execution_options(**{_WRITE_OPTION: True}).begin() as conn:
                    if self._dialect == "postgresql":
                        conn.execute(
                            text("SELECT pg_advisory_xact_lock(:key)"),
                            {"key": _PG_MIGRATION_LOCK},
                        )
                    if not self._create and not holds_store_schema(conn):
                        raise ConfigError(
                            "db_url",
                            f"{self.url} is not a batchscope store (it has none of its "
                            f"tables); {_MADE_BY}",
                        )
                    upgrade_to_head(conn)
            except DBAPIError as err:
                raise ConfigError(
                    "db_url", f"cannot open database {self.url}: {err.orig or err}"
                ) from err
            self._schema_ready = True

    def _require_sqlite_file(self) -> None:
        """``ConfigError`` when this is a SQLite file store whose file is not there."""
        url = self._engine.url
        path = url.database
        if self._dialect != "sqlite" or not path or path == ":memory:":
            return  # an in-memory database is empty: caught as "not a batchscope store"
        if url.query.get("uri") in ("true", "1"):
            return  # a sqlite3 "file:" URI; its own mode= says whether it may be made
        if not Path(path).exists():
            raise ConfigError(
                "db_url",
                f"no batchscope store at {self.url}: the file {path} does not exist; {_MADE_BY}",
            )

    # ------------------------------------------------------------------ write cache

    def _target_lock(self, name: str) -> threading.Lock:
        """The lock under which this process writes target ``name``."""
        lock = self._target_locks.get(name)
        if lock is None:
            with self._target_locks_guard:
                lock = self._target_locks.setdefault(name, threading.Lock())
        return lock

    def _drop_cached(self, name: str) -> None:
        """Forget what the write cache holds about target ``name`` (its lock stays), so
        its next write finds it again in the database."""
        target_id = self._target_ids.pop(name, None)
        if target_id is None:
            return
        for cache in (
            self._model_ids,
            self._model_keys,
            self._latest_config_json,
            self._server_versions,
            self._source_up,
        ):
            cache.pop(target_id, None)

    # ------------------------------------------------------------------ sessions

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One transaction that commits on success and rolls back on any error."""
        self.open()
        with self._writer.begin() as session:
            yield session

    @contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        """``_write`` on a bare connection: a scrape's write needs no ORM, and a session
        costs it more than its SQL does (SQLite still begins ``IMMEDIATE``)."""
        self.open()
        with self._write_engine.begin() as connection:
            yield connection

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """One read transaction, so a multi-query read sees one snapshot (SQLite's WAL
        snapshot; REPEATABLE READ on PostgreSQL)."""
        self.open()
        with self._reader() as session:
            yield session

    def _insert_ignoring_duplicates(
        self,
        session: Executor,
        table: type[Base],
        rows: list[dict[str, Any]],
        unique: Sequence[str],
    ) -> None:
        """Insert ``rows``, skipping those that collide on the ``unique`` columns, so a
        concurrent writer that got there first is not an error."""
        if not rows:
            return
        if self._dialect == "postgresql":
            session.execute(pg_insert(table).on_conflict_do_nothing(index_elements=unique), rows)
        elif self._dialect == "sqlite":
            session.execute(
                sqlite_insert(table).on_conflict_do_nothing(index_elements=unique), rows
            )
        else:  # Portable fallback; races here surface as an IntegrityError.
            columns = [getattr(table, c) for c in unique]
            for row in rows:
                match = [col == row[c] for col, c in zip(columns, unique, strict=True)]
                if session.scalar(select(func.count()).select_from(table).where(*match)) == 0:
                    session.execute(insert(table), [row])

    def _upsert(
        self, session: Session, table: type[Base], row: dict[str, Any], key: Sequence[str]
    ) -> None:
        """Insert ``row`` or, when one with the same ``key`` columns exists, update it."""
        updates = {k: v for k, v in row.items() if k not in key}
        if self._dialect in ("postgresql", "sqlite"):
            stmt = (pg_insert if self._dialect == "postgresql" else sqlite_insert)(table)
            session.execute(
                stmt.values(row).on_conflict_do_update(index_elements=key, set_=updates)
            )
            return
        existing = session.get(table, tuple(row[k] for k in key))
        if existing is None:
            session.add(table(**row))
        else:
            for name, value in updates.items():
                setattr(existing, name, value)


# --------------------------------------------------------------------------- engine


def create_store_engine(url: str, *, pool_size: int | None = None) -> Engine:
    """An engine for ``url``, or ``ConfigError("db_url", ...)``, its pool keeping
    ``pool_size`` connections when given. Connects to nothing."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        # The message would repeat the URL, password included.
        raise ConfigError(
            "db_url",
            "not a database URL (expected e.g. sqlite:///batchscope.db or "
            "postgresql+psycopg://user@host/db)",
        ) from None
    shown = parsed.render_as_string(hide_password=True)
    if pool_size is not None and pool_size < 1:
        raise ValueError(f"pool_size must be at least 1, got {pool_size}")
    options: dict[str, Any] = {} if pool_size is None else {"pool_size": pool_size}
    try:
        if parsed.get_backend_name() == "sqlite":
            return _create_sqlite_engine(parsed, options)
        # pre_ping: a fleet database restarts or drops idle connections.
        return create_engine(parsed, pool_pre_ping=True, json_deserializer=json_loads, **options)
    except (ArgumentError, NoSuchModuleError, ImportError) as err:
        raise ConfigError("db_url", f"unsupported database URL {shown}: {err}") from None


# An empty dict that nothing ever adds to: its ``get`` gives None for any key, in C,
# without the Python frame a function would cost on every NULL bound.
_NO_ADAPTATION: dict[object, None] = {}


def _bind_none_directly() -> None:
    """Make the sqlite3 driver bind ``None`` through an adapter that gives it back.

    Without one, the driver adapts every ``None`` parameter by looking for an adapter
    in vain and then for ``__adapt__`` and ``__conform__`` (two failed attribute
    lookups), and a scrape's rows hold many NULLs (the statistics columns between two
    readings of the statistics, absent optional counters): that search cost as much
    as binding and inserting the rest of the rows. Found in the adapters, ``None`` is
    bound as NULL all the same. The adapters are the driver's, for the whole process;
    only this one, which changes nothing stored, is added."""
    sqlite3.register_adapter(type(None), _NO_ADAPTATION.get)


def _create_sqlite_engine(url: URL, options: dict[str, Any]) -> Engine:
    _bind_none_directly()
    in_memory = url.database in (None, "", ":memory:")
    if in_memory:
        # One shared connection, or each thread would see its own empty database.
        engine = create_engine(
            url,
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
            json_deserializer=json_loads,
        )
    else:
        engine = create_engine(url, json_deserializer=json_loads, **_sqlite_pool(options))
    # The URL's ``timeout`` (seconds) is the driver's busy timeout; else batchscope's.
    busy_ms = None if "timeout" in url.query else _SQLITE_BUSY_TIMEOUT_MS
    _configure_sqlite(engine, wal=not in_memory, busy_timeout_ms=busy_ms)
    return engine


def _sqlite_pool(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with a pool that serves as many connections at once as before, of
    which at most ``SQLITE_KEPT_CONNECTIONS`` stay open between uses."""
    size = options.get("pool_size", 5)  # SQLAlchemy's default
    kept = min(size, SQLITE_KEPT_CONNECTIONS)
    # max_overflow: SQLAlchemy's 10 beyond the size asked for, as for other stores.
    return {**options, "pool_size": kept, "max_overflow": size - kept + 10}


def _configure_sqlite(engine: Engine, *, wal: bool, busy_timeout_ms: int | None) -> None:
    """WAL lets the dashboard read while the collector writes; the busy timeout makes
    a second writer wait instead of failing; foreign keys are off by default in SQLite.

    The sqlite3 driver's own transaction handling is replaced by explicit BEGINs:
    it would start a transaction only at the first INSERT/UPDATE, so a read-then-write
    (``record_scrape``) would not be atomic. Write sessions begin ``IMMEDIATE`` to take
    the write lock up front; a deferred transaction that read first and then tries to
    write fails with "database is locked" instead of waiting.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if busy_timeout_ms is not None:
            cursor.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if wal:
            cursor.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable across application crashes in WAL mode, and much faster.
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        sql = "BEGIN IMMEDIATE" if write else "BEGIN"
        on_driver(connection, sql, lambda driver: driver.execute(sql))
