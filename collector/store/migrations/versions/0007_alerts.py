"""Alerts: their states (keyed by fingerprint, so a restart continues them), silences,
the durable notification outbox, receivers that answered 410 Gone, and the one process
that evaluates the rules.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from collector.store.migrate import REVISION_ID, REVISION_JSON

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_states",
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("severity", sa.Text(), nullable=False),
        sa.Column("active_since", sa.Float(), nullable=False),
        sa.Column("evaluated_at", sa.Float(), nullable=False),
        sa.Column("held_at", sa.Float(), nullable=False),
        sa.Column("fired_at", sa.Float(), nullable=True),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.Column("labels", REVISION_JSON, nullable=False),
        sa.Column("annotations", REVISION_JSON, nullable=False),
        sa.PrimaryKeyConstraint("fingerprint", name=op.f("pk_alert_states")),
    )
    op.create_table(
        "alert_silences",
        sa.Column("id", REVISION_ID, nullable=False),
        sa.Column("starts_at", sa.Float(), nullable=False),
        sa.Column("ends_at", sa.Float(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=True),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("subject", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_silences")),
    )
    op.create_index(op.f("ix_alert_silences_ends_at"), "alert_silences", ["ends_at"])
    op.create_table(
        "alert_notifications",
        sa.Column("id", REVISION_ID, nullable=False),
        sa.Column("webhook_id", sa.Text(), nullable=False),
        sa.Column("receiver", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("alert_status", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_notifications")),
        sa.UniqueConstraint("webhook_id", name=op.f("uq_alert_notifications_webhook_id")),
    )
    op.create_index(
        op.f("ix_alert_notifications_state_next_attempt_at"),
        "alert_notifications",
        ["state", "next_attempt_at"],
    )
    op.create_index(
        op.f("ix_alert_notifications_fingerprint_receiver_created_at"),
        "alert_notifications",
        ["fingerprint", "receiver", "created_at"],
    )
    op.create_table(
        "alert_evaluator",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_evaluator")),
    )
    op.create_table(
        "alert_receivers_gone",
        sa.Column("receiver", sa.Text(), nullable=False),
        sa.Column("gone_at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("receiver", name=op.f("pk_alert_receivers_gone")),
    )


def downgrade() -> None:
    op.drop_table("alert_receivers_gone")
    op.drop_table("alert_evaluator")
    op.drop_index(
        op.f("ix_alert_notifications_fingerprint_receiver_created_at"),
        table_name="alert_notifications",
    )
    op.drop_index(
        op.f("ix_alert_notifications_state_next_attempt_at"), table_name="alert_notifications"
    )
    op.drop_table("alert_notifications")
    op.drop_index(op.f("ix_alert_silences_ends_at"), table_name="alert_silences")
    op.drop_table("alert_silences")
    op.drop_table("alert_states")
