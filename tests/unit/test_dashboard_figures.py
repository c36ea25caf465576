"""The dashboard's pure builders on small inputs: figures (traces, reference lines,
themes, explicit empty states) and the components that render Triton names as text."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from dash import dcc, html

from collector.analysis.status import ModelStatus
from collector.records import BatcherConfig, ModelRates, Prediction
from collector.store import StoredFinding, TargetState
from dashboard import components, figures
from dashboard.queries import (
    BatchDistribution,
    ModelRow,
    ModelSeries,
    OverviewData,
    ServiceTimeView,
    TargetTile,
)
from dashboard.theme import DARK, LIGHT, palette, utilisation_colour

T0 = 1_700_000_000.0
HOSTILE = "<img src=x onerror=alert(1)>"


def series(**overrides: object) -> ModelSeries:
    values: dict[str, object] = dict(
        bucket_s=5.0,
        source="raw",
        t=[T0, T0 + 5, T0 + 10, T0 + 15],
        requests_per_s=[100.0, 110.0, None, 90.0],
        avg_batch_size=[6.0, 6.5, None, 5.0],
        queue_ms=[5.0, 6.0, None, 4.0],
        compute_ms=[15.0, 15.5, None, 14.0],
        pending_request_count=[3.0, 2.0, None, 1.0],
        fail_per_s=[0.0, 0.5, None, 0.0],
    )
    values.update(overrides)
    return ModelSeries(**values)  # type: ignore[arg-type]


def empty_series() -> ModelSeries:
    return ModelSeries(bucket_s=0.0, source="none")


def annotation_texts(fig) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.text for a in fig.layout.annotations]


def assert_empty(fig, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert len(fig.data) == 0
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False
    assert any(needle in t for t in annotation_texts(fig))


# --------------------------------------------------------------------------- figures


def test_qps_figure_draws_the_series_with_gaps_and_utc_times() -> None:
    fig = figures.qps_figure(series(), DARK)
    (trace,) = fig.data
    assert list(trace.y) == [100.0, 110.0, None, 90.0]  # the gap stays a gap
    assert trace.x[0] == datetime.fromtimestamp(T0, tz=UTC)
    assert fig.layout.title.text == "Requests per second"
    assert fig.layout.xaxis.type == "date"


def test_every_time_series_figure_has_an_explicit_empty_state() -> None:
    for build in (
        figures.qps_figure,
        figures.latency_figure,
        figures.failures_figure,
        figures.pending_figure,
    ):
        assert_empty(build(empty_series(), DARK), "")
    assert_empty(figures.batch_size_figure(empty_series(), DARK), "no samples in this range")
    assert_empty(
        figures.pending_figure(series(pending_request_count=[None] * 4), DARK),
        "no pending-request gauge",
    )


def test_batch_size_figure_marks_preferred_sizes_and_the_maximum() -> None:
    fig = figures.batch_size_figure(series(), LIGHT, preferred=[16, 8, 8], max_batch_size=32)
    assert len(fig.data) == 1
    lines = sorted((s.y0, s.line.dash) for s in fig.layout.shapes)
    assert lines == [(8, "dash"), (16, "dash"), (32, "dot")]
    assert {"preferred 8", "preferred 16", "max 32"} <= set(annotation_texts(fig))


def test_a_preferred_size_equal_to_the_maximum_shares_its_line_and_label() -> None:
    """What Triton fills in when batching is enabled without preferred sizes:
    ``preferred_batch_size: [32]`` with ``max_batch_size: 32``. One dotted line and
    one label, never "preferred 32" drawn over "max 32"."""
    fig = figures.batch_size_figure(series(), LIGHT, preferred=[32], max_batch_size=32)
    assert [(s.y0, s.line.dash) for s in fig.layout.shapes] == [(32, "dot")]
    assert annotation_texts(fig) == ["preferred 32 · max 32"]
    # Neighbouring levels label on alternate sides.
    fig = figures.batch_size_figure(series(), LIGHT, preferred=[16, 30], max_batch_size=32)
    sides = [a.xanchor for a in fig.layout.annotations]
    assert annotation_texts(fig) == ["preferred 16", "preferred 30", "max 32"]
    assert sides[0] != sides[1] != sides[2]
    assert figures.batch_levels([8], None) == [figures.BatchLevel(8, "dash", "preferred 8")]


def test_a_figure_with_a_legend_keeps_its_title_in_a_row_of_its_own() -> None:
    one = figures.qps_figure(series(), DARK)
    two = figures.latency_figure(series(), DARK)
    assert two.layout.margin.t is not None and two.layout.margin.t >= 80
    assert one.layout.margin.t is None  # no legend: the template's margin
    template = two.layout.template.layout
    assert template.title.yref == "container" and template.title.yanchor == "top"
    assert template.legend.y >= 1 and template.legend.yanchor == "bottom"


def test_evidence_reads_as_figures_with_units() -> None:
    from collector.evidence import evidence_items, evidence_text

    items = dict(
        evidence_items(
            {
                "queue_us_per_request": 12345,
                "queue_share": 0.9,
                "requests_per_s": 180.04,
                "max_queue_delay_us": 2000,
                "queue_p95_us": 12345.0,
                "saturated": True,
                "reasons": "pending_growing,at_delay_limit",
                "new_thing_ms": 3.25,
                "concurrency": 15.3,
            }
        )
    )
    assert items == {
        "queue time per request": "12.3 ms",
        "time spent queued": "90%",
        "requests": "180 req/s",
        "max queue delay": "2,000 µs",
        "queue p95": "12.3 ms",
        "saturated": "yes",
        "because": "pending growing,at delay limit",
        "new thing": "3.25 ms",
        "concurrency": "15.3",
    }
    assert evidence_text({"queue_p95_us": 12345}) == "queue p95 12.3 ms"
    dl = components.evidence_facts({"queue_us_per_request": 12345.0, "avg_batch_size": 1.0})
    texts = [c.children for c in walk(dl) if isinstance(c, html.Dt | html.Dd)]
    assert texts == ["average batch size", "1", "queue time per request", "12.3 ms"]


def test_latency_figure_stacks_compute_under_queue() -> None:
    fig = figures.latency_figure(series(), DARK)
    assert [t.name for t in fig.data] == ["compute", "queue"]
    assert {t.stackgroup for t in fig.data} == {"time"}
    assert list(fig.data[1].y) == [5.0, 6.0, None, 4.0]
    assert fig.data[1].line.color == palette(DARK).queue


def test_failures_and_pending_figures() -> None:
    assert list(figures.failures_figure(series(), DARK).data[0].y) == [0.0, 0.5, None, 0.0]
    assert figures.failures_figure(series(), DARK).data[0].line.color == palette(DARK).failure
    assert list(figures.pending_figure(series(), DARK).data[0].y) == [3.0, 2.0, None, 1.0]


def test_distribution_figure_shows_shares_and_highlights_preferred_sizes() -> None:
    d = BatchDistribution(sizes=[1, 4, 8], executions=[10, 30, 60], mean_ms=[4.5, 6.0, 8.0])
    fig = figures.distribution_figure(d, DARK, preferred=[8])
    (bar,) = fig.data
    assert list(bar.x) == [1, 4, 8]
    assert list(bar.y) == pytest.approx([0.1, 0.3, 0.6])
    colours = list(bar.marker.color)
    assert colours[2] != colours[0] == colours[1]
    assert_empty(figures.distribution_figure(BatchDistribution(), DARK), "no batch statistics")


def test_service_time_figure_draws_points_and_the_fitted_line() -> None:
    view = ServiceTimeView(
        sizes=[4, 8],
        mean_ms=[6.0, 8.0],
        executions=[100, 400],
        intercept_ms=4.0,
        per_sample_ms=0.5,
        max_batch_size=32,
    )
    fig = figures.service_time_figure(view, DARK)
    points, line = fig.data
    assert list(points.x) == [4, 8] and list(points.y) == [6.0, 8.0]
    assert points.marker.size[1] > points.marker.size[0]  # more executions, bigger marker
    assert list(line.x) == [1, 32] and list(line.y) == pytest.approx([4.5, 20.0])
    one = ServiceTimeView(
        sizes=[1],
        mean_ms=[4.5],
        executions=[50],
        intercept_ms=4.5,
        per_sample_ms=None,
        max_batch_size=32,
    )
    fig = figures.service_time_figure(one, DARK)
    assert len(fig.data) == 1
    assert any("slope is not known" in t for t in annotation_texts(fig))
    assert_empty(figures.service_time_figure(None, DARK), "no batch statistics")


def test_themes_differ_and_unknown_falls_back_to_dark() -> None:
    dark = figures.qps_figure(series(), DARK)
    light = figures.qps_figure(series(), LIGHT)
    assert dark.layout.template.layout.font.color == palette(DARK).text
    assert light.layout.template.layout.font.color == palette(LIGHT).text
    assert dark.layout.template.layout.font.color != light.layout.template.layout.font.color
    assert palette("nope") == palette(DARK)


def test_builders_are_pure() -> None:
    s = series()
    before = copy.deepcopy(s)
    first = figures.latency_figure(s, DARK).to_dict()
    assert figures.latency_figure(s, DARK).to_dict() == first
    assert s == before


def test_plotly_text_is_escaped() -> None:
    assert figures.plain(HOSTILE) == "&lt;img src=x onerror=alert(1)&gt;"
    fig = figures.empty_figure(f"nothing for {HOSTILE}", DARK)
    assert "<img" not in annotation_texts(fig)[0]


def test_utilisation_colours_run_from_idle_to_busy() -> None:
    assert utilisation_colour(None) == "#6b7280"
    assert len({utilisation_colour(p) for p in (5, 40, 70, 95)}) == 4
    assert utilisation_colour(0) == utilisation_colour(29.9)


# --------------------------------------------------------------------------- components


def row(
    model: str,
    *,
    requests_per_s: float | None = 10.0,
    busy_share: float | None = 0.5,
    dynamic_batching: bool = True,
    preferred: tuple[int, ...] = (8, 16),
    findings: list[StoredFinding] | None = None,
) -> ModelRow:
    """A model's row; ``requests_per_s=None``: no rates over the window."""
    rates = (
        None
        if requests_per_s is None
        else ModelRates(
            window_s=60.0,
            requests_per_s=requests_per_s,
            inferences_per_s=2 * requests_per_s,
            executions_per_s=requests_per_s,
            fail_per_s=0.0,
            avg_batch_size=2.0,
            queue_share=0.5,
            busy_share=busy_share,
        )
    )
    config = BatcherConfig(
        max_batch_size=32,
        dynamic_batching=dynamic_batching,
        preferred_batch_sizes=preferred,
        instance_count=1,
    )
    return ModelRow(
        status=ModelStatus(
            target="t",
            model=model,
            version="1",
            up=True,
            last_sample_at=T0,
            rates=rates,
            pending_request_count=1.0,
            config=config,
        ),
        findings=findings or [],
    )


def finding(kind: str, severity: str = "warning") -> StoredFinding:
    return StoredFinding(
        id=1,
        kind=kind,
        severity=severity,
        target="t",
        subject="m",
        summary="s",
        window_start=T0,
        window_end=T0,
        evidence={},
        created_at=T0,
        resolved_at=None,
    )


def walk(component):  # type: ignore[no-untyped-def]
    yield component
    children = getattr(component, "children", None)
    if isinstance(children, list | tuple):
        for c in children:
            yield from walk(c)
    elif children is not None and not isinstance(children, str | int | float):
        yield from walk(children)


def test_a_hostile_model_name_is_a_text_child_and_an_encoded_link() -> None:
    table = components.models_table([row(HOSTILE)])
    links = [c for c in walk(table) if isinstance(c, dcc.Link)]
    (link,) = links
    assert link.children == HOSTILE  # text, which React escapes
    assert "<" not in link.href and "%3Cimg" in link.href
    assert not any(isinstance(c, html.Img) for c in walk(table))


def test_rows_filter_and_sort() -> None:
    def models(rows: list[ModelRow]) -> list[str]:
        return [r.status.model for r in rows]

    rows = [
        row("b", requests_per_s=5.0, busy_share=0.9),
        row("a", requests_per_s=50.0, busy_share=None),
        row("c", requests_per_s=0.0, findings=[finding("batching_off"), finding("idle_capacity")]),
    ]
    assert models(components.sort_rows(rows, "name")) == ["a", "b", "c"]
    assert models(components.sort_rows(rows, "requests_per_s")) == ["a", "b", "c"]
    # A row without rates sorts last.
    assert models(
        components.sort_rows([row("d", requests_per_s=None), *rows], "requests_per_s")
    ) == ["a", "b", "c", "d"]
    assert models(components.sort_rows(rows, "busy_share")) == ["c", "b", "a"]
    assert models(components.sort_rows(rows, "findings"))[0] == "c"
    assert models(components.filter_rows(rows, " B ")) == ["b"]
    assert len(components.filter_rows(rows, "T")) == 3  # the target matches too
    assert len(components.filter_rows(rows, None)) == 3


def test_empty_state_and_down_banner() -> None:
    empty = OverviewData(generated_at=T0, window_s=60)
    (state,) = components.empty_state(empty)
    assert components.EMPTY_TEXT in [getattr(c, "children", None) for c in walk(state)]
    down = OverviewData(
        generated_at=T0 + 30,
        window_s=60,
        targets=[
            TargetTile(
                state=TargetState(
                    name="t",
                    kind="triton",
                    up=False,
                    last_error="connection refused",
                    last_seen_at=T0,
                    consecutive_failures=3,
                ),
                models=0,
            )
        ],
    )
    (message,) = components.overview_messages(down)
    assert "target t is down: connection refused" in message and "30 s ago" in message
    failed = OverviewData(generated_at=T0, window_s=60, error="the store is unreachable: x")
    assert components.overview_messages(failed) == ["the store is unreachable: x"]
    assert components.empty_state(failed) == []


def test_batch_cell_says_what_the_average_is_measured_against() -> None:
    def cell_text(r: ModelRow) -> list[str]:
        table = components.models_table([r])
        return [
            c.children for c in walk(table) if isinstance(c, html.Span) and c.className == "against"
        ]

    assert cell_text(row("m")) == ["preferred 8, 16"]
    assert cell_text(row("m", dynamic_batching=False, preferred=())) == ["batching off"]
    assert cell_text(row("m", preferred=())) == ["max 32"]


def test_what_if_figure_draws_qps_p95_objective_and_marks_the_choice() -> None:
    from dashboard.queries import WhatIfView

    view = WhatIfView(
        target="t",
        model="<b>m</b>",
        preferred=[8, 16],
        instances=2,
        delays_us=[0, 1000, 5000],
        predicted=[
            Prediction(qps=500.0, p95_ms=20.0),
            Prediction(qps=650.0, p95_ms=22.0),
            Prediction(qps=700.0, p95_ms=31.0),
        ],
        objective_p95_ms=25.0,
        objective="SLO p95 ≤ 25 ms",
        current=Prediction(qps=400.0, p95_ms=30.0),
    )
    fig = figures.what_if_figure(view, "dark", chosen_delay_us=1000, current_qps=410.0)
    names = [t.name for t in fig.data]
    assert names[:2] == ["predicted QPS", "predicted p95"]
    assert any(n.startswith("objective") for n in names) and "QPS now" in names
    # "Now" is the page's one current figure, not the what-if's own estimate of today.
    assert list(next(t for t in fig.data if t.name == "QPS now").y) == [410.0, 410.0]
    # Title and legend in rows of their own: the legend sits above the plot, below
    # the title, in a top margin that holds both.
    assert fig.layout.legend.y is None or fig.layout.legend.y >= 1
    assert fig.layout.margin.t >= 80
    bars = fig.data[0]
    assert list(bars.y) == [500.0, 650.0, 700.0]
    # The chosen delay's bar has its own colour.
    assert bars.marker.color[1] != bars.marker.color[0] == bars.marker.color[2]
    objective = next(t for t in fig.data if t.name.startswith("objective"))
    assert list(objective.y) == [25.0, 25.0] and objective.yaxis == "y2"
    assert "2 instance(s)" in fig.layout.title.text
    failed = figures.what_if_figure(
        WhatIfView(target="t", model="m", preferred=[], instances=1, error="not enough traffic"),
        "dark",
    )
    assert failed.layout.annotations[0].text == "not enough traffic"


def test_heatmap_rows_are_plain_text_and_empty_says_so() -> None:
    from dashboard.queries import HeatRow

    rows = [HeatRow(label="t · <img src=x> (pid 1)", kind="process", values=[10.0, None])]
    fig = figures.heatmap_figure(rows, [0.0, 5.0], "light", title="Processes")
    assert fig.data[0].y[0] == "t · &lt;img src=x&gt; (pid 1)"
    assert list(fig.data[0].z[0]) == [10.0, None]
    empty = figures.heatmap_figure([], [], "dark", title="GPU")
    assert empty.layout.annotations[0].text == "no readings in this range"
    assert empty.layout.title.text == "GPU"
