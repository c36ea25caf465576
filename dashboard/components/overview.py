"""The overview page: its messages, summary cards, target and device tiles, and the
filterable, sortable models table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dash import dcc, html

from dashboard.components.text import (
    finding_badges,
    fmt_ago,
    fmt_num,
    fmt_share,
    model_href,
)
from dashboard.queries import DeviceTile, ModelRow, OverviewData, StoredFinding, TargetTile
from dashboard.theme import utilisation_colour

EMPTY_TEXT = "no targets yet — run `batchscope collect --triton URL`"


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
