"""Devices: utilisation of every GPU / MIG instance and of every model-instance
process over a range, as heatmaps (one row each), with memory and power.
``/devices?range=…`` is shareable. On a host without GPUs the process heatmap shows
the CPU each Python-backend instance used.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import dash
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components, figures
from dashboard.ids import Devices, Shell
from dashboard.page_parts import graph, live_page, register_tick
from dashboard.queries import RANGES, DashboardQueries, DevicesView, from_json, parse_range, to_json

dash.register_page(  # type: ignore[no-untyped-call]
    __name__, path="/devices", name="Devices", title="batchscope · devices", order=4
)

__all__ = ["layout", "register_callbacks"]

_GRAPHS = (Devices.HEATMAP, Devices.PROCESSES, Devices.MEMORY, Devices.POWER)


def layout(**query: Any) -> Any:
    range_name, _ = parse_range(query.get("range"))
    return live_page(
        Devices,
        [
            html.Div(
                [
                    dcc.Link(
                        name,
                        href="/devices?" + urlencode({"range": name}),
                        className="range-link range-current"
                        if name == range_name
                        else "range-link",
                    )
                    for name in RANGES
                ],
                id=Devices.RANGES,
                className="ranges",
            ),
            html.Div([graph(g) for g in _GRAPHS], className="graphs"),
        ],
        stores=[dcc.Store(id=Devices.QUERY, data={"range": range_name})],
    )


def _no_gpu_note(view: DevicesView) -> list[Any]:
    """Why the GPU panels are empty on a host without NVIDIA GPU (a quiet note)."""
    if not view.no_gpu_hosts or view.devices:
        return []
    hosts = ", ".join(f"{name} ({reason})" for name, reason in sorted(view.no_gpu_hosts.items()))
    return [
        html.Div(
            f"No NVIDIA GPU on this host — {hosts}. The GPU utilisation, memory and power "
            "panels stay empty; the process panel shows each model instance's CPU.",
            className="note note-no-gpu",
        )
    ]


def register_callbacks(app: Dash, queries: DashboardQueries, actions: object = None) -> None:
    del actions  # read-only page

    def read(query: Any) -> Any:
        return to_json(queries.devices(range_name=(query or {}).get("range")))

    register_tick(app, Devices, read, State(Devices.QUERY, "data"))

    @app.callback(
        Output(Devices.BANNER, "children"),
        *[Output(g, "figure") for g in _GRAPHS],
        Input(Devices.DATA, "data"),
        Input(Shell.THEME, "value"),
    )
    def draw(data: Any, theme: str) -> tuple[Any, ...]:
        if data is None:
            return ([], *(figures.empty_figure("loading", theme) for _ in _GRAPHS))
        view = from_json(DevicesView, data)
        if view.error:
            return (
                components.banner([view.error]),
                *(figures.empty_figure("the store could not be read", theme) for _ in _GRAPHS),
            )
        device_title = "GPU / MIG utilisation"
        if view.devices_truncated_to_s:
            device_title += f" · last {view.devices_truncated_to_s / 3600:.0f} h (no rollups yet)"
        process_title = f"Model-instance processes · {view.process_metric}"
        if view.process_window_s:
            process_title += f" · last {view.process_window_s / 3600:.0f} h"
        return (
            _no_gpu_note(view),
            figures.heatmap_figure(view.devices, view.t, theme, title=device_title),
            figures.heatmap_figure(view.processes, view.t, theme, title=process_title, zmax=None),
            figures.rows_figure(
                view.memory_used_gb, view.t, theme, title="GPU memory used", y_title="GB"
            ),
            figures.rows_figure(view.power_w, view.t, theme, title="Power", y_title="W"),
        )
