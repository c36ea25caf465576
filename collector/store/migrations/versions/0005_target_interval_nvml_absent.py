"""Targets keep the scrape interval of the collector that scrapes them, so a reader
can judge from *now* whether one is up (``collector.analysis.health``); host facts
say when a host has no NVML library or driver (no NVIDIA GPU to read).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("interval_s", sa.Float(), nullable=True))
    with op.batch_alter_table("host_facts") as batch:
        batch.add_column(sa.Column("nvml_absent", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("host_facts") as batch:
        batch.drop_column("nvml_absent")
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("interval_s")
