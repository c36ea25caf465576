"""Pure figure builders: the query module's answers in, a ``go.Figure`` out.

No function here reads the store, the clock or any global: the same input always
draws the same figure, so each is tested on small inputs without a browser. A
missing input draws ``empty_figure`` with a sentence saying why, never a blank
plot. Names that come from Triton never go into figure text (Plotly renders a
subset of HTML in titles and labels); where a label is needed it goes through
``plain``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import plotly.graph_objects as go

from dashboard.queries import (
    BatchDistribution,
    HeatRow,
    ModelSeries,
    ServiceTimeView,
    WhatIfView,
)
from dashboard.theme import palette, plotly_template

__all__ = [
    "BatchLevel",
    "batch_levels",
    "batch_size_figure",
    "distribution_figure",
    "empty_figure",
    "failures_figure",
    "heatmap_figure",
    "rows_figure",
    "latency_figure",
    "pending_figure",
    "plain",
    "qps_figure",
    "service_time_figure",
    "what_if_figure",
    "with_legend_room",
]

_HEIGHT = 280
_NO_SAMPLES = "no samples in this range"


def plain(text: str) -> str:
    """``text`` escaped for Plotly's text rendering (which understands some tags)."""
    return html.escape(text, quote=False)


def _base(title: str, theme: str, *, y_title: str, x_time: bool = True) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        template=plotly_template(theme),
        title={"text": title},
        height=_HEIGHT,
        yaxis={"title": {"text": y_title}, "rangemode": "tozero"},
        hovermode="x unified" if x_time else "closest",
    )
    if x_time:
        fig.update_xaxes(type="date", title={"text": "time (UTC)"})
    return fig


# The top margin of a figure with a legend: the title's row, then the legend's.
_LEGEND_TOP_MARGIN = 84


def with_legend_room(fig: go.Figure) -> go.Figure:
    """``fig`` with a top margin that holds the title and, below it, the legend when
    Plotly shows one (two or more traces), so the two never overlap."""
    shown = [t for t in fig.data if t.showlegend is not False]
    if len(shown) > 1 or any(t.showlegend for t in fig.data):
        fig.update_layout(margin={"t": _LEGEND_TOP_MARGIN})
    return fig


def empty_figure(message: str, theme: str, *, title: str = "") -> go.Figure:
    """A figure that says why there is nothing to draw: no axes, one centred line."""
    fig = go.Figure()
    fig.update_layout(
        template=plotly_template(theme),
        title={"text": title},
        height=_HEIGHT,
        xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[
            {
                "text": plain(message),
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"size": 14, "color": palette(theme).muted},
            }
        ],
    )
    return fig


def _times(t: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(v, tz=UTC) for v in t]


@dataclass(frozen=True)
class _Trace:
    """One line of a time figure: its legend name, colour and hover value
    (a Plotly format such as ``"%{y:.1f} req/s"``)."""

    name: str
    colour: str
    hover: str


def _line_figure(
    series: ModelSeries,
    theme: str,
    title: str,
    y_title: str,
    values: Sequence[float | None],
    trace: _Trace,
    *,
    empty_message: str = _NO_SAMPLES,
    require_values: bool = False,
) -> go.Figure:
    """``values`` over the series' times as one line; ``empty_figure`` with
    ``empty_message`` when the series is empty (or, with ``require_values``, when
    no value is known)."""
    if series.empty or (require_values and not any(v is not None for v in values)):
        return empty_figure(empty_message, theme, title=title)
    fig = _base(title, theme, y_title=y_title)
    fig.add_trace(
        go.Scatter(
            x=_times(series.t),
            y=list(values),
            name=trace.name,
            mode="lines",
            line={"color": trace.colour, "width": 2},
            hovertemplate=trace.hover + "<extra></extra>",
        )
    )
    return fig


def qps_figure(series: ModelSeries, theme: str) -> go.Figure:
    trace = _Trace("QPS", palette(theme).series[0], "%{y:.1f} req/s")
    return _line_figure(
        series, theme, "Requests per second", "requests/s", series.requests_per_s, trace
    )


def batch_size_figure(
    series: ModelSeries,
    theme: str,
    *,
    preferred: Sequence[int] = (),
    max_batch_size: int | None = None,
) -> go.Figure:
    """Average executed batch size, with the preferred sizes (dashed) and the
    maximum (dotted) as the levels it is measured against."""
    p = palette(theme)
    trace = _Trace("average batch", p.series[1], "%{y:.2f}")
    fig = _line_figure(
        series,
        theme,
        "Average batch size",
        "inferences per execution",
        series.avg_batch_size,
        trace,
        require_values=True,
    )
    if not fig.data:  # drawn empty: nothing to measure against
        return fig
    for i, level in enumerate(batch_levels(preferred, max_batch_size)):
        fig.add_hline(
            y=level.y,
            line={"color": p.muted, "dash": level.dash, "width": 1},
            # Neighbouring levels label on alternate sides, so close ones never collide.
            annotation_position="top right" if i % 2 == 0 else "top left",
            annotation={"text": level.text, "font": {"color": p.muted}},
        )
    return fig


@dataclass(frozen=True)
class BatchLevel:
    """A level the average batch size is measured against: one line and one label,
    even where a preferred size is also the maximum ("preferred 32 · max 32")."""

    y: int
    dash: str
    text: str


def batch_levels(preferred: Sequence[int], max_batch_size: int | None) -> list[BatchLevel]:
    """The preferred sizes (dashed) and the max batch size (dotted), lowest first; a
    preferred size equal to the maximum shares its line and label."""
    sizes = sorted(set(preferred))
    levels = [
        BatchLevel(size, "dash", f"preferred {size}")
        for size in sizes
        if not max_batch_size or size != max_batch_size
    ]
    if max_batch_size:
        text = f"max {max_batch_size}"
        if max_batch_size in sizes:
            text = f"preferred {max_batch_size} · {text}"
        levels.append(BatchLevel(max_batch_size, "dot", text))
    return sorted(levels, key=lambda level: level.y)


def latency_figure(series: ModelSeries, theme: str) -> go.Figure:
    """Queue and compute time per request, stacked: the share of a request spent
    waiting is the top band."""
    title = "Time per request: queue vs compute"
    if series.empty:
        return empty_figure(_NO_SAMPLES, theme, title=title)
    p = palette(theme)
    fig = _base(title, theme, y_title="ms per request")
    x = _times(series.t)
    # Compute first: the band stacked on top of it is the time spent waiting.
    bands = (("compute", series.compute_ms, p.compute), ("queue", series.queue_ms, p.queue))
    for name, values, colour in bands:
        fig.add_trace(
            go.Scatter(
                x=x,
                y=list(values),
                name=name,
                mode="lines",
                stackgroup="time",
                line={"color": colour, "width": 1},
                hovertemplate=name + " %{y:.2f} ms<extra></extra>",
            )
        )
    return with_legend_room(fig)


def pending_figure(series: ModelSeries, theme: str) -> go.Figure:
    trace = _Trace("pending", palette(theme).series[3], "%{y:.1f} waiting")
    return _line_figure(
        series,
        theme,
        "Pending requests",
        "requests waiting",
        series.pending_request_count,
        trace,
        empty_message="Triton reports no pending-request gauge for this model",
        require_values=True,
    )


def failures_figure(series: ModelSeries, theme: str) -> go.Figure:
    trace = _Trace("failures", palette(theme).failure, "%{y:.2f} fail/s")
    return _line_figure(
        series, theme, "Failed requests per second", "failures/s", series.fail_per_s, trace
    )


def distribution_figure(
    distribution: BatchDistribution, theme: str, *, preferred: Sequence[int] = ()
) -> go.Figure:
    """Share of executions per executed batch size; preferred sizes highlighted."""
    title = "Executed batch sizes"
    if distribution.empty:
        return empty_figure(
            "no batch statistics in this range (the statistics API "
            "reports them per executed batch size)",
            theme,
            title=title,
        )
    p = palette(theme)
    total = sum(distribution.executions) or 1
    shares = [n / total for n in distribution.executions]
    wanted = set(preferred)
    colours = [p.series[2] if s in wanted else p.series[0] for s in distribution.sizes]
    fig = _base(title, theme, y_title="share of executions", x_time=False)
    fig.add_trace(
        go.Bar(
            x=list(distribution.sizes),
            y=shares,
            marker={"color": colours},
            name="executions",
            customdata=list(zip(distribution.executions, distribution.mean_ms, strict=True)),
            hovertemplate=(
                "batch %{x}: %{y:.1%} of executions<br>%{customdata[0]} executions, "
                "%{customdata[1]:.2f} ms each<extra></extra>"
            ),
        )
    )
    fig.update_xaxes(title={"text": "batch size"}, type="category")
    fig.update_yaxes(tickformat=".0%")
    return fig


def service_time_figure(view: ServiceTimeView | None, theme: str) -> go.Figure:
    """Mean execution time per batch size (markers sized by executions) and the fitted
    line ``intercept + per_sample × b`` up to the model's max batch size."""
    title = "Service time per batch size"
    if view is None or not view.sizes:
        return empty_figure("no batch statistics to fit", theme, title=title)
    p = palette(theme)
    fig = _base(title, theme, y_title="ms per execution", x_time=False)
    largest = max(view.executions) or 1
    fig.add_trace(
        go.Scatter(
            x=list(view.sizes),
            y=list(view.mean_ms),
            mode="markers",
            name="observed",
            marker={
                "color": p.series[0],
                "size": [8 + 16 * (n / largest) ** 0.5 for n in view.executions],
            },
            customdata=list(view.executions),
            hovertemplate="batch %{x}: %{y:.2f} ms (%{customdata} executions)<extra></extra>",
        )
    )
    if view.per_sample_ms is not None:
        end = max(view.max_batch_size or 0, max(view.sizes))
        xs = [1, end] if end > 1 else [1, 2]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[view.intercept_ms + view.per_sample_ms * b for b in xs],
                mode="lines",
                name=f"fit: {view.intercept_ms:.2f} ms + {view.per_sample_ms:.3f} ms × b",
                line={"color": p.fit, "dash": "dash", "width": 1.5},
                hoverinfo="skip",
            )
        )
    else:
        fig.add_annotation(
            text="one batch size seen: the slope is not known yet",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.95,
            showarrow=False,
            font={"color": p.muted},
        )
    end = (
        max(view.max_batch_size or 0, max(view.sizes))
        if view.per_sample_ms is not None
        else max(view.sizes)
    )
    fig.update_xaxes(
        title={"text": "batch size"},
        range=[0, end + 1],
        tick0=0,
        dtick=max(1, math.ceil((end + 1) / 8)),
    )
    return with_legend_room(fig)


def what_if_figure(
    view: WhatIfView | None,
    theme: str,
    *,
    chosen_delay_us: int | None = None,
    current_qps: float | None = None,
) -> go.Figure:
    """Predicted QPS (bars, left axis) and p95 (line, right axis) over the max queue
    delays, the objective as a dashed line on the p95 axis, the chosen delay marked
    and ``current_qps`` (the page's one current figure) as a dotted line."""
    if view is None or view.error or not view.delays_us:
        message = view.error if view is not None and view.error else "no model chosen"
        return empty_figure(message, theme, title="What if")
    p = palette(theme)
    labels = [f"{d} µs" for d in view.delays_us]
    fig = go.Figure()
    fig.update_layout(
        template=plotly_template(theme),
        height=_HEIGHT + 60,
        hovermode="x unified",
        title={
            "text": f"Predicted at the observed load · {view.instances} instance(s), "
            f"preferred {', '.join(map(str, view.preferred)) or 'none'}"
        },
        xaxis={"title": {"text": "max_queue_delay_microseconds"}, "type": "category"},
        yaxis={"title": {"text": "QPS"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "p95 (ms)"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
    )
    colours = [p.series[0] if d != chosen_delay_us else p.series[2] for d in view.delays_us]
    fig.add_trace(
        go.Bar(
            x=labels,
            y=[p.qps for p in view.predicted],
            name="predicted QPS",
            marker={"color": colours},
            hovertemplate="%{y:.0f} QPS<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=[p.p95_ms for p in view.predicted],
            name="predicted p95",
            yaxis="y2",
            mode="lines+markers",
            line={"color": p.queue, "width": 3},
            hovertemplate="p95 %{y:.1f} ms<extra></extra>",
        )
    )
    if view.objective_p95_ms is not None:
        fig.add_trace(
            go.Scatter(
                x=[labels[0], labels[-1]],
                y=[view.objective_p95_ms] * 2,
                yaxis="y2",
                name=f"objective ({plain(view.objective)})",
                mode="lines",
                line={"color": p.failure, "dash": "dash", "width": 2},
                hoverinfo="skip",
            )
        )
    if current_qps is not None:
        fig.add_trace(
            go.Scatter(
                x=[labels[0], labels[-1]],
                y=[current_qps] * 2,
                name="QPS now",
                mode="lines",
                hoverinfo="skip",
                line={"color": p.muted, "dash": "dot", "width": 2},
            )
        )
    return with_legend_room(fig)


def heatmap_figure(
    rows: Sequence[HeatRow],
    t: Sequence[float],
    theme: str,
    *,
    title: str,
    unit: str = "%",
    zmax: float | None = 100.0,
) -> go.Figure:
    """Utilisation over time, one row per device or process (labels as plain text)."""
    if not rows:
        return empty_figure("no readings in this range", theme, title=title)
    fig = go.Figure(
        go.Heatmap(
            x=_times(t),
            y=[plain(r.label) for r in rows],
            z=[r.values for r in rows],
            zmin=0,
            zmax=zmax,
            colorscale="Viridis",
            colorbar={"title": {"text": unit}},
            hovertemplate="%{y}<br>%{x}<br>%{z:.1f} " + unit + "<extra></extra>",
        )
    )
    fig.update_layout(
        template=plotly_template(theme),
        title={"text": title},
        height=max(_HEIGHT, 80 + 28 * len(rows)),
    )
    fig.update_xaxes(type="date")
    fig.update_yaxes(automargin=True)  # row labels are long; never cut them off
    return fig


def rows_figure(
    rows: Sequence[HeatRow], t: Sequence[float], theme: str, *, title: str, y_title: str
) -> go.Figure:
    """One line per row over time (memory, power)."""
    if not rows:
        return empty_figure("no readings in this range", theme, title=title)
    fig = _base(title, theme, y_title=y_title)
    colours = palette(theme).series
    for i, r in enumerate(rows):
        fig.add_trace(
            go.Scatter(
                x=_times(t),
                y=r.values,
                name=plain(r.label),
                mode="lines",
                line={"color": colours[i % len(colours)], "width": 2},
                connectgaps=False,
            )
        )
    return with_legend_room(fig)
