"""Triton targets keep the URLs the collector scrapes them at, so a command given only
a server's HTTP URL (``batchscope apply``) finds its metrics URL in the store.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("metrics_url", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("metrics_url")
        batch.drop_column("url")
