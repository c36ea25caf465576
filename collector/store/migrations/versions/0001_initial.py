"""The schema as it was before migrations existed (what ``create_all`` made), run from
the DDL it issued (``migrations/baseline.sql``) so that it cannot drift from it.

A database made then is stamped with this revision instead of running it.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op

from collector.store.migrate import baseline_statements

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Children before parents, the reverse of the order create_all made them in.
TABLES = (
    "batch_stats",
    "model_rollups",
    "model_samples",
    "model_configs",
    "device_rollups",
    "device_samples",
    "process_samples",
    "server_samples",
    "target_transitions",
    "models",
    "targets",
    "rollup_marks",
    "recommendations",
    "findings",
    "detector_streaks",
)


def upgrade() -> None:
    for statement in baseline_statements(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    for table in TABLES:
        op.drop_table(table)
