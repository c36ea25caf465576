"""Records ↔ rows, generically: a record's fields are its columns (under the names of
``schema.record_columns``), so reading or writing one never lists its fields again."""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter
from sqlalchemy import Column, Table

from collector.records import ModelPeaks, ModelRates, Recommendation, build_record
from collector.store.schema import (
    PEAK_COLUMNS,
    RATE_COLUMNS,
    RECOMMENDATION_JSON_FIELDS,
    Base,
)

__all__ = [
    "RowValues",
    "columns",
    "field_names",
    "orm_values",
    "peaks_from",
    "peaks_values",
    "rates_from",
    "rates_values",
    "recommendation_from",
    "recommendation_values",
    "record_from",
    "record_values",
]

_R = TypeVar("_R")
# A selected row by column name (``RowMapping`` keys are typed wider than ``str``).
RowValues = Mapping[Any, Any]


def columns(table: type[Base]) -> list[Column[Any]]:
    """Every column of ``table``, to select plain rows: building ORM objects first
    would triple the cost of reading a window of samples."""
    return list(cast(Table, table.__table__).columns)


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    # dataclasses.fields() is slow enough to show when reading thousands of rows.
    return tuple(f.name for f in fields(cls))


def record_from(
    cls: type[_R],
    row: RowValues,
    rename: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> _R:
    """Build dataclass ``cls`` from the values in ``row`` under its field names (or
    the column names in ``rename``), taking ``extra`` fields as given."""
    rename = rename or {}
    extra = extra or {}
    values = {
        name: extra[name] if name in extra else row[rename.get(name, name)]
        for name in field_names(cast(type, cls))
    }
    return build_record(cls, values)


def record_values(
    record: object, rename: Mapping[str, str] | None = None, skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The column values of ``record`` (a dataclass), the inverse of ``record_from``;
    a dict is copied (a frozen record may hold a caller's mapping)."""
    rename = rename or {}
    out: dict[str, Any] = {}
    for name in field_names(cast(Any, type(record))):
        if name in skip:
            continue
        value = getattr(record, name)
        out[rename.get(name, name)] = dict(value) if isinstance(value, Mapping) else value
    return out


def orm_values(obj: Base) -> dict[str, Any]:
    """An ORM object's column values, read like a selected row."""
    return {c.key: getattr(obj, c.key) for c in columns(type(obj))}


# --------------------------------------------------------------------------- rates, peaks


def rates_values(rates: ModelRates | None) -> dict[str, Any]:
    """Every rate column, ``None`` throughout when there are no rates (an executemany
    needs the same columns in every row)."""
    if rates is None:
        return {RATE_COLUMNS.get(name, name): None for name in field_names(ModelRates)}
    return record_values(rates, RATE_COLUMNS)


def rates_from(row: RowValues) -> ModelRates | None:
    """The rates of a row with rate columns; ``None`` when it has none."""
    if row["rate_window_s"] is None:
        return None
    return record_from(
        ModelRates,
        row,
        RATE_COLUMNS,
        extra={
            # float(): see ``collector.store.bulk`` on NaN in PostgreSQL's JSON.
            "fail_per_s_by_reason": {
                k: float(v) for k, v in (row["fail_per_s_by_reason"] or {}).items()
            },
            "resets": row["rate_resets"] or 0,
        },
    )


def peaks_values(peaks: ModelPeaks | None) -> dict[str, Any]:
    if peaks is None:
        return {column: None for column in PEAK_COLUMNS.values()}
    return record_values(peaks, PEAK_COLUMNS)


def peaks_from(row: RowValues) -> ModelPeaks | None:
    peaks = record_from(ModelPeaks, row, PEAK_COLUMNS)
    return None if peaks == ModelPeaks() else peaks


# --------------------------------------------------------------------------- recommendations


@functools.cache
def _json_adapter(name: str) -> TypeAdapter[Any]:
    """Converts the ``Recommendation`` field ``name`` to and from its JSON document."""
    return TypeAdapter(typing.get_type_hints(Recommendation)[name])


def recommendation_values(rec: Recommendation) -> dict[str, Any]:
    values = record_values(rec, skip=RECOMMENDATION_JSON_FIELDS)
    for name in RECOMMENDATION_JSON_FIELDS:
        values[name] = _json_adapter(name).dump_python(getattr(rec, name), mode="json")
    return values


def recommendation_from(row: RowValues) -> Recommendation:
    return record_from(
        Recommendation,
        row,
        extra={
            name: _json_adapter(name).validate_python(row[name])
            for name in RECOMMENDATION_JSON_FIELDS
        },
    )
