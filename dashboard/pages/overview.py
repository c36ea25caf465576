"""Overview: every target, GPU / MIG instance and model at a glance.

One ``dcc.Interval`` drives ``tick``, the only callback that reads (one
``DashboardQueries.overview`` call into the page's ``dcc.Store``); the render
callbacks draw from that Store.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Dash, Input, Output, dcc, html

from dashboard import components
from dashboard.components.overview import host_notes
from dashboard.ids import Overview
from dashboard.page_parts import live_page, register_tick
from dashboard.queries import DashboardQueries, OverviewData, from_json, to_json

dash.register_page(  # type: ignore[no-untyped-call]
    __name__, path="/", name="Overview", title="batchscope · overview", order=0
)

__all__ = ["layout", "register_callbacks"]

#: The window each row's rates are taken over.
WINDOW_S = 60.0
# Drawn from the page's data by ``render``, in this order.
_PANELS = (Overview.BANNER, Overview.EMPTY, Overview.SUMMARY, Overview.TILES)


def layout(**_query: Any) -> Any:
    return live_page(
        Overview,
        [
            html.Div(id=Overview.EMPTY),
            html.Div(id=Overview.SUMMARY, className="stats"),
            html.Div(id=Overview.TILES, className="tiles"),
            html.Div(
                [
                    dcc.Input(
                        id=Overview.FILTER,
                        type="search",
                        placeholder="filter models or targets",
                        debounce=False,
                        className="filter",
                    ),
                    dcc.Dropdown(
                        id=Overview.SORT,
                        value="name",
                        clearable=False,
                        searchable=False,
                        options=[
                            {"label": f"sort: {label}", "value": key}
                            for key, label in components.SORT_KEYS.items()
                        ],
                        className="sort",
                    ),
                ],
                className="table-controls",
            ),
            html.Div(id=Overview.MODELS),
        ],
    )


def register_callbacks(app: Dash, queries: DashboardQueries, actions: object = None) -> None:
    del actions  # read-only page

    register_tick(app, Overview, lambda: to_json(queries.overview(window_s=WINDOW_S)))

    @app.callback(*[Output(p, "children") for p in _PANELS], Input(Overview.DATA, "data"))
    def render(data: Any) -> tuple[Any, ...]:
        if data is None:
            return tuple([] for _ in _PANELS)
        overview = from_json(OverviewData, data)
        return (
            components.banner(components.overview_messages(overview)),
            components.empty_state(overview) + host_notes(overview),
            components.overview_summary(overview) if not overview.empty else [],
            components.tiles(overview),
        )

    @app.callback(
        Output(Overview.MODELS, "children"),
        Input(Overview.DATA, "data"),
        Input(Overview.FILTER, "value"),
        Input(Overview.SORT, "value"),
    )
    def table(data: Any, text: str | None, sort: str | None) -> Any:
        if data is None:
            return []
        overview = from_json(OverviewData, data)
        if overview.empty:
            return []
        rows = components.sort_rows(components.filter_rows(overview.models, text), sort)
        return components.models_table(rows)
