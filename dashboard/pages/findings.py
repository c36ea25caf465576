"""Findings: active and past events, filterable by target, model, kind, severity and
state, each with its evidence and a link to its model page. The page reads
``DashboardQueries.events``, so alert states and notification deliveries appear here
once the query module reads them; the layout does not change.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Dash, Input, Output, dcc, html

from dashboard import components
from dashboard.context import refresh_ms
from dashboard.ids import Findings
from dashboard.queries import DashboardQueries, EventsView, from_json, to_json

dash.register_page(  # type: ignore[no-untyped-call]
    __name__, path="/findings", name="Findings", title="batchscope · findings", order=3
)

__all__ = ["layout", "register_callbacks"]

_STATES = (("active", "active"), ("past", "resolved"), ("all", "all"))


def _dropdown(component_id: str, placeholder: str, value: Any = None) -> Any:
    return dcc.Dropdown(
        id=component_id,
        placeholder=placeholder,
        value=value,
        clearable=True,
        className="filter-dropdown",
        options=[],
    )


def layout(**query: Any) -> Any:
    return html.Div(
        [
            dcc.Interval(id=Findings.INTERVAL, interval=refresh_ms(), n_intervals=0),
            dcc.Store(id=Findings.DATA),
            html.Div(id=Findings.BANNER, className="banners"),
            html.Div(
                [
                    _dropdown(Findings.TARGET, "any target", query.get("target") or None),
                    _dropdown(Findings.MODEL, "any model", query.get("model") or None),
                    _dropdown(Findings.KIND, "any kind", query.get("kind") or None),
                    _dropdown(Findings.SEVERITY, "any severity", query.get("severity") or None),
                    dcc.RadioItems(
                        id=Findings.STATE,
                        value=query.get("state") or "active",
                        inline=True,
                        className="state-switch",
                        options=[{"label": label, "value": value} for value, label in _STATES],
                    ),
                ],
                className="table-controls",
            ),
            html.Div(id=Findings.LIST),
        ],
        className="page page-findings",
    )


def register_callbacks(app: Dash, queries: DashboardQueries, actions: object = None) -> None:
    del actions  # read-only page

    @app.callback(
        Output(Findings.DATA, "data"),
        Input(Findings.INTERVAL, "n_intervals"),
        Input(Findings.TARGET, "value"),
        Input(Findings.MODEL, "value"),
        Input(Findings.KIND, "value"),
        Input(Findings.SEVERITY, "value"),
        Input(Findings.STATE, "value"),
    )
    def tick(_n: int, target: Any, model: Any, kind: Any, severity: Any, state: Any) -> Any:
        return to_json(
            queries.events(
                target=target or None,
                subject=model or None,
                kind=kind or None,
                severity=severity or None,
                state=state if state in ("active", "past", "all") else "active",
            )
        )

    @app.callback(
        Output(Findings.BANNER, "children"),
        Output(Findings.LIST, "children"),
        Output(Findings.TARGET, "options"),
        Output(Findings.MODEL, "options"),
        Output(Findings.KIND, "options"),
        Output(Findings.SEVERITY, "options"),
        Input(Findings.DATA, "data"),
    )
    def render(data: Any) -> tuple[Any, ...]:
        if data is None:
            return [], [], [], [], [], []
        view = from_json(EventsView, data)

        def options(values: list[str]) -> list[dict[str, str]]:
            return [{"label": v.replace("_", " "), "value": v} for v in values]

        return (
            components.banner([view.error] if view.error else []),
            components.events_list(view.events),
            options(view.targets),
            options(view.subjects),
            options(view.kinds),
            options(view.severities),
        )
