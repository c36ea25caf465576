"""The overview page: its messages, summary cards, target and device tiles, and the
filterable, sortable models table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dash import dcc, html

from collector.analysis.health import HealthState
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
    """The banner's alerts: a store error, no collector running, each target down."""
    messages = []
    if data.error:
        messages.append(data.error)
    if data.stale:
        messages.append(
            "nothing has been collected lately (last reading "
            f"{fmt_ago(data.last_sample_at, data.generated_at)}): the figures below are not "
            "live — is `batchscope collect` running?"
        )
    for tile in data.targets:
        if tile.now is not HealthState.DOWN:
            continue
        t = tile.state
        why = t.last_error if t.up is False and t.last_error else None
        if why is None and tile.health is not None and t.up is not False:
            why = tile.health.reason
        reason = f": {why}" if why else ""
        messages.append(
            f"target {t.name} is down{reason} "
            f"({t.consecutive_failures} failed scrape(s) in a row, last seen "
            f"{fmt_ago(t.last_seen_at, data.generated_at)})"
        )
    return messages


NO_GPU_TEXT = "no NVIDIA GPU on this host"


def host_notes(data: OverviewData) -> list[Any]:
    """One quiet line for the hosts without NVIDIA GPU (no NVML library or driver):
    a fact about the host, not an alert."""
    hosts = [t.state.name for t in data.targets if t.facts is not None and t.facts.nvml_absent]
    if not hosts:
        return []
    text = NO_GPU_TEXT if len(hosts) == 1 else "no NVIDIA GPU on these hosts"
    return [
        html.Div(
            f"{text} ({', '.join(hosts)}): GPU tiles and GPU panels stay empty; models, "
            "CPU and processes are shown",
            className="note note-no-gpu",
        )
    ]


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
    up = sum(1 for t in data.targets if t.now is HealthState.UP)
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
    state = str(tile.now)
    if t.kind == "triton":
        detail = f"{tile.models} model(s)"
    else:
        detail = "no NVIDIA GPU" if tile.facts is not None and tile.facts.nvml_absent else ""
    return html.Div(
        [
            html.Div(t.name, className="tile-title"),
            html.Div(f"{t.kind} · {state}", className="tile-detail"),
            html.Div(detail, className="tile-detail"),
        ],
        className=f"tile tile-target tile-{state}",
        title=tile.health.reason if tile.health is not None else "",
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
    """A ``ModelRates`` figure of the row, ``None`` without rates or when the row is not
    live (its target is not up, or the series is stale): no figure is shown as live."""
    rates = row.status.rates if row.status.up else None
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


def _p95_ms(r: ModelRow) -> float | None:
    p95 = r.status.request_p95_us if r.status.up else None
    return p95 / 1000.0 if p95 is not None else None


def _target_cell(r: ModelRow) -> Any:
    if r.status.up:
        return html.Td(r.status.target)
    return html.Td([r.status.target, html.Span(r.status.state, className="row-state")])


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
                "p95 ms",
                "busy share",
                "pending",
                "findings",
            )
        ]
    )
    body = [
        html.Tr(
            [
                _target_cell(r),
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
                html.Td(fmt_num(_p95_ms(r), 1), className="num"),
                html.Td(fmt_share(_rate(r, "busy_share")), className="num"),
                html.Td(
                    fmt_num(r.status.pending_request_count if r.status.up else None, 1),
                    className="num",
                ),
                html.Td(html.Div(finding_badges(r.findings), className="badges")),
            ],
            className="" if r.status.up else f"row-not-live row-{r.status.state}",
        )
        for r in rows
    ]
    if not body:
        body = [html.Tr(html.Td("no model matches", colSpan=9, className="muted"))]
    return html.Table([html.Thead(header), html.Tbody(body)], className="models")
