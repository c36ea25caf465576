"""Model rollups hold ``ModelRates`` under the same columns as model samples.

``rated_s`` (the seconds the rated scrapes covered) becomes ``rate_window_s``, NULL
for a bucket without rated scrapes (``rated_count`` 0), which said the same;
``fail_per_s_by_reason`` and ``rate_resets`` are new. A rollup made before kept no
failure reasons: its failures are filed under Triton's catch-all reason ``OTHER``, so
the reasons still add up to ``fail_per_s``.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from collector.store.migrate import REVISION_JSON

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_rollups = sa.table(
    "model_rollups",
    sa.column("id", sa.BigInteger()),
    sa.column("rated_count", sa.Integer()),
    sa.column("rated_s", sa.Float()),
    sa.column("fail_per_s", sa.Float()),
    sa.column("rate_window_s", sa.Float()),
    sa.column("fail_per_s_by_reason", REVISION_JSON),
    sa.column("rate_resets", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("model_rollups") as batch:
        batch.add_column(sa.Column("rate_window_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("fail_per_s_by_reason", REVISION_JSON, nullable=True))
        batch.add_column(sa.Column("rate_resets", sa.Integer(), nullable=True))
    connection = op.get_bind()
    rated = connection.execute(
        sa.select(_rollups.c.id, _rollups.c.rated_s, _rollups.c.fail_per_s).where(
            _rollups.c.rated_count > 0
        )
    ).all()
    for row in rated:
        reasons = {"OTHER": row.fail_per_s} if row.fail_per_s else {}
        connection.execute(
            _rollups.update()
            .where(_rollups.c.id == row.id)
            .values(rate_window_s=row.rated_s, fail_per_s_by_reason=reasons, rate_resets=0)
        )
    with op.batch_alter_table("model_rollups") as batch:
        batch.drop_column("rated_count")
        batch.drop_column("rated_s")


def downgrade() -> None:
    with op.batch_alter_table("model_rollups") as batch:
        batch.add_column(sa.Column("rated_count", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("rated_s", sa.Float(), nullable=False, server_default="0"))
    op.execute(
        "UPDATE model_rollups SET rated_s = rate_window_s, rated_count = 1 "
        "WHERE rate_window_s IS NOT NULL"
    )
    with op.batch_alter_table("model_rollups") as batch:
        batch.drop_column("rate_window_s")
        batch.drop_column("fail_per_s_by_reason")
        batch.drop_column("rate_resets")
