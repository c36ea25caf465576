"""The one place colours live: a Plotly template per theme (dark, light) and the colour
scales tiles and badges use. Page CSS (``assets/style.css``) mirrors these through
the ``theme-dark`` / ``theme-light`` class on the shell's root element."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import plotly.graph_objects as go

__all__ = [
    "DARK",
    "LIGHT",
    "THEMES",
    "Palette",
    "palette",
    "plotly_template",
    "severity_class",
    "utilisation_colour",
]

DARK: Final = "dark"
LIGHT: Final = "light"
THEMES: Final = (DARK, LIGHT)


@dataclass(frozen=True)
class Palette:
    background: str
    surface: str
    text: str
    muted: str
    grid: str
    # Series colours, in the order figures use them.
    series: tuple[str, ...]
    failure: str

    # The time-per-request bands take the first two series colours and the fitted
    # line the text colour, so they read as the same things across figures.
    @property
    def compute(self) -> str:
        return self.series[0]

    @property
    def queue(self) -> str:
        return self.series[1]

    @property
    def fit(self) -> str:
        return self.text


# Each role's colour in the dark and the light theme, side by side.
_ROLES: Final = {
    "background": ("#0f1419", "#ffffff"),
    "surface": ("#171d24", "#f5f7fa"),
    "text": ("#e6e9ee", "#1b2430"),
    "muted": ("#8b95a3", "#5b6675"),
    "grid": ("#26303b", "#e3e8ef"),
    "failure": ("#ff5c5c", "#d12f2f"),
}
_SERIES: Final = (
    ("#4ea1ff", "#f2b94b", "#58d68d", "#e07be0", "#5fd3d3", "#ff8a65"),
    ("#1f6fd1", "#c98a0a", "#1e9e57", "#a13ea1", "#138a8a", "#d9572b"),
)
_PALETTES: Final = {
    theme: Palette(series=_SERIES[column], **{role: pair[column] for role, pair in _ROLES.items()})
    for column, theme in enumerate(THEMES)
}


def palette(theme: str) -> Palette:
    """The palette of ``theme``; an unknown name falls back to dark."""
    return _PALETTES.get(theme, _PALETTES[DARK])


def plotly_template(theme: str) -> go.layout.Template:
    """The figures' template: transparent paper (the page's surface shows through),
    the palette's text and grid, series colours in order, a compact legend on top."""
    p = palette(theme)
    axis = {
        "gridcolor": p.grid,
        "zerolinecolor": p.grid,
        "linecolor": p.grid,
        "tickfont": {"color": p.muted},
        "title": {"font": {"color": p.muted}},
        "automargin": True,  # room for tick labels and titles; never cut one off
    }
    return go.layout.Template(
        layout={
            "paper_bgcolor": "rgba(0,0,0,0)",
            "plot_bgcolor": "rgba(0,0,0,0)",
            "font": {"color": p.text, "family": "Inter, system-ui, sans-serif", "size": 13},
            "colorway": list(p.series),
            "xaxis": axis,
            "yaxis": axis,
            "legend": {
                "orientation": "h",
                "y": 1.02,
                "yanchor": "bottom",
                "x": 1,
                "xanchor": "right",
                "font": {"color": p.muted},
            },
            "margin": {"l": 56, "r": 16, "t": 48, "b": 40},
            "hoverlabel": {"bgcolor": p.surface, "font": {"color": p.text}},
            # The title in its own row at the very top; a legend, when there is one,
            # sits in the row below it (``dashboard.figures`` makes room for it).
            "title": {
                "font": {"size": 15, "color": p.text},
                "x": 0,
                "xanchor": "left",
                "y": 1,
                "yref": "container",
                "yanchor": "top",
                "pad": {"t": 10},
            },
        }
    )


# Utilisation scale: low is idle capacity (the problem batchscope hunts), high is
# healthy use; the same hues in both themes, so a wall screen reads the same.
_UTILISATION_STOPS: Final = (
    (0.0, "#c0392b"),
    (30.0, "#e67e22"),
    (60.0, "#f1c40f"),
    (85.0, "#27ae60"),
)


def utilisation_colour(pct: float | None) -> str:
    """Tile colour for a utilisation percentage; grey when unknown."""
    if pct is None:
        return "#6b7280"
    colour = _UTILISATION_STOPS[0][1]
    for stop, stop_colour in _UTILISATION_STOPS:
        if pct >= stop:
            colour = stop_colour
    return colour


def severity_class(severity: str) -> str:
    """CSS class of a finding badge."""
    return {"critical": "badge badge-critical", "warning": "badge badge-warning"}.get(
        severity, "badge badge-info"
    )
