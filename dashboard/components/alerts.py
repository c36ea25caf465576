"""The alerts page's panels: alert states (with the silence holding each back), the
silences in force (with an end button for an admin), and the notification outbox per
receiver with its dead and gone notifications and their last error.

Only what the store holds about delivery is shown: receiver names, counts, status
codes and errors. Receiver URLs and webhook secrets live in the settings, which the
dashboard is never given; notification bodies are left out by the query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dash import dcc, html

from dashboard.components.text import fmt_ago, fmt_time, model_href, silence_href
from dashboard.ids import Alerts
from dashboard.queries import AlertRow, AlertsView, Notification, ReceiverOutbox, Silence
from dashboard.theme import severity_class

__all__ = ["alerts_summary", "alerts_table", "outbox_panel", "silence_matcher", "silences_table"]


def _table(head: Sequence[str], rows: list[Any], class_name: str) -> Any:
    return html.Table(
        [html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(rows)],
        className=f"models {class_name}",
    )


def alerts_summary(view: AlertsView) -> Any:
    """One line: how many alerts fire, are pending and are silenced."""
    open_rows = [r for r in view.alerts if r.alert.state != "resolved"]
    pending = sum(1 for r in open_rows if r.alert.state == "pending")
    silenced = sum(1 for r in open_rows if r.silenced_by is not None)
    return html.P(
        f"{view.firing} firing · {pending} pending · {silenced} silenced · "
        f"{len(view.silences)} silences in force",
        className="muted",
    )


def silence_matcher(s: Silence) -> str:
    """What a silence matches, e.g. ``rule queue_saturation · target * · model m``."""
    return " · ".join(
        f"{name} {value or '*'}"
        for name, value in (("rule", s.rule), ("target", s.target), ("model", s.subject))
    )


def _subject(row: AlertRow) -> Any:
    a = row.alert
    if not a.subject:
        return "—"
    if a.labels.get("model") == a.subject:
        return dcc.Link(a.subject, href=model_href(a.target, a.subject), className="model-link")
    return a.subject  # a device


def _since(row: AlertRow, now: float) -> str:
    a = row.alert
    if a.state == "resolved":
        return f"resolved {fmt_ago(a.resolved_at, now)}"
    if a.state == "firing":
        return f"since {fmt_time(a.fired_at)}"
    return f"holding since {fmt_time(a.active_since)}"


def _alert_details(row: AlertRow) -> list[Any]:
    notes = row.alert.annotations
    parts: list[Any] = [html.Span(notes.get("summary", ""))]
    more = [(k, notes[k]) for k in ("evidence", "recommendation") if notes.get(k)]
    if more or notes.get("config_diff"):
        inner: list[Any] = [
            html.Dl([i for k, v in more for i in (html.Dt(k), html.Dd(v))], className="facts")
        ]
        if notes.get("config_diff"):
            inner.append(html.Pre(notes["config_diff"], className="code"))
        parts.append(html.Details([html.Summary("details"), *inner]))
    return parts


def _silenced(row: AlertRow, can_silence: bool) -> Any:
    if row.silenced_by is not None:
        s = row.silenced_by
        return f"silenced by #{s.id} until {fmt_time(s.ends_at)}"
    a = row.alert
    if can_silence and a.state != "resolved":
        href = silence_href(a.rule, a.target, a.subject or None)
        return dcc.Link("silence…", href=href, className="silence-link")
    return "—"


def alerts_table(rows: Sequence[AlertRow], now: float, *, can_silence: bool = False) -> list[Any]:
    """Every alert: state, severity, rule, target, model or device, since when, the
    silence holding it back (or, for an admin, a link that fills in the silence form
    for it), and its summary."""
    if not rows:
        return [html.H3("Alerts"), html.P("no alerts", className="muted empty-alerts")]
    body = []
    for row in rows:
        a = row.alert
        body.append(
            html.Tr(
                [
                    html.Td(html.Span(a.state, className=f"badge alert-{a.state}")),
                    html.Td(html.Span(a.severity, className=severity_class(a.severity))),
                    html.Td(a.rule, className="alert-rule"),
                    html.Td(a.target),
                    html.Td(_subject(row)),
                    html.Td(_since(row, now), className="muted"),
                    html.Td(_silenced(row, can_silence), className="alert-silenced"),
                    html.Td(_alert_details(row)),
                ],
                className=f"alert-row alert-row-{a.state}",
            )
        )
    head = ("state", "severity", "rule", "target", "model / device", "when", "silenced", "summary")
    return [html.H3("Alerts"), _table(head, body, "alerts")]


def silences_table(silences: Sequence[Silence], *, can_end: bool) -> list[Any]:
    """The silences in force; each with an end button when ``can_end`` (an admin)."""
    if not silences:
        return [html.H3("Silences"), html.P("no silence in force", className="muted")]
    body = []
    for s in silences:
        end: Any = (
            html.Button(
                "end", id={"type": Alerts.END, "index": s.id}, className="button button-small"
            )
            if can_end
            else ""
        )
        body.append(
            html.Tr(
                [
                    html.Td(f"#{s.id}"),
                    html.Td(silence_matcher(s)),
                    html.Td(fmt_time(s.ends_at)),
                    html.Td(s.created_by or "—", className="muted"),
                    html.Td(s.comment),
                    html.Td(end),
                ],
                className="silence-row",
            )
        )
    head = ("", "matches", "until", "by", "comment", "")
    return [html.H3("Silences"), _table(head, body, "silences")]


def _outbox_row(r: ReceiverOutbox) -> Any:
    gone = html.Span(f"gone: {r.gone_reason}", className="bad") if r.gone_reason else ""
    return html.Tr(
        [
            html.Td(r.receiver),
            *(html.Td(str(n), className="num") for n in (r.pending, r.delivered, r.dead, r.gone)),
            html.Td(gone),
        ],
        className="outbox-row",
    )


def _failed_item(n: Notification) -> Any:
    status = f"HTTP {n.last_status}" if n.last_status is not None else "no answer"
    return html.Li(
        [
            html.Span(n.state, className="badge badge-critical"),
            html.Span(f" {n.receiver} · {n.alert_status} · {n.attempts} tries · {status} · "),
            html.Span(fmt_time(n.finished_at), className="muted"),
            html.Div(n.last_error or "", className="failed-error"),
            html.Div(n.webhook_id, className="muted"),
        ],
        className="failed-notification",
    )


def outbox_panel(outbox: Sequence[ReceiverOutbox], failed: Sequence[Notification]) -> list[Any]:
    """Notifications per receiver by delivery state, then the latest dead and gone
    ones with their last error."""
    if not outbox:
        return [html.H3("Outbox"), html.P("no notification yet", className="muted")]
    head = ("receiver", "pending", "delivered", "dead", "gone", "")
    parts = [html.H3("Outbox"), _table(head, [_outbox_row(r) for r in outbox], "outbox")]
    if failed:
        parts += [
            html.H4("Not delivered"),
            html.Ul([_failed_item(n) for n in failed], className="findings failed"),
        ]
    return parts
