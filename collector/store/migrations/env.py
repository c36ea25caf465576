"""Alembic environment of batchscope's store: runs on the connection the store hands
over (``collector.store.migrate``), or on ``sqlalchemy.url`` from the command line."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from collector.store.schema import Base


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite alters a table by copying it; Alembic's batch mode does that.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set sqlalchemy.url (alembic -x is not used) to run migrations")
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()
