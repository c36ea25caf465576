"""Batch stats become one compact JSON column of ``model_samples`` instead of a table
of their own: about sixteen rows per model sample were most of the store's rows and
bytes, and of a scrape's write.

``model_samples.batch_stats`` holds ``[[batch_size, compute_input count, ns,
compute_infer count, ns, compute_output count, ns], ...]`` (``schema.BATCH_STAT_LAYOUT``)
in the order the rows were written; NULL for a sample without a statistics entry,
``[]`` for one whose entry had no batch stats. The rows of ``batch_stats`` are copied
in, in SQL, then the table is dropped.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from collector.store.migrate import REVISION_ID, REVISION_JSON

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# One entry as text, in the column's layout (the table's exec_count is the
# compute_infer count).
_ENTRY_COLUMNS = (
    "b.batch_size",
    "b.compute_input_count",
    "b.compute_input_ns",
    "b.exec_count",
    "b.compute_infer_ns",
    "b.compute_output_count",
    "b.compute_output_ns",
)
_ENTRY = "'[' || " + " || ',' || ".join(_ENTRY_COLUMNS) + " || ']'"

# A sample has a statistics entry when its statistics counters are set.
# SQLite's group_concat follows the ordered subquery's row order in practice (and the
# migration test checks rows inserted out of order); its documentation leaves the order
# unspecified until 3.44 added group_concat(... ORDER BY ...), newer than many hosts have.
_COPY = {
    "sqlite": f"""
        UPDATE model_samples SET batch_stats = COALESCE((
            SELECT '[' || group_concat(entry, ',') || ']'
            FROM (SELECT {_ENTRY} AS entry FROM batch_stats b
                  WHERE b.model_sample_id = model_samples.id ORDER BY b.id)
        ), '[]')
        WHERE stats_inference_count IS NOT NULL
    """,
    "postgresql": f"""
        UPDATE model_samples SET batch_stats = COALESCE((
            SELECT '[' || string_agg({_ENTRY}, ',' ORDER BY b.id) || ']'
            FROM batch_stats b WHERE b.model_sample_id = model_samples.id
        ), '[]')::json
        WHERE stats_inference_count IS NOT NULL
    """,
}

# Downgrade: the entries back as rows, in their order.
_UNCOPY = {
    "sqlite": """
        INSERT INTO batch_stats (model_sample_id, batch_size, compute_input_count,
            compute_input_ns, exec_count, compute_infer_ns, compute_output_count,
            compute_output_ns)
        SELECT m.id, json_extract(e.value, '$[0]'), json_extract(e.value, '$[1]'),
            json_extract(e.value, '$[2]'), json_extract(e.value, '$[3]'),
            json_extract(e.value, '$[4]'), json_extract(e.value, '$[5]'),
            json_extract(e.value, '$[6]')
        FROM model_samples m, json_each(m.batch_stats) e
        WHERE m.batch_stats IS NOT NULL
        ORDER BY m.id, e.key
    """,
    "postgresql": """
        INSERT INTO batch_stats (model_sample_id, batch_size, compute_input_count,
            compute_input_ns, exec_count, compute_infer_ns, compute_output_count,
            compute_output_ns)
        SELECT m.id, (e.value ->> 0)::int, (e.value ->> 1)::bigint,
            (e.value ->> 2)::bigint, (e.value ->> 3)::bigint, (e.value ->> 4)::bigint,
            (e.value ->> 5)::bigint, (e.value ->> 6)::bigint
        FROM model_samples m,
            json_array_elements(m.batch_stats) WITH ORDINALITY AS e(value, n)
        WHERE m.batch_stats IS NOT NULL
        ORDER BY m.id, e.n
    """,
}


def upgrade() -> None:
    op.add_column("model_samples", sa.Column("batch_stats", REVISION_JSON, nullable=True))
    op.execute(_COPY[op.get_bind().dialect.name])
    op.drop_index(op.f("ix_batch_stats_model_sample_id"), table_name="batch_stats")
    op.drop_table("batch_stats")


def downgrade() -> None:
    op.create_table(
        "batch_stats",
        sa.Column("id", REVISION_ID, nullable=False),
        sa.Column("model_sample_id", REVISION_ID, nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("exec_count", sa.BigInteger(), nullable=False),
        sa.Column("compute_input_count", sa.BigInteger(), nullable=False),
        sa.Column("compute_input_ns", sa.BigInteger(), nullable=False),
        sa.Column("compute_infer_ns", sa.BigInteger(), nullable=False),
        sa.Column("compute_output_count", sa.BigInteger(), nullable=False),
        sa.Column("compute_output_ns", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_sample_id"],
            ["model_samples.id"],
            name=op.f("fk_batch_stats_model_sample_id_model_samples"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_stats")),
    )
    op.create_index(op.f("ix_batch_stats_model_sample_id"), "batch_stats", ["model_sample_id"])
    op.execute(_UNCOPY[op.get_bind().dialect.name])
    # Not Alembic's batch mode: on SQLite it would copy and drop ``model_samples``, and
    # dropping it with foreign keys on deletes the rows just copied back (CASCADE).
    # SQLite drops a column of its own since 3.35.
    op.execute("ALTER TABLE model_samples DROP COLUMN batch_stats")
