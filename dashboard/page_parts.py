"""What the live pages are built from: the frame every page has (its refresh, the
Store its one tick fills, its banner), the tick callback itself, and the small
controls and graphs several pages lay out the same way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dash import Dash, Input, Output, State, dcc, html

from dashboard.context import refresh_ms
from dashboard.ids import LivePage

__all__ = ["graph", "labelled", "live_page", "options", "register_tick"]


def live_page(
    page: type[LivePage],
    children: Sequence[Any],
    *,
    stores: Sequence[Any] = (),
    name: str | None = None,
) -> Any:
    """``page``'s root: its refresh Interval, the ``stores`` it keeps (query, state),
    the Store its tick fills and its banner, then ``children``; classed
    ``page page-<name>`` (the ids' prefix unless ``name`` is given)."""
    return html.Div(
        [
            dcc.Interval(id=page.INTERVAL, interval=refresh_ms(), n_intervals=0),
            *stores,
            dcc.Store(id=page.DATA),
            html.Div(id=page.BANNER, className="banners"),
            *children,
        ],
        className=f"page page-{name or page.PREFIX}",
    )


def register_tick(
    app: Dash, page: type[LivePage], read: Callable[..., Any], *inputs: Input | State
) -> None:
    """``page``'s one reading callback: on every refresh (and on a change of any of
    ``inputs``) ``read(*their values)`` fills the page's data Store."""

    def tick(_n: int, *values: Any) -> Any:
        return read(*values)

    app.callback(Output(page.DATA, "data"), Input(page.INTERVAL, "n_intervals"), *inputs)(tick)


def graph(graph_id: str, *, responsive: bool = False) -> Any:
    """A figure slot, read-only (no Plotly logo or mode bar); ``responsive`` resizes it
    with its box (otherwise Dash's default)."""
    config: dcc.Graph.Config = {"displaylogo": False, "displayModeBar": False}
    if responsive:
        config["responsive"] = True
    return dcc.Graph(id=graph_id, className="graph", config=config)


def labelled(label: str, control: Any) -> list[Any]:
    """A control with its label (tied to it for screen readers and clicks)."""
    return [html.Label(label, htmlFor=control.id), control]


def options(values: Sequence[str]) -> list[dict[str, str]]:
    """Dropdown options for names (``snake_case`` shown with spaces)."""
    return [{"label": v.replace("_", " "), "value": v} for v in values]
