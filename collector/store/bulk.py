"""Hot inserts without SQLAlchemy's per-row parameter processing.

A scrape writes about twenty rows of fifty-odd columns; building the parameters of a
compiled statement for each of them cost more than the database's own work. Here the
``INSERT`` is compiled once per dialect from the SQLAlchemy ``Table`` (so no column
list is written by hand), each row becomes a tuple in its column order, with JSON
columns serialised here, and the tuples go to the driver's ``executemany`` through
``Connection.exec_driver_sql``: SQLAlchemy still owns the connection, the transaction,
and the wrapping of driver errors.

JSON is written as SQLAlchemy's ``JSON(none_as_null=True)`` would (``None`` is SQL
NULL, the rest ``json.dumps``), but compact. A float that is not finite (a summary
quantile without observations is NaN) is written as ``json.dumps`` does on SQLite
(``NaN``, read back by ``json.loads``); PostgreSQL's ``json`` refuses that token, so
there it is written as the string ``"NaN"`` (``"Infinity"``, ``"-Infinity"``), which
``float()`` reads back: readers of such documents convert with ``float``.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Dialect, Table, insert
from sqlalchemy.orm import Session

__all__ = ["BulkInsert", "json_text"]

_COMPACT = json.JSONEncoder(separators=(",", ":"))
_COMPACT_FINITE = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_PYFORMAT = re.compile(r"%\((\w+)\)s")


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


@dataclass(frozen=True)
class _Plan:
    """One table's insert on one dialect: the SQL in the driver's positional style,
    and how a row (by column name) becomes its parameters."""

    sql: str
    values_of: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    json_at: tuple[int, ...]
    finite_only: bool

    def parameters(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        values = self.values_of(row)
        if not self.json_at:
            return values
        out = list(values)
        for i in self.json_at:
            out[i] = json_text(out[i], finite_only=self.finite_only)
        return tuple(out)


class BulkInsert:
    """``INSERT INTO table (every column but the generated id) VALUES ...`` for many
    rows at once, each row a mapping with every one of those columns. Nothing is
    returned: no caller needs the new ids."""

    def __init__(self, table: Table) -> None:
        self.table = table
        generated = table.autoincrement_column
        self._columns = [c for c in table.columns if c is not generated]
        self._plans: dict[str, _Plan] = {}

    def execute(self, session: Session, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert ``rows`` in the session's transaction."""
        connection = session.connection()
        plan = self._plans.get(connection.dialect.name)
        if plan is None:
            plan = self._plans[connection.dialect.name] = self._plan(connection.dialect)
        parameters = [plan.parameters(row) for row in rows]
        if parameters:
            connection.exec_driver_sql(plan.sql, parameters)

    def _plan(self, dialect: Dialect) -> _Plan:
        names = [c.name for c in self._columns]
        # inline(): no RETURNING of the generated id.
        compiled = insert(self.table).inline().compile(dialect=dialect, column_keys=names)
        sql = compiled.string
        if dialect.paramstyle == "pyformat":
            order = _PYFORMAT.findall(sql)
            sql = _PYFORMAT.sub("%s", sql)
        elif dialect.positional and compiled.positiontup is not None:
            order = list(compiled.positiontup)
        else:
            raise NotImplementedError(f"bulk insert: paramstyle {dialect.paramstyle}")
        if sorted(order) != sorted(names):
            raise RuntimeError(f"bulk insert into {self.table.name}: unexpected parameters")
        json_columns = {c.name for c in self._columns if isinstance(c.type, JSON)}
        getter = operator.itemgetter(*order)
        return _Plan(
            sql=sql,
            values_of=getter if len(order) > 1 else lambda row: (getter(row),),
            json_at=tuple(i for i, name in enumerate(order) if name in json_columns),
            finite_only=dialect.name == "postgresql",
        )
