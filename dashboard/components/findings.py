"""Findings as lists: a model's on its page, and the filtered events of the findings
page, each with its evidence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dash import dcc, html

from dashboard.components.text import (
    evidence_facts,
    findings_href,
    fmt_ago,
    fmt_time,
    model_href,
    silence_href,
)
from dashboard.queries import MODEL_FINDINGS_SHOWN, StoredFinding, is_open
from dashboard.theme import severity_class


def findings_list(
    findings: Sequence[StoredFinding], now: float, *, target: str, model: str
) -> list[Any]:
    """The model's findings; at ``MODEL_FINDINGS_SHOWN`` of them, a link to the
    findings page, which lists them all."""
    if not findings:
        return [
            html.H3("Findings"),
            html.P("no findings for this model in this range", className="muted"),
        ]
    items = []
    for f in findings:
        state = "open" if is_open(f) else f"resolved {fmt_ago(f.resolved_at, now)}"
        items.append(
            html.Li(
                [
                    html.Span(f.severity, className=severity_class(f.severity)),
                    html.Span(f.kind.replace("_", " "), className="finding-kind"),
                    html.Span(f"{state} · since {fmt_time(f.window_start)}", className="muted"),
                    html.P(f.summary),
                    html.Details([html.Summary("evidence"), evidence_facts(f.evidence)]),
                ],
                className="finding",
            )
        )
    more = []
    if len(findings) >= MODEL_FINDINGS_SHOWN:
        more = [
            html.P(
                [
                    f"The first {len(findings)} shown; ",
                    dcc.Link("all on the findings page", href=findings_href(target, model)),
                ],
                className="muted findings-more",
            )
        ]
    return [html.H3("Findings"), html.Ul(items, className="findings"), *more]


def events_list(events: Sequence[StoredFinding], *, can_silence: bool = False) -> list[Any]:
    """Findings (and later other events), each with its evidence and model link; an
    open one with a link to silence its alerts when ``can_silence`` (an admin)."""
    if not events:
        return [html.P("nothing matches these filters", className="muted empty-events")]
    rows = []
    for e in events:
        state = "open" if is_open(e) else f"resolved {fmt_time(e.resolved_at)}"
        rows.append(
            html.Li(
                [
                    html.Div(
                        [
                            html.Span(e.severity, className=severity_class(e.severity)),
                            html.Span(e.kind.replace("_", " "), className="finding-kind"),
                            dcc.Link(
                                e.subject,
                                href=model_href(e.target, e.subject),
                                className="model-link",
                            ),
                            html.Span(e.target, className="muted"),
                            html.Span(
                                f"{state} · {fmt_time(e.window_start)} – {fmt_time(e.window_end)}",
                                className="muted",
                            ),
                            *(
                                [
                                    dcc.Link(
                                        "silence its alerts",
                                        href=silence_href(e.kind, e.target, e.subject),
                                        className="silence-link",
                                    )
                                ]
                                if can_silence and is_open(e)
                                else []
                            ),
                        ],
                        className="event-head",
                    ),
                    html.P(e.summary),
                    html.Details([html.Summary("evidence"), evidence_facts(e.evidence)]),
                ],
                className="finding event",
            )
        )
    return [html.Ul(rows, className="findings events")]
