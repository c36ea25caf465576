"""Model page: ``/model?target=…&model=…&range=…`` (shareable; the range links keep
the target and model).

One ``dcc.Interval`` drives ``tick``, the only callback that reads (one
``DashboardQueries.model_detail`` call into the page's ``dcc.Store``); the figure and
panel callbacks draw from that Store and the theme.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components, figures
from dashboard.ids import Model, Shell
from dashboard.page_parts import graph, live_page, register_tick
from dashboard.queries import DashboardQueries, ModelDetail, from_json, parse_range, to_json

dash.register_page(  # type: ignore[no-untyped-call]
    __name__, path="/model", name="Model", title="batchscope · model", order=1
)

__all__ = ["layout", "register_callbacks"]

_GRAPHS = (
    Model.QPS,
    Model.BATCH,
    Model.LATENCY,
    Model.PENDING,
    Model.FAILURES,
    Model.DISTRIBUTION,
    Model.SERVICE_TIME,
)
# Drawn from the page's data by ``panels``, in this order.
_PANELS = (Model.BANNER, Model.HEADER, Model.RECOMMENDATION, Model.FINDINGS, Model.CONFIG)


def layout(**query: Any) -> Any:
    target = query.get("target") or None
    model = query.get("model") or None
    range_name, _seconds = parse_range(query.get("range"))
    query_store = dcc.Store(
        id=Model.QUERY, data={"target": target, "model": model, "range": range_name}
    )
    return live_page(
        Model,
        [
            html.Div(
                components.model_header(None, target, model),
                id=Model.HEADER,
                className="model-header",
            ),
            html.Div(
                components.range_links(target, model, range_name),
                id=Model.RANGES,
                className="ranges",
            ),
            # What to do first: the recommendation and the findings above the charts.
            html.Div(
                [
                    html.Div(id=Model.RECOMMENDATION, className="panel"),
                    html.Div(id=Model.FINDINGS, className="panel"),
                ],
                className="panels",
            ),
            html.Div([graph(g, responsive=True) for g in _GRAPHS], className="graphs"),
            html.Div(html.Div(id=Model.CONFIG, className="panel"), className="panels"),
        ],
        stores=[query_store],
    )


def _detail(data: Any) -> ModelDetail | None:
    return from_json(ModelDetail, data) if data else None


def register_callbacks(app: Dash, queries: DashboardQueries, actions: object = None) -> None:
    del actions  # read-only page

    def read(query: Any) -> Any:
        if not query or not query.get("target") or not query.get("model"):
            return None
        return to_json(
            queries.model_detail(query["target"], query["model"], range_name=query.get("range"))
        )

    register_tick(app, Model, read, State(Model.QUERY, "data"))

    @app.callback(
        *[Output(g, "figure") for g in _GRAPHS],
        Input(Model.DATA, "data"),
        Input(Shell.THEME, "value"),
    )
    def draw(data: Any, theme: str) -> tuple[Any, ...]:
        detail = _detail(data)
        if detail is None or detail.error:
            message = "no model chosen" if detail is None else "the store could not be read"
            return tuple(figures.empty_figure(message, theme) for _ in _GRAPHS)
        s = detail.series
        config = detail.config.config if detail.config else None
        preferred = config.preferred_batch_sizes if config else ()
        return (
            figures.qps_figure(s, theme),
            figures.batch_size_figure(
                s,
                theme,
                preferred=preferred,
                max_batch_size=config.max_batch_size if config else None,
            ),
            figures.latency_figure(s, theme),
            figures.pending_figure(s, theme),
            figures.failures_figure(s, theme),
            figures.distribution_figure(detail.distribution, theme, preferred=preferred),
            figures.service_time_figure(detail.service_time, theme),
        )

    @app.callback(
        *[Output(p, "children") for p in _PANELS],
        Input(Model.DATA, "data"),
        State(Model.QUERY, "data"),
    )
    def panels(data: Any, query: Any) -> tuple[Any, ...]:
        query = query or {}
        detail = _detail(data)
        header = components.model_header(detail, query.get("target"), query.get("model"))
        if detail is None or detail.error:
            return components.model_banner(detail), header, [], [], []
        return (
            components.model_banner(detail),
            header,
            components.recommendation_card(detail.recommendation),
            components.findings_list(
                detail.findings, now=detail.until, target=detail.target, model=detail.model
            ),
            components.config_panel(detail.config),
        )
