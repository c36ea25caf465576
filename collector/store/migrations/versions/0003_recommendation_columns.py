"""Recommendations: each field of the recommendation stored once, ``kind`` and
``status`` in columns of their own.

Before, the whole recommendation sat in ``change`` and again in its own columns, and
``status`` held the kind ("tune", "probe", "no_change"; "proposed" by default) until an
apply overwrote it with the outcome ("applied" when the change was kept after
verification, "rolled_back"). Now ``kind`` is the recommendation's kind and
``status`` is "open" until an outcome ("applied", "kept", "rolled_back", "failed").
A row whose ``change`` never held a whole recommendation (written by hand) keeps what
it had; the configs it lacks read as unknown (``max_batch_size`` 0, no change).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from collector.store.migrate import REVISION_JSON

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

KINDS = ("tune", "probe", "no_change")
# The old status an outcome was written as -> the status it is now.
OUTCOMES = {"applied": "kept", "rolled_back": "rolled_back", "failed": "failed"}
WHOLE = ("kind", "changes", "current_config", "proposed_config", "current", "predicted")
NEW_TEXT = ("kind", "reason", "config_pbtxt", "config_json")
NEW_JSON = ("changes", "current_config", "proposed_config", "current", "evidence")

_recommendations = sa.table(
    "recommendations",
    sa.column("id", sa.BigInteger()),
    sa.column("status", sa.Text()),
    sa.column("change", REVISION_JSON),
    sa.column("predicted", REVISION_JSON),
    sa.column("config_fragment", sa.Text()),
    sa.column("slo_p95_ms", sa.Float()),
    *(sa.column(name, sa.Text()) for name in NEW_TEXT),
    *(sa.column(name, REVISION_JSON) for name in NEW_JSON),
)


def new_values(
    status: str, change: dict[str, Any], predicted: dict[str, Any], config_fragment: str
) -> dict[str, Any]:
    """The new columns of one old row."""
    whole = all(key in change for key in WHOLE)
    unknown_config = {"max_batch_size": 0}
    return {
        "kind": change["kind"] if whole else (status if status in KINDS else "tune"),
        "status": OUTCOMES.get(status, "open"),
        "changes": change["changes"] if whole else [],
        "current_config": change["current_config"] if whole else unknown_config,
        "proposed_config": change["proposed_config"] if whole else unknown_config,
        "current": change["current"] if whole else {"qps": 0.0, "p95_ms": None},
        "predicted": change["predicted"]
        if whole
        else {"qps": float(predicted.get("qps") or 0.0), "p95_ms": predicted.get("p95_ms")},
        "reason": str(change.get("reason", "")),
        "slo_p95_ms": change.get("slo_p95_ms"),
        "config_pbtxt": config_fragment,
        "config_json": str(change.get("config_json", "{}")),
        "evidence": dict(change.get("evidence") or {}),
    }


def upgrade() -> None:
    with op.batch_alter_table("recommendations") as batch:
        for name in NEW_TEXT:
            batch.add_column(sa.Column(name, sa.Text(), nullable=True))
        for name in NEW_JSON:
            batch.add_column(sa.Column(name, REVISION_JSON, nullable=True))
        batch.add_column(sa.Column("slo_p95_ms", sa.Float(), nullable=True))
    connection = op.get_bind()
    t = _recommendations.c
    rows = connection.execute(
        sa.select(t.id, t.status, t.change, t.predicted, t.config_fragment)
    ).all()
    for row in rows:
        values = new_values(
            row.status, dict(row.change or {}), dict(row.predicted or {}), row.config_fragment
        )
        connection.execute(_recommendations.update().where(t.id == row.id).values(**values))
    with op.batch_alter_table("recommendations") as batch:
        for name in NEW_TEXT:
            batch.alter_column(name, existing_type=sa.Text(), nullable=False)
        for name in NEW_JSON:
            batch.alter_column(name, existing_type=REVISION_JSON, nullable=False)
        batch.drop_column("change")
        batch.drop_column("config_fragment")


def downgrade() -> None:
    with op.batch_alter_table("recommendations") as batch:
        batch.add_column(sa.Column("change", REVISION_JSON, nullable=True))
        batch.add_column(sa.Column("config_fragment", sa.Text(), nullable=True))
    connection = op.get_bind()
    t = _recommendations.c
    for row in connection.execute(sa.text("SELECT * FROM recommendations")).mappings().all():
        doc = {
            name: row[name]
            for name in (
                *NEW_TEXT,
                *NEW_JSON,
                "predicted",
                "slo_p95_ms",
                "target",
                "model",
                "created_at",
                "confidence",
            )
        }
        old_status = {"kept": "applied", "open": row["kind"]}.get(row["status"], row["status"])
        connection.execute(
            _recommendations.update()
            .where(t.id == row["id"])
            .values(
                change=doc,
                config_fragment=row["config_pbtxt"],
                status=old_status,
                predicted={"qps": row["predicted"]["qps"], "p95_ms": row["predicted"]["p95_ms"]},
            )
        )
    with op.batch_alter_table("recommendations") as batch:
        batch.alter_column("change", existing_type=REVISION_JSON, nullable=False)
        batch.alter_column("config_fragment", existing_type=sa.Text(), nullable=False)
        for name in (*NEW_TEXT, *NEW_JSON, "slo_p95_ms"):
            batch.drop_column(name)
