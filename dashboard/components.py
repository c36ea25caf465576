"""Pure component builders: the query module's answers in, Dash components out.

Every name that comes from Triton (model, target, label, error text) is passed as a
component's *children* string, which Dash renders as text; nothing here builds HTML
from strings, and nothing uses ``dangerously_allow_html``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from dash import dcc, html

from collector.records import Recommendation
from dashboard import ids
from dashboard.queries import (
    DEFAULT_RANGE,
    RANGES,
    DeviceTile,
    ModelDetail,
    ModelRow,
    OverviewData,
    RecommendationView,
    StoredFinding,
    StoredModelConfig,
    StoredRecommendation,
    TargetTile,
    WhatIfView,
    is_open,
)
from dashboard.theme import severity_class, utilisation_colour

__all__ = [
    "SORT_KEYS",
    "banner",
    "config_panel",
    "device_tile",
    "empty_state",
    "events_list",
    "filter_rows",
    "finding_badges",
    "findings_list",
    "fmt_ago",
    "fmt_num",
    "fmt_share",
    "fmt_time",
    "model_banner",
    "model_header",
    "model_href",
    "models_table",
    "overview_summary",
    "range_links",
    "apply_job_status",
    "pbtxt_diff",
    "recommendation_card",
    "recommendation_detail",
    "recommendation_list",
    "recs_href",
    "what_if_summary",
    "sort_rows",
    "target_tile",
    "tiles",
]

EMPTY_TEXT = "no targets yet — run `batchscope collect --triton URL`"


# --------------------------------------------------------------------------- formatting


def fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}{unit}"


def fmt_share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def fmt_time(at: float | None) -> str:
    if at is None:
        return "—"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    seconds = max(now - at, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def model_href(target: str, model: str, range_name: str = DEFAULT_RANGE) -> str:
    return "/model?" + urlencode({"target": target, "model": model, "range": range_name})


# --------------------------------------------------------------------------- shared


def banner(messages: Sequence[str]) -> list[Any]:
    """An alert line per message; nothing when there is none."""
    return [html.Div(m, className="banner", role="alert") for m in messages]


def finding_badges(findings: Sequence[StoredFinding]) -> list[Any]:
    return [
        html.Span(f.kind.replace("_", " "), className=severity_class(f.severity), title=f.summary)
        for f in findings
    ]


# --------------------------------------------------------------------------- overview


def overview_messages(data: OverviewData) -> list[str]:
    messages = []
    if data.error:
        messages.append(data.error)
    for t in data.down_targets:
        reason = f": {t.last_error}" if t.last_error else ""
        messages.append(
            f"target {t.name} is down{reason} "
            f"({t.consecutive_failures} failed scrape(s) in a row, last seen "
            f"{fmt_ago(t.last_seen_at, data.generated_at)})"
        )
    return messages


def empty_state(data: OverviewData) -> list[Any]:
    """The first-run message, or a note that nothing is recent; nothing otherwise."""
    if data.error:
        return []
    if data.empty:
        return [
            html.Div(
                [
                    html.H2(EMPTY_TEXT),
                    html.P(
                        "Point the collector at a Triton server's HTTP endpoint (port 8000); "
                        "models appear here after its second scrape. Try the bundled CPU "
                        "testbed: `batchscope testbed up`, then collect from the URL it prints."
                    ),
                ],
                className="empty-state",
            )
        ]
    if not data.models and not any(t.state.kind == "triton" for t in data.targets):
        return [
            html.Div(
                "no Triton target is collected here, only GPUs and hosts — add one with "
                "`--triton URL` to see its models",
                className="empty-state",
            )
        ]
    if not data.models:
        return [
            html.Div(
                f"no model samples in the last {data.window_s:.0f} s — the newest reading is from "
                f"{fmt_ago(data.last_sample_at, data.generated_at)}; is the collector running?",
                className="empty-state",
            )
        ]
    return []


def overview_summary(data: OverviewData) -> list[Any]:
    cards = []
    if data.idle_gpus is not None:
        cards.append(
            _stat(
                f"{data.idle_gpus:.1f}",
                "GPUs idle",
                f"over {sum(d.weight for d in data.devices):.1f} GPUs read",
            )
        )
    if data.instances_idle is not None:
        cards.append(
            _stat(
                f"{data.instances_idle:.1f}", "model instances idle", f"of {data.instances_total}"
            )
        )
    up = sum(1 for t in data.targets if t.state.up)
    cards.append(_stat(f"{up}/{len(data.targets)}", "targets up", ""))
    cards.append(_stat(str(len(data.models)), "models", f"window {data.window_s:.0f} s"))
    return cards


def _stat(value: str, label: str, detail: str) -> Any:
    return html.Div(
        [
            html.Div(value, className="stat-value"),
            html.Div(label, className="stat-label"),
            html.Div(detail, className="stat-detail"),
        ],
        className="stat",
    )


def target_tile(tile: TargetTile) -> Any:
    t = tile.state
    state = "up" if t.up else "down" if t.up is False else "unknown"
    return html.Div(
        [
            html.Div(t.name, className="tile-title"),
            html.Div(f"{t.kind} · {state}", className="tile-detail"),
            html.Div(
                f"{tile.models} model(s)" if t.kind == "triton" else "", className="tile-detail"
            ),
        ],
        className=f"tile tile-target tile-{state}",
    )


def device_tile(
    tile: DeviceTile, findings: Sequence[StoredFinding] = (), mig_children: int = 0
) -> Any:
    d = tile.sample
    label = d.name or d.uuid
    if d.kind == "mig" and " MIG " in label:
        label = "MIG " + label.split(" MIG ", 1)[1]  # the profile says what it is
    value = fmt_num(tile.utilisation_pct, 0, " %")
    if mig_children and tile.utilisation_pct is None:
        # NVML has no utilisation for a GPU in MIG mode; its instances carry it.
        value = f"{mig_children} MIG"
    memory = ""
    if d.memory_used_bytes is not None and d.memory_total_bytes:
        memory = f"{d.memory_used_bytes / 2**30:.1f} / {d.memory_total_bytes / 2**30:.1f} GiB"
    return html.Div(
        [
            html.Div(label, className="tile-title"),
            html.Div(value, className="tile-value"),
            html.Div(
                f"{d.kind.upper()} · {tile.target}" + (" · unhealthy" if not d.healthy else ""),
                className="tile-detail",
            ),
            html.Div(memory, className="tile-detail"),
            html.Div(finding_badges(findings), className="badges"),
        ],
        className="tile tile-device",
        style={
            "borderColor": utilisation_colour(tile.utilisation_pct),
            "boxShadow": f"inset 0 -6px 0 {utilisation_colour(tile.utilisation_pct)}",
        },
        title=f"{d.uuid} ({tile.metric or 'no utilisation reading'}, {d.source})",
    )


def tiles(data: OverviewData) -> list[Any]:
    by_uuid: dict[str, list[StoredFinding]] = {}
    for f in data.device_findings:
        by_uuid.setdefault(f.subject, []).append(f)
    out = [target_tile(t) for t in data.targets]
    children: dict[str, int] = {}
    for d in data.devices:
        if d.sample.kind == "mig" and d.sample.parent_uuid:
            children[d.sample.parent_uuid] = children.get(d.sample.parent_uuid, 0) + 1
    out += [
        device_tile(d, by_uuid.get(d.sample.uuid, []), children.get(d.sample.uuid, 0))
        for d in data.devices
    ]
    return out


SORT_KEYS = {
    "name": "name",
    "requests_per_s": "QPS (highest first)",
    "queue_share": "queue share (highest first)",
    "busy_share": "busy share (lowest first)",
    "findings": "findings (most first)",
}


def filter_rows(rows: Sequence[ModelRow], text: str | None) -> list[ModelRow]:
    """Rows whose target or model contains ``text`` (case-insensitive)."""
    needle = (text or "").strip().lower()
    if not needle:
        return list(rows)
    return [
        r for r in rows if needle in r.status.model.lower() or needle in r.status.target.lower()
    ]


def _rate(row: ModelRow, name: str) -> float | None:
    """A ``ModelRates`` figure of the row, ``None`` without rates."""
    rates = row.status.rates
    value: float | None = getattr(rates, name) if rates is not None else None
    return value


def sort_rows(rows: Sequence[ModelRow], key: str | None) -> list[ModelRow]:
    """Rows in the order of a ``SORT_KEYS`` key: a ``ModelRates`` figure (rows without
    it last), the number of findings, or else target, model and version."""
    if key in ("requests_per_s", "queue_share", "busy_share"):
        sign = 1.0 if key == "busy_share" else -1.0  # idle first; busiest first
        return sorted(rows, key=lambda r: (_rate(r, key) is None, sign * (_rate(r, key) or 0.0)))
    if key == "findings":
        return sorted(rows, key=lambda r: (-len(r.findings), r.status.target, r.status.model))
    return sorted(rows, key=lambda r: (r.status.target, r.status.model, r.status.version))


def _batch_cell(r: ModelRow) -> Any:
    avg = fmt_num(_rate(r, "avg_batch_size"), 1)
    config = r.status.config
    if config is None:
        against = ""
    elif not config.dynamic_batching:
        against = "batching off"
    elif config.preferred_batch_sizes:
        against = "preferred " + ", ".join(str(s) for s in config.preferred_batch_sizes)
    elif config.max_batch_size:
        against = f"max {config.max_batch_size}"
    else:
        against = ""
    return html.Td([html.Span(avg, className="num"), html.Span(against, className="against")])


def models_table(rows: Sequence[ModelRow]) -> Any:
    header = html.Tr(
        [
            html.Th(h)
            for h in (
                "target",
                "model",
                "QPS",
                "avg batch",
                "queue share",
                "busy share",
                "pending",
                "findings",
            )
        ]
    )
    body = [
        html.Tr(
            [
                html.Td(r.status.target),
                html.Td(
                    dcc.Link(
                        r.status.model,
                        href=model_href(r.status.target, r.status.model),
                        className="model-link",
                    )
                ),
                html.Td(fmt_num(_rate(r, "requests_per_s"), 1), className="num"),
                _batch_cell(r),
                html.Td(fmt_share(_rate(r, "queue_share")), className="num"),
                html.Td(fmt_share(_rate(r, "busy_share")), className="num"),
                html.Td(fmt_num(r.status.pending_request_count, 1), className="num"),
                html.Td(html.Div(finding_badges(r.findings), className="badges")),
            ],
            className="row-down" if not r.status.up else "",
        )
        for r in rows
    ]
    if not body:
        body = [html.Tr(html.Td("no model matches", colSpan=8, className="muted"))]
    return html.Table([html.Thead(header), html.Tbody(body)], className="models")


# --------------------------------------------------------------------------- model page


def model_messages(detail: ModelDetail | None) -> list[str]:
    if detail is None:
        return []
    messages = []
    if detail.error:
        messages.append(detail.error)
    elif detail.up is False:
        messages.append(
            f"target {detail.target} is down: the numbers below stop at its last successful scrape"
        )
    if detail.series.truncated_to_s:
        messages.append(
            f"no rollups in this range yet: showing the last "
            f"{detail.series.truncated_to_s / 3600:.0f} h of raw samples"
        )
    return messages


def model_banner(detail: ModelDetail | None) -> list[Any]:
    return banner(model_messages(detail))


def model_header(detail: ModelDetail | None, target: str | None, model: str | None) -> list[Any]:
    if not target or not model:
        return [
            html.H2("no model chosen"),
            html.P(["Pick one on the ", dcc.Link("overview", href="/"), "."]),
        ]
    parts: list[Any] = [
        html.H2(model, className="model-name"),
        html.Div(f"on {target}", className="muted"),
    ]
    if detail is not None and not detail.error and not detail.known:
        parts.append(
            html.P(
                f"the store has nothing for this model on this target in the "
                f"last {detail.range_name}",
                className="muted",
            )
        )
    return parts


def range_links(target: str | None, model: str | None, current: str) -> list[Any]:
    if not target or not model:
        return []
    return [
        dcc.Link(
            name,
            href=model_href(target, model, name),
            className="range-link range-current" if name == current else "range-link",
        )
        for name in RANGES
    ]


def _pretty_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True)
    except ValueError:
        return text


def config_panel(stored: StoredModelConfig | None) -> list[Any]:
    if stored is None:
        return [html.H3("Config"), html.P("no config stored for this model", className="muted")]
    config = stored.config
    facts = [
        ("max_batch_size", str(config.max_batch_size)),
        ("dynamic_batching", "on" if config.dynamic_batching else "off"),
        ("preferred_batch_size", ", ".join(map(str, config.preferred_batch_sizes)) or "—"),
        ("max_queue_delay", f"{config.max_queue_delay_us} µs"),
        ("instances", f"{config.instance_count} × {config.instance_kind}"),
        ("backend", config.backend or config.platform or "—"),
        ("seen since", fmt_time(stored.collected_at)),
    ]
    return [
        html.H3("Config"),
        html.Dl([item for k, v in facts for item in (html.Dt(k), html.Dd(v))], className="facts"),
        html.Details(
            [
                html.Summary("effective config (JSON)"),
                html.Pre(_pretty_json(config.raw_json), className="code"),
            ]
        ),
    ]


def _evidence(evidence: dict[str, Any]) -> Any:
    def show(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    return html.Dl(
        [item for k, v in sorted(evidence.items()) for item in (html.Dt(str(k)), html.Dd(show(v)))],
        className="facts evidence",
    )


def findings_list(findings: Sequence[StoredFinding], now: float) -> list[Any]:
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
                    html.Details([html.Summary("evidence"), _evidence(f.evidence)]),
                ],
                className="finding",
            )
        )
    return [html.H3("Findings"), html.Ul(items, className="findings")]


def _current_vs_predicted(rec: Recommendation) -> Any:
    return html.Table(
        [
            html.Thead(html.Tr([html.Th(""), html.Th("QPS"), html.Th("p95")])),
            html.Tbody(
                [
                    html.Tr(
                        [
                            html.Td(label),
                            html.Td(fmt_num(p.qps, 0)),
                            html.Td(fmt_num(p.p95_ms, 1, " ms")),
                        ]
                    )
                    for label, p in (("current", rec.current), ("predicted", rec.predicted))
                ]
            ),
        ],
        className="numbers",
    )


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
        _current_vs_predicted(rec),
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


# --------------------------------------------------------------------------- recommendations


def recs_href(target: str, model: str) -> str:
    return "/recommendations?" + urlencode({"target": target, "model": model})


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
        gain = (
            f"{r.predicted.qps / r.current.qps:.2f}× QPS"
            if r.predicted.qps and r.current.qps
            else ""
        )
        items.append(
            dcc.Link(
                [
                    html.Span(r.model, className="rec-model"),
                    html.Span(r.target, className="muted"),
                    html.Span(
                        r.kind.replace("_", " "),
                        className="badge " + ("badge-info" if view.changes else "badge-muted"),
                    ),
                    html.Span(gain, className="rec-gain"),
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
        _current_vs_predicted(rec),
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
    if view is None or view.error or not view.delays_us:
        return [html.P(view.error if view is not None and view.error else "", className="muted")]
    i = view.delays_us.index(delay_us) if delay_us in view.delays_us else 0
    qps, p95 = view.predicted[i].qps, view.predicted[i].p95_ms
    meets = view.objective_p95_ms is None or p95 is None or p95 <= view.objective_p95_ms
    verdict = "meets" if meets else "breaks"
    gain = f" ({qps / view.current.qps:.2f}× today)" if view.current and view.current.qps else ""
    return [
        html.P(
            [
                html.Strong(
                    f"{view.delays_us[i]} µs: {qps:.0f} QPS{gain}, p95 {fmt_num(p95, 1, ' ms')}"
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


# --------------------------------------------------------------------------- events


def events_list(events: Sequence[StoredFinding]) -> list[Any]:
    """Findings (and later other events), each with its evidence and model link."""
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
                        ],
                        className="event-head",
                    ),
                    html.P(e.summary),
                    html.Details([html.Summary("evidence"), _evidence(e.evidence)]),
                ],
                className="finding event",
            )
        )
    return [html.Ul(rows, className="findings events")]
