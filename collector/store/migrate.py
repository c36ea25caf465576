"""Schema migrations (Alembic), run by the store itself on first use.

The revisions live in ``collector/store/migrations/versions``; revision ``0001`` is the
schema as it was before migrations existed. A database opened by a newer batchscope is
upgraded in place:

* an empty database gets every revision;
* a database with the tables but no ``alembic_version`` (made before migrations) is
  marked as ``0001`` and upgraded from there;
* any other is upgraded from the revision it records.

No ``alembic.ini`` is needed; ``alembic_config`` builds the configuration for the
Alembic command line as well (``env.py`` falls back to ``sqlalchemy.url``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, inspect

__all__ = [
    "BASELINE_REVISION",
    "MIGRATIONS_DIR",
    "REVISION_ID",
    "REVISION_JSON",
    "alembic_config",
    "baseline_statements",
    "holds_store_schema",
    "upgrade_to_head",
]

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
#: The revision that creates the schema as it was before migrations.
BASELINE_REVISION = "0001"
#: The DDL ``create_all`` ran before migrations, with the id types left open.
BASELINE_DDL = MIGRATIONS_DIR / "baseline.sql"
# Column types as the revisions use them, frozen: later changes to ``schema.py`` must
# not change what an existing revision does.
#: Ids and references to them (SQLite auto-increments only an INTEGER primary key).
REVISION_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
#: JSON documents, a Python ``None`` stored as SQL NULL.
REVISION_JSON = sa.JSON(none_as_null=True)
# The integer types create_all gave ids and the references to them, per dialect.
_ID_TYPES = {"sqlite": ("INTEGER", "INTEGER"), "postgresql": ("BIGSERIAL", "BIGINT")}
# Alembic's commands install module-wide proxies (``alembic.context``, ``alembic.op``):
# two stores of one process upgrading at once would run in each other's context.
_ALEMBIC_LOCK = threading.Lock()


def baseline_statements(dialect: str) -> list[str]:
    """The statements that made the schema before migrations on ``dialect`` ("sqlite"
    or "postgresql"), in the order ``create_all`` ran them."""
    id_type, ref_type = _ID_TYPES[dialect]
    lines = [line for line in BASELINE_DDL.read_text().splitlines() if not line.startswith("--")]
    ddl = "\n".join(lines).replace("{id}", id_type).replace("{ref}", ref_type)
    return [statement.strip() for statement in ddl.split(";") if statement.strip()]


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """Alembic's configuration for the store: the package's migrations, run on
    ``connection`` (in its transaction) or on a new connection to ``url``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_to_head(connection: Connection) -> None:
    """Bring the schema behind ``connection`` to the latest revision, inside the
    connection's transaction."""
    config = alembic_config(connection)
    tables = set(inspect(connection).get_table_names())
    with _ALEMBIC_LOCK:
        if "alembic_version" not in tables and "targets" in tables:
            command.stamp(config, BASELINE_REVISION)
        command.upgrade(config, "head")


def holds_store_schema(connection: Connection) -> bool:
    """Whether the database behind ``connection`` holds batchscope's schema, of any
    revision (those made before migrations included): its ``targets`` table, which
    every revision has, is there."""
    return "targets" in inspect(connection).get_table_names()
