"""Store outages: each time the collector could not write to the store, how long,
and how many writes it held in memory, wrote later and dropped over its bound.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from collector.store.migrate import REVISION_ID

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "store_outages",
        sa.Column("id", REVISION_ID, nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.Column("held", sa.BigInteger(), nullable=False),
        sa.Column("written", sa.BigInteger(), nullable=False),
        sa.Column("dropped", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_outages")),
    )
    op.create_index(op.f("ix_store_outages_ended_at"), "store_outages", ["ended_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_store_outages_ended_at"), table_name="store_outages")
    op.drop_table("store_outages")
