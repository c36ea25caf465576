"""The alerts page's read: alert states with the silence that holds each back, the
silences in force, and the notification outbox per receiver with its latest dead and
gone notifications. Whether a silence holds an alert back is ``Silence.matches``, the
test the alert engine applies before it notifies."""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from alerts.rules import RULE_NAMES
from collector.store import Store
from collector.store.alerts import AlertState, Notification, Silence
from dashboard.queries.views import AlertRow, AlertsView, ReceiverOutbox, severity_rank

__all__ = ["FAILED_SHOWN", "RESOLVED_SHOWN", "read_alerts"]

#: At most this many resolved alerts are listed (newest first), after every open one.
RESOLVED_SHOWN: Final = 100
#: At most this many dead and this many gone notifications are listed, newest first.
FAILED_SHOWN: Final = 20

_STATE_ORDER: Final = {"firing": 0, "pending": 1, "resolved": 2}


def _since(alert: AlertState) -> float:
    """When the alert entered its current state."""
    if alert.state == "resolved" and alert.resolved_at is not None:
        return alert.resolved_at
    return alert.fired_at if alert.fired_at is not None else alert.active_since


def _alert_rows(states: list[AlertState], silences: list[Silence], now: float) -> list[AlertRow]:
    ordered = sorted(
        states,
        key=lambda a: (_STATE_ORDER.get(a.state, 3), severity_rank(a.severity), -_since(a)),
    )
    open_ = [a for a in ordered if a.state != "resolved"]
    resolved = [a for a in ordered if a.state == "resolved"][:RESOLVED_SHOWN]
    return [
        AlertRow(alert=a, silenced_by=next((s for s in silences if s.matches(a, now)), None))
        for a in [*open_, *resolved]
    ]


def _outbox(counts: dict[tuple[str, str], int], gone: dict[str, str]) -> list[ReceiverOutbox]:
    receivers = sorted({r for r, _ in counts} | set(gone))
    return [
        ReceiverOutbox(
            receiver=r,
            pending=counts.get((r, "pending"), 0),
            delivered=counts.get((r, "delivered"), 0),
            dead=counts.get((r, "dead"), 0),
            gone=counts.get((r, "gone"), 0),
            gone_reason=gone.get(r),
        )
        for r in receivers
    ]


def _failed(store: Store) -> list[Notification]:
    failed = [
        replace(n, body="")
        for state in ("dead", "gone")
        for n in store.notifications(state=state, limit=FAILED_SHOWN)
    ]
    return sorted(failed, key=lambda n: (-(n.finished_at or n.created_at), -n.id))


def read_alerts(store: Store, now: float) -> AlertsView:
    """Everything the alerts page shows, judged at ``now``."""
    states = store.alert_states()
    silences = store.silences(active_at=now)
    subjects = {a.subject for a in states if a.subject}
    subjects |= {model for _, model in store.latest_model_configs()}
    return AlertsView(
        generated_at=now,
        alerts=_alert_rows(states, silences, now),
        silences=silences,
        outbox=_outbox(store.notification_counts(), store.receivers_gone()),
        failed=_failed(store),
        rules=list(RULE_NAMES),
        targets=sorted({t.name for t in store.targets()} | {a.target for a in states}),
        subjects=sorted(subjects),
    )
