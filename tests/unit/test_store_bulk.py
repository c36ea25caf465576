"""The store's bulk inserts: rows as tuples in a caller's order, columns left NULL, and
the driver's errors raised as SQLAlchemy's."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    select,
)
from sqlalchemy.exc import IntegrityError

from collector.store.bulk import KeyedUpdate, TupleInsert


def _table() -> Table:
    return Table(
        "readings",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("name", String, nullable=False),
        Column("value", Float, nullable=True),
        Column("note", String, nullable=True),
        Column("unit", String, nullable=True, default="s"),
    )


def test_columns_left_out_of_a_tuple_insert_are_null(tmp_path: Path) -> None:
    table = _table()
    engine = create_engine(f"sqlite:///{tmp_path / 'bulk.db'}")
    table.metadata.create_all(engine)
    with engine.begin() as connection:
        TupleInsert(table, ("value", "name", "unit")).execute(connection, [(1.5, "a", "ms")])
        TupleInsert(table, ("unit", "name", "note", "value")).execute(
            connection, [("s", "b", "kept", None)]
        )
        rows = connection.execute(select(table).order_by(table.c.id)).all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [(1, "a", 1.5, None, "ms"), (2, "b", None, "kept", "s")]


@pytest.mark.parametrize(
    ("names", "refused"),
    [
        (("value", "note", "unit"), "name cannot be left out"),  # NOT NULL
        (("name", "value", "note"), "unit cannot be left out"),  # has a default
        (("name", "value", "note", "unit", "other"), "the values are not its columns"),
        (("name", "name", "value", "note", "unit"), "the values are not its columns"),
    ],
    ids=["not-null", "default", "unknown", "twice"],
)
def test_a_tuple_insert_refuses_columns_it_cannot_leave_out(
    tmp_path: Path, names: tuple[str, ...], refused: str
) -> None:
    table = _table()
    engine = create_engine(f"sqlite:///{tmp_path / 'bulk.db'}")
    table.metadata.create_all(engine)
    with engine.begin() as connection, pytest.raises(RuntimeError, match=refused):
        TupleInsert(table, names).execute(connection, [tuple(range(len(names)))])
    engine.dispose()


@pytest.mark.parametrize("statement", ["insert", "update"])
def test_a_driver_error_is_sqlalchemy_s_and_the_transaction_is_rolled_back(
    db_url: str, statement: str
) -> None:
    """The hot statements go to the driver's connection (``on_driver``): a refused row
    still comes up as SQLAlchemy's error, the driver's as its ``orig``, as the write
    buffer expects (a constraint is not an outage), and nothing of the transaction
    stays."""
    table = _table()
    engine = create_engine(db_url)
    table.metadata.create_all(engine)
    insert = TupleInsert(table, ("name", "value", "note", "unit"))
    with engine.begin() as connection:
        insert.execute(connection, [("kept", 1.0, None, "s")])
    with pytest.raises(IntegrityError) as caught, engine.begin() as connection:
        insert.execute(connection, [("rolled back", 2.0, None, "s")])
        if statement == "insert":
            insert.execute(connection, [(None, 3.0, None, "s")])  # name is NOT NULL
        else:
            KeyedUpdate(table, "id").execute(connection, 1, {"name": None})
    assert isinstance(caught.value.orig, engine.dialect.loaded_dbapi.IntegrityError)
    with engine.connect() as connection:
        names = connection.execute(select(table.c.name)).scalars().all()
        count = connection.execute(select(func.count()).select_from(table)).scalar_one()
    engine.dispose()
    assert (names, count) == (["kept"], 1)
