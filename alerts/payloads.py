"""The bodies each receiver kind is sent, built from a stored alert:

* ``webhook``: Alertmanager's webhook payload, version 4 (``notify/webhook``), one alert
  per notification, so any Alertmanager webhook receiver takes it unchanged;
* ``slack``: an incoming-webhook message, a ``text`` fallback and blocks (header,
  summary, evidence, the fix, a link), mrkdwn escaped;
* ``alertmanager``: the array ``POST /api/v2/alerts`` takes; a firing alert carries an
  ``endsAt`` a few re-send intervals ahead (as Prometheus does), so Alertmanager
  resolves it by itself should batchscope stop re-sending, and a resolved one the
  time it cleared.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from collector.store.alerts import AlertState

__all__ = [
    "ALERTMANAGER_VALID_RESENDS",
    "alertmanager_body",
    "rfc3339",
    "slack_body",
    "slack_escape",
    "webhook_body",
]

#: A firing alert posted to Alertmanager stays valid this many re-send intervals.
ALERTMANAGER_VALID_RESENDS = 4
# Alertmanager's "no end" time in webhook payloads.
_ZERO_TIME = "0001-01-01T00:00:00Z"
# Slack limits a section's text to 3000 characters.
_SLACK_TEXT_MAX = 2900


def rfc3339(at: float) -> str:
    """Unix seconds as RFC 3339 in UTC with milliseconds: ``2026-12-03T16:50:00.000Z``."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _dumps(doc: object) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _alert(alert: AlertState, status: str, ends_at: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": rfc3339(alert.active_since),
        "endsAt": ends_at,
        "generatorURL": alert.annotations.get("link", ""),
        "fingerprint": alert.fingerprint,
    }


def webhook_body(alert: AlertState, status: str, *, receiver: str, external_url: str) -> str:
    """Alertmanager's webhook payload (version 4) for one alert, ``status``
    ``firing`` or ``resolved``."""
    resolved = status == "resolved" and alert.resolved_at is not None
    ends_at = rfc3339(alert.resolved_at) if resolved and alert.resolved_at else _ZERO_TIME
    group_labels = {"alertname": alert.labels.get("alertname", alert.rule)}
    return _dumps(
        {
            "version": "4",
            "groupKey": "{}:" + "{" + f'alertname="{group_labels["alertname"]}"' + "}",
            "truncatedAlerts": 0,
            "status": status,
            "receiver": receiver,
            "groupLabels": group_labels,
            "commonLabels": dict(alert.labels),
            "commonAnnotations": dict(alert.annotations),
            "externalURL": external_url,
            "alerts": [_alert(alert, status, ends_at)],
        }
    )


def alertmanager_body(alert: AlertState, status: str, *, now: float, resend_s: float) -> str:
    """The array Alertmanager's ``POST /api/v2/alerts`` takes, for one alert."""
    if status == "resolved":
        ends_at = alert.resolved_at if alert.resolved_at is not None else now
    else:
        ends_at = now + ALERTMANAGER_VALID_RESENDS * resend_s
    doc = _alert(alert, status, rfc3339(ends_at))
    del doc["status"], doc["fingerprint"]  # Alertmanager derives both
    return _dumps([doc])


def slack_escape(text: str) -> str:
    """Slack mrkdwn's three control characters as entities (``&`` first)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:_SLACK_TEXT_MAX]}}


def slack_body(alert: AlertState, status: str) -> str:
    """A Slack incoming-webhook message: ``text`` (the fallback notifications show)
    and blocks with the summary, the evidence, the recommended change and a link."""
    notes = alert.annotations
    mark = "RESOLVED" if status == "resolved" else alert.severity.upper()
    name = alert.labels.get("alertname", alert.rule)
    summary = notes.get("summary", name)
    header = f"[{mark}] {name}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header[:150]}},
        _section(f"*{slack_escape(summary)}*"),
    ]
    if notes.get("evidence"):
        blocks.append(_section(slack_escape(notes["evidence"])))
    if notes.get("config_diff") and status != "resolved":
        fix = slack_escape(notes.get("recommendation", ""))
        diff = slack_escape(notes["config_diff"])
        blocks.append(_section(f"*Recommended change* {fix}\n```{diff}```"))
    if notes.get("link"):
        # A link's URL is escaped too: Slack reads the <url|label> form.
        blocks.append(_section(f"<{slack_escape(notes['link'])}|Open in batchscope>"))
    text = f"{header}: {slack_escape(summary)}"
    return _dumps({"text": text, "blocks": blocks})
