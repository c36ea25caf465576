"""Findings: active and past events, filterable by target, model, kind, severity and
state, each with its evidence and a link to its model page; for an admin, an open
finding links to the alerts page with a silence for its alerts filled in. The page
reads ``DashboardQueries.events``; alert states, silences and notification deliveries
are on the alerts page (``/alerts``).
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Dash, Input, Output, dcc, html

from dashboard import auth, components
from dashboard.ids import Findings
from dashboard.page_parts import live_page, options, register_tick
from dashboard.queries import DashboardQueries, EventsView, from_json, to_json

dash.register_page(  # type: ignore[no-untyped-call]
    __name__, path="/findings", name="Findings", title="batchscope · findings", order=3
)

__all__ = ["layout", "register_callbacks"]

_STATES = (("active", "active"), ("past", "resolved"), ("all", "all"))
# The dropdown filters: their id and the query-string key (``/findings?kind=…``) that
# starts them, in the order the tick passes their values to ``events``.
_FILTERS = (
    (Findings.TARGET, "target"),
    (Findings.MODEL, "model"),
    (Findings.KIND, "kind"),
    (Findings.SEVERITY, "severity"),
)


def _filter(component_id: str, key: str, value: Any) -> Any:
    return dcc.Dropdown(
        id=component_id,
        placeholder=f"any {key}",
        value=value or None,
        clearable=True,
        className="filter-dropdown",
        options=[],
    )


def layout(**query: Any) -> Any:
    return live_page(
        Findings,
        [
            html.Div(
                [
                    *(_filter(cid, key, query.get(key)) for cid, key in _FILTERS),
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
    )


def register_callbacks(app: Dash, queries: DashboardQueries, actions: object = None) -> None:
    del actions  # read-only page

    def read(target: Any, model: Any, kind: Any, severity: Any, state: Any) -> Any:
        return to_json(
            queries.events(
                target=target or None,
                subject=model or None,
                kind=kind or None,
                severity=severity or None,
                state=state if state in ("active", "past", "all") else "active",
            )
        )

    filters = [Input(cid, "value") for cid, _ in _FILTERS]
    register_tick(app, Findings, read, *filters, Input(Findings.STATE, "value"))

    @app.callback(
        Output(Findings.BANNER, "children"),
        Output(Findings.LIST, "children"),
        *[Output(cid, "options") for cid, _ in _FILTERS],
        Input(Findings.DATA, "data"),
    )
    def render(data: Any) -> tuple[Any, ...]:
        if data is None:
            return ([], [], *([] for _ in _FILTERS))
        view = from_json(EventsView, data)
        return (
            components.banner([view.error] if view.error else []),
            components.events_list(view.events, can_silence=auth.is_admin()),
            options(view.targets),
            options(view.subjects),
            options(view.kinds),
            options(view.severities),
        )
