"""A recommendation as a card (model page) and as a list, detail, what-if summary and
apply progress (recommendations page)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from dash import dcc, html

from dashboard import ids
from dashboard.components.text import fmt_num, fmt_time, model_href, recs_href
from dashboard.queries import RecommendationView, StoredRecommendation, WhatIfView


def _current_vs_predicted(view: RecommendationView) -> Any:
    """The view's one current and one predicted figure: QPS and p95."""
    rows = [("current", view.current), ("predicted", view.predicted)]
    return html.Table(
        [
            html.Thead(html.Tr([html.Th(""), html.Th("QPS"), html.Th("p95")])),
            html.Tbody(
                [
                    html.Tr(
                        [
                            html.Td(label),
                            html.Td(fmt_num(p.qps if p else None, 0)),
                            html.Td(fmt_num(p.p95_ms if p else None, 1, " ms")),
                        ]
                    )
                    for label, p in rows
                ]
            ),
        ],
        className="numbers",
    )


def fmt_gain(view: RecommendationView) -> str:
    """The view's gain as "1.18× QPS"; empty when it is not known."""
    return f"{view.gain:.2f}× QPS" if view.gain is not None else ""


def _rec_meta(stored: StoredRecommendation, *extra: Any) -> Any:
    """Kind, confidence, and status with the time it was made."""
    return html.Div(
        [
            html.Span(stored.kind.replace("_", " "), className="badge badge-info"),
            html.Span(f"confidence {stored.confidence:.0%}", className="muted"),
            html.Span(
                f"{stored.status.replace('_', ' ')} · {fmt_time(stored.created_at)}",
                className="muted",
            ),
            *extra,
        ],
        className="rec-meta",
    )


def recommendation_card(view: RecommendationView | None) -> list[Any]:
    if view is None:
        return [
            html.H3("Recommendation"),
            html.P("no recommendation yet — run `batchscope recommend`", className="muted"),
        ]
    rec = view.stored.recommendation
    change_rows = [
        html.Tr([html.Td(f), html.Td(b), html.Td("→"), html.Td(a)]) for f, b, a in view.changes
    ]
    return [
        html.H3("Recommendation"),
        _rec_meta(view.stored),
        html.P(rec.reason, className="reason"),
        html.Table(html.Tbody(change_rows), className="changes")
        if change_rows
        else html.P("keep the current config", className="muted"),
        _current_vs_predicted(view),
        html.Div(
            [
                html.Span("config.pbtxt", className="muted"),
                dcc.Clipboard(
                    target_id=ids.Model.PBTXT, id=ids.Model.COPY, title="copy", className="copy"
                ),
            ],
            className="pbtxt-head",
        ),
        html.Pre(rec.config_pbtxt, id=ids.Model.PBTXT, className="code"),
    ]


def pbtxt_diff(current: str, proposed: str) -> Any:
    """The change as a unified diff of the two ``config.pbtxt`` fragments, one
    ``span`` per line (classed ``diff-add``, ``diff-del`` or ``diff-same``)."""
    lines = []
    for line in difflib.ndiff(current.splitlines(), proposed.splitlines()):
        tag, text = line[:1], line[2:]
        if tag == "?":
            continue
        cls = {"+": "diff-add", "-": "diff-del"}.get(tag, "diff-same")
        lines.append(html.Span(f"{tag if tag in '+-' else ' '} {text}\n", className=cls))
    return html.Pre(lines, className="code diff")


def recommendation_list(
    recs: Sequence[RecommendationView], selected: tuple[str, str] | None
) -> list[Any]:
    if not recs:
        return [
            html.Div(
                [
                    html.H2("No recommendations yet"),
                    html.P(
                        "batchscope recommends once a model has served enough traffic to "
                        "observe (about half a minute under load). `batchscope serve` makes "
                        "them continuously; `batchscope recommend --db URL` makes one now."
                    ),
                ],
                className="empty-state",
            )
        ]
    items = []
    for view in recs:
        r = view.stored.recommendation
        chosen = selected == (r.target, r.model)
        items.append(
            dcc.Link(
                [
                    html.Span(r.model, className="rec-model"),
                    html.Span(r.target, className="muted"),
                    html.Span(
                        r.kind.replace("_", " "),
                        className="badge " + ("badge-info" if view.changes else "badge-muted"),
                    ),
                    html.Span(fmt_gain(view), className="rec-gain"),
                    html.Span(view.stored.status.replace("_", " "), className="muted"),
                ],
                href=recs_href(r.target, r.model),
                className="rec-item rec-selected" if chosen else "rec-item",
            )
        )
    return [html.Nav(items, className="rec-items")]


def recommendation_detail(view: RecommendationView | None) -> list[Any]:
    if view is None:
        return []
    stored, rec = view.stored, view.stored.recommendation
    outcome = []
    if stored.verification:
        outcome = [
            html.P(
                [
                    html.Strong(stored.status.replace("_", " ") + ": "),
                    str(stored.verification.get("verdict", "")),
                ],
                className="verdict",
            )
        ]
    return [
        html.H2([rec.model, html.Span(f" on {rec.target}", className="muted")]),
        _rec_meta(stored, dcc.Link("model page", href=model_href(rec.target, rec.model))),
        html.P(rec.reason, className="reason"),
        *outcome,
        _current_vs_predicted(view),
        html.Div(
            [
                html.Span("config.pbtxt — current → proposed", className="muted"),
                dcc.Clipboard(
                    content=rec.config_pbtxt,
                    id=ids.Recs.APPLY + "-copy",
                    title="copy the proposed fragment",
                    className="copy",
                ),
            ],
            className="pbtxt-head",
        ),
        pbtxt_diff(view.current_pbtxt, rec.config_pbtxt),
    ]


def what_if_summary(view: WhatIfView | None, delay_us: int | None) -> list[Any]:
    """The prediction at the chosen delay and whether it meets the objective (the
    gain over today is the recommendation's, shown once, in the list)."""
    if view is None or view.error or not view.delays_us:
        return [html.P(view.error if view is not None and view.error else "", className="muted")]
    i = view.delays_us.index(delay_us) if delay_us in view.delays_us else 0
    qps, p95 = view.predicted[i].qps, view.predicted[i].p95_ms
    meets = view.objective_p95_ms is None or p95 is None or p95 <= view.objective_p95_ms
    verdict = "meets" if meets else "breaks"
    return [
        html.P(
            [
                html.Strong(
                    f"at {view.delays_us[i]} µs: {qps:.0f} QPS predicted, "
                    f"p95 {fmt_num(p95, 1, ' ms')}"
                ),
                html.Span(
                    f" — {verdict} the objective ({view.objective})",
                    className="ok" if meets else "bad",
                ),
            ],
            id=ids.Recs.WHAT_IF_SUMMARY + "-text",
        )
    ]


def apply_job_status(job: Any) -> list[Any]:
    """The progress and outcome of an Apply (``dashboard.actions.ApplyJob``)."""
    if job is None:
        return []
    head = {
        "running": "Applying …",
        "kept": "Applied and kept",
        "rolled_back": "Rolled back",
        "refused": "Refused",
        "failed": "Failed",
    }.get(job.state, job.state)
    figures = []
    if job.before_qps is not None:
        figures = [
            html.Table(
                html.Tbody(
                    [
                        html.Tr(
                            [
                                html.Td("before"),
                                html.Td(fmt_num(job.before_qps, 0, " QPS")),
                                html.Td(fmt_num(job.before_p95_ms, 1, " ms p95")),
                            ]
                        ),
                        html.Tr(
                            [
                                html.Td("after"),
                                html.Td(fmt_num(job.after_qps, 0, " QPS")),
                                html.Td(fmt_num(job.after_p95_ms, 1, " ms p95")),
                            ]
                        ),
                    ]
                ),
                className="numbers",
            )
        ]
    return [
        html.H3(head, className=f"job-{job.state}"),
        html.Ul([html.Li(m) for m in job.messages], className="job-log"),
        *([html.P(job.verdict, className="verdict")] if job.verdict else []),
        *figures,
    ]
