"""Hot statements without SQLAlchemy's per-row parameter processing.

A scrape writes about twenty rows of fifty-odd columns and updates its target's row;
building the parameters of a compiled statement for each of them cost more than the
database's own work. Here each statement is compiled once per dialect from the
SQLAlchemy ``Table`` (so no column list is written by hand), its parameters go in as
tuples in the compiled order, with JSON columns serialised here, straight to the
driver's connection (``on_driver``): SQLAlchemy still owns the connection and the
transaction, and a driver error is raised as SQLAlchemy's, as its own execution would
raise it (a lost connection invalidated), without its execution context around every
statement, which cost a scrape's write more than the statements' parameters.

JSON is written as SQLAlchemy's ``JSON(none_as_null=True)`` would (``None`` is SQL
NULL), but compact, by orjson where that reads back the same as ``json.dumps``. A float
that is not finite (a summary quantile without observations is NaN) is written as
``json.dumps`` does on SQLite (``NaN``, read back by ``json.loads``); PostgreSQL's
``json`` refuses that token, so there it is written as the string ``"NaN"``
(``"Infinity"``, ``"-Infinity"``), which ``float()`` reads back: readers of such
documents convert with ``float``.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import (
    JSON,
    Connection,
    Dialect,
    Table,
    bindparam,
    insert,
    literal_column,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

__all__ = [
    "INCREMENT",
    "BulkInsert",
    "KeyedUpdate",
    "TupleInsert",
    "json_encoder",
    "json_loads",
    "json_text",
    "on_driver",
]

_COMPACT = json.JSONEncoder(separators=(",", ":"))
_COMPACT_FINITE = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_PYFORMAT = re.compile(r"%\((\w+)\)s")

JsonEncoder = Callable[[Any], str | None]


def json_text(value: Any, *, finite_only: bool = False) -> str | None:
    """``value`` as the compact JSON text stored for it (``None`` stays NULL); with
    ``finite_only`` (PostgreSQL) a non-finite float is written as a string."""
    if value is None:
        return None
    if not finite_only:
        return _COMPACT.encode(value)
    try:
        return _COMPACT_FINITE.encode(value)
    except ValueError:  # rare: only a document holding NaN or an infinity
        return _COMPACT_FINITE.encode(_finite(value))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@functools.cache
def json_encoder(finite_only: bool) -> JsonEncoder:
    """``json_text`` with ``finite_only``, by orjson (about ten times faster) where
    that reads back the same: orjson writes NaN and the infinities as ``null``, so a
    document whose text holds a ``null`` is encoded again as ``json_text`` does, and so
    is one orjson refuses (an integer past 64 bits, a key that is not a string). The
    text may differ from ``json.dumps``'s (``1e16`` for ``1e+16``, UTF-8 for
    ``\\u`` escapes), never the value read back."""
    slow = functools.partial(json_text, finite_only=finite_only)
    dumps = orjson.dumps

    def encode(value: Any) -> str | None:
        if value is None:
            return None
        try:
            text = dumps(value)
        except TypeError:  # orjson.JSONEncodeError
            return slow(value)
        if b"null" in text:
            return slow(value)
        return text.decode()

    return encode


def json_loads(text: str | bytes) -> Any:
    """A stored JSON document read back, by orjson (several times faster than
    ``json.loads``: a window of samples holds thousands of documents) where that gives
    the same values; otherwise by ``json.loads``: a document orjson refuses (``NaN`` or
    an infinity, as written on SQLite), and one with a run of 19 or more digits, where
    an integer may not fit 64 bits (orjson would read it as a float)."""
    long_digits = _LONG_DIGITS_BYTES if isinstance(text, bytes) else _LONG_DIGITS
    if long_digits.search(text) is None:  # type: ignore[arg-type]
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


_LONG_DIGITS = re.compile(r"\d{19}")
_LONG_DIGITS_BYTES = re.compile(rb"\d{19}")


def dialect_json_encoder(dialect: Dialect) -> JsonEncoder:
    """How JSON documents are written on ``dialect`` (see the module's docstring)."""
    return json_encoder(dialect.name == "postgresql")


class Increment:
    """A change of ``KeyedUpdate`` that adds one to the column's stored value."""

    def __repr__(self) -> str:
        return "INCREMENT"


INCREMENT = Increment()


def _driver_sql(compiled: Any, dialect: Dialect, what: str) -> tuple[str, list[str]]:
    """The SQL of ``compiled`` in the driver's positional style, and the names of its
    parameters in order."""
    sql: str = compiled.string
    if dialect.paramstyle == "pyformat":
        return _PYFORMAT.sub("%s", sql), _PYFORMAT.findall(sql)
    if dialect.positional and compiled.positiontup is not None:
        return sql, list(compiled.positiontup)
    raise NotImplementedError(f"{what}: paramstyle {dialect.paramstyle}")


def _insert_columns(table: Table) -> list[str]:
    """Every column of ``table`` but its generated id."""
    generated = table.autoincrement_column
    return [c.name for c in table.columns if c is not generated]


@dataclass(frozen=True)
class _Plan:
    """One table's insert on one dialect: the SQL in the driver's positional style,
    and how a row (by column name) becomes its parameters."""

    sql: str
    values_of: Callable[[Any], tuple[Any, ...]]
    json_at: tuple[int, ...]
    encode: JsonEncoder

    def parameters(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        values = self.values_of(row)
        if not self.json_at:
            return values
        out = list(values)
        encode = self.encode
        for i in self.json_at:
            out[i] = encode(out[i])
        return tuple(out)


def _insert_plan(table: Table, dialect: Dialect, names: Sequence[str]) -> tuple[str, list[str]]:
    """``INSERT INTO table`` of the columns ``names``, compiled for ``dialect``: its SQL
    and its parameters' names in order. ``names`` are every column but the generated
    id, or some of them when each column left out may be NULL and has no default (it
    is then NULL)."""
    columns = _insert_columns(table)
    if len(set(names)) != len(names) or not set(names) <= set(columns):
        raise RuntimeError(f"bulk insert into {table.name}: the values are not its columns")
    for name in set(columns) - set(names):
        column = table.c[name]
        if not column.nullable or column.default is not None or column.server_default is not None:
            raise RuntimeError(f"bulk insert into {table.name}: {name} cannot be left out")
    # inline(): no RETURNING of the generated id.
    compiled = insert(table).inline().compile(dialect=dialect, column_keys=list(names))
    sql, order = _driver_sql(compiled, dialect, f"bulk insert into {table.name}")
    if sorted(order) != sorted(names):
        raise RuntimeError(f"bulk insert into {table.name}: unexpected parameters")
    return sql, order


def _getter(positions: Sequence[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """``itemgetter`` that always returns a tuple, even of one item."""
    get = operator.itemgetter(*positions)
    return get if len(positions) > 1 else lambda row: (get(row),)


class BulkInsert:
    """``INSERT INTO table (every column but the generated id) VALUES ...`` for many
    rows at once, each row a mapping with every one of those columns. Nothing is
    returned: no caller needs the new ids."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._plans: dict[str, _Plan] = {}

    def execute(self, session: Session | Connection, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert ``rows`` in the transaction of ``session`` (a session or connection)."""
        connection = session if isinstance(session, Connection) else session.connection()
        dialect = connection.dialect
        plan = self._plans.get(dialect.name)
        if plan is None:
            plan = self._plans[dialect.name] = self._plan(dialect)
        parameters = [plan.parameters(row) for row in rows]
        if parameters:
            insert_rows = functools.partial(_on_cursor, plan.sql, parameters, True)
            on_driver(connection, plan.sql, insert_rows)

    def _plan(self, dialect: Dialect) -> _Plan:
        columns = _insert_columns(self.table)
        sql, order = _insert_plan(self.table, dialect, columns)
        json_columns = {c.name for c in self.table.columns if isinstance(c.type, JSON)}
        return _Plan(
            sql=sql,
            values_of=_getter(order),
            json_at=tuple(i for i, name in enumerate(order) if name in json_columns),
            encode=dialect_json_encoder(dialect),
        )


class TupleInsert:
    """``BulkInsert`` for rows given as tuples in the order of ``names`` (a caller's
    own order, every column but the generated id once, or those of them that are not
    left NULL: see ``_insert_plan``), JSON columns already encoded
    (``dialect_json_encoder``): each tuple is put in the compiled statement's column
    order by one ``itemgetter``, so no row is built as a mapping first.

    On PostgreSQL the rows go by ``COPY ... FROM STDIN`` instead, in the transaction of
    the connection: psycopg's executemany parses a statement of more than 50
    parameters again on every call and sends each row on its own, which cost more than
    the rest of a scrape's write. Its errors are raised as SQLAlchemy's, as the
    executemany's would be."""

    def __init__(self, table: Table, names: Sequence[str]) -> None:
        self.table = table
        self.names = tuple(names)
        self._plans: dict[str, tuple[str, Callable[[Any], tuple[Any, ...]]]] = {}

    def execute(self, connection: Connection, rows: Iterable[tuple[Any, ...]]) -> None:
        """Insert ``rows`` in the connection's transaction."""
        dialect = connection.dialect
        plan = self._plans.get(dialect.name)
        if plan is None:
            plan = self._plans[dialect.name] = self._plan(dialect)
        sql, reorder = plan
        parameters = [reorder(row) for row in rows]
        if not parameters:
            return
        if dialect.name == "postgresql":
            on_driver(connection, sql, functools.partial(_copy, sql, parameters))
        else:
            on_driver(connection, sql, functools.partial(_on_cursor, sql, parameters, True))

    def _plan(self, dialect: Dialect) -> tuple[str, Callable[[Any], tuple[Any, ...]]]:
        sql, order = _insert_plan(self.table, dialect, self.names)
        if dialect.name == "postgresql":
            quote = dialect.identifier_preparer
            listed = ", ".join(quote.quote(name) for name in order)
            sql = f"COPY {quote.format_table(self.table)} ({listed}) FROM STDIN"
        at = {name: i for i, name in enumerate(self.names)}
        return sql, _getter([at[name] for name in order])


def on_driver(connection: Connection, sql: str, call: Callable[[Any], object]) -> Any:
    """``call(driver connection)`` in the transaction of ``connection``, which runs
    ``sql``; a driver error is raised as SQLAlchemy's (``DBAPIError.instance``, the
    subclass its own execution would raise), and a connection the server dropped is
    invalidated, not handed back to the pool for the next write."""
    dialect = connection.dialect
    dbapi_error = dialect.loaded_dbapi.Error
    driver = connection.connection.driver_connection
    assert driver is not None  # a checked-out connection
    try:
        return call(driver)
    except dbapi_error as err:
        lost = dialect.is_disconnect(err, driver, None)
        if lost:
            connection.invalidate(err)
        raise DBAPIError.instance(
            sql, None, err, dbapi_error, connection_invalidated=lost, dialect=dialect
        ) from err


def _copy(sql: str, rows: list[tuple[Any, ...]], driver: Any) -> None:
    """``rows`` into PostgreSQL by ``sql`` (a ``COPY ... FROM STDIN``) on psycopg."""
    with driver.cursor() as cursor, cursor.copy(sql) as copy:
        for row in rows:
            copy.write_row(row)


def _on_cursor(sql: str, parameters: Any, many: bool, driver: Any) -> int:
    """``sql`` with ``parameters`` (a sequence of them with ``many``) on a cursor of the
    driver's connection; the rows it changed."""
    cursor = driver.cursor()
    try:
        (cursor.executemany if many else cursor.execute)(sql, parameters)
        return int(cursor.rowcount)
    finally:
        cursor.close()


class KeyedUpdate:
    """``UPDATE table SET <changes> WHERE <key column> = ?`` of one row, compiled once
    per dialect and set of changed columns (a change ``INCREMENT`` adds one to the
    stored value). Returns how many rows it changed."""

    def __init__(self, table: Table, key: str) -> None:
        self.table = table
        self.key = key
        # (dialect, changed columns, incremented ones) -> SQL, and the changed column
        # of each parameter (None: the key).
        self._plans: dict[
            tuple[str, tuple[str, ...], frozenset[str]], tuple[str, list[str | None]]
        ] = {}

    def execute(self, connection: Connection, key_value: Any, changes: Mapping[str, Any]) -> int:
        increments = frozenset(n for n, v in changes.items() if v is INCREMENT)
        plan_key = (connection.dialect.name, tuple(changes), increments)
        plan = self._plans.get(plan_key)
        if plan is None:
            plan = self._plans[plan_key] = self._plan(connection.dialect, changes, increments)
        sql, order = plan
        parameters = tuple(key_value if name is None else changes[name] for name in order)
        update_row = functools.partial(_on_cursor, sql, parameters, False)
        return int(on_driver(connection, sql, update_row))

    def _plan(
        self, dialect: Dialect, changes: Iterable[str], increments: frozenset[str]
    ) -> tuple[str, list[str | None]]:
        table = self.table
        one_more = {name: table.c[name] + literal_column("1") for name in increments}
        stmt = update(table).where(table.c[self.key] == bindparam("key_value")).values(one_more)
        set_ = [name for name in changes if name not in increments]
        compiled = stmt.compile(dialect=dialect, column_keys=set_)
        sql, order = _driver_sql(compiled, dialect, f"update of {table.name}")
        if sorted(order) != sorted([*set_, "key_value"]):
            raise RuntimeError(f"update of {table.name}: unexpected parameters")
        return sql, [None if name == "key_value" else name for name in order]
