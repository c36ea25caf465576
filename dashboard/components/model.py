"""The model page: its banner, header, range links and config panel."""

from __future__ import annotations

import json
from typing import Any

from dash import dcc, html

from dashboard.components.text import banner, fmt_time, model_href
from dashboard.queries import RANGES, ModelDetail, StoredModelConfig


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
