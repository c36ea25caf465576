"""The latest ``HostFacts`` of each target (the CPU count of the machine it runs on).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from collector.store.migrate import REVISION_ID

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_facts",
        sa.Column("target_id", REVISION_ID, nullable=False),
        sa.Column("collected_at", sa.Float(), nullable=False),
        sa.Column("cpu_count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_host_facts_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("target_id", name=op.f("pk_host_facts")),
    )


def downgrade() -> None:
    op.drop_table("host_facts")
