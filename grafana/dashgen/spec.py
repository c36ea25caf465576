"""Typed records that describe a dashboard, its layout on Grafana's grid, and the
PromQL building blocks every dashboard shares (selectors on the template variables)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from grafana.dashgen.metrics import Need, needs_of

__all__ = [
    "EXPORTER",
    "EXPORTER_MODEL",
    "GRID_WIDTH",
    "TRITON",
    "TRITON_MODEL",
    "Annotation",
    "Dashboard",
    "Panel",
    "Placed",
    "Query",
    "Row",
    "Variable",
    "Viz",
    "layout",
    "rate",
    "selector",
    "sum_rate",
]

GRID_WIDTH = 24
ROW_HEIGHT = 1

# Triton's series are told apart by the instance label of Prometheus's scrape of Triton;
# the exporter's by its own target label (the Triton it watches).
TRITON = 'instance=~"$instance"'
TRITON_MODEL = 'instance=~"$instance", model=~"$model"'
EXPORTER = 'target=~"$target"'
EXPORTER_MODEL = 'target=~"$target", model=~"$model"'


def selector(metric: str, matchers: str, extra: str = "") -> str:
    """``metric{matchers, extra}``."""
    inner = f"{matchers}, {extra}" if extra else matchers
    return f"{metric}{{{inner}}}"


def rate(series: str) -> str:
    """Per-second rate over Grafana's ``$__rate_interval`` (at least four scrapes)."""
    return f"rate({series}[$__rate_interval])"


def sum_rate(series: str, by: str = "model") -> str:
    """``sum by (by) (rate(series))``: add the counters' rates first, divide later."""
    return f"sum by ({by}) ({rate(series)})"


class Viz(StrEnum):
    TIMESERIES = "timeseries"
    STAT = "stat"
    TABLE = "table"


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel. ``needs`` adds what the metric names do not tell
    (a MIG selector); the rest is derived from the metrics the query names."""

    expr: str
    legend: str = ""
    # Tables and stats of info metrics read the latest sample only.
    instant: bool = False
    needs: frozenset[Need] = frozenset()

    @property
    def all_needs(self) -> frozenset[Need]:
        return self.needs | needs_of(self.expr)


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    viz: Viz = Viz.TIMESERIES
    width: int = 12
    height: int = 8
    stacked: bool = False
    # Series whose display name matches this regex are drawn dashed: configured values
    # (preferred sizes, max batch size) drawn as reference lines.
    reference_series: str | None = None
    min_value: float | None = None
    max_value: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A query variable filled from ``label_values(selector, label)``."""

    name: str
    label: str
    selector: str
    label_name: str
    description: str
    multi: bool = True

    @property
    def query(self) -> str:
        return f"label_values({self.selector}, {self.label_name})"


@dataclass(frozen=True)
class Annotation:
    """Events drawn on every time series panel: one per series of ``expr`` while it holds."""

    name: str
    expr: str
    title_format: str
    text_format: str
    tag_keys: str
    color: str

    @property
    def all_needs(self) -> frozenset[Need]:
        return needs_of(self.expr)


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    filename: str
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    annotations: tuple[Annotation, ...] = ()


@dataclass(frozen=True)
class Placed:
    """A row or panel with its id and rectangle on Grafana's 24-column grid."""

    item: Row | Panel
    panel_id: int
    x: int
    y: int
    w: int
    h: int


def layout(rows: tuple[Row, ...]) -> list[Placed]:
    """Rows full width, each followed by its panels left to right, wrapping at the
    grid's width; ids count up in reading order, so they are stable."""
    placed: list[Placed] = []
    y = 0
    for row in rows:
        placed.append(Placed(row, len(placed) + 1, 0, y, GRID_WIDTH, ROW_HEIGHT))
        y += ROW_HEIGHT
        x, line_height = 0, 0
        for panel in row.panels:
            if panel.width > GRID_WIDTH:
                raise ValueError(f"{panel.title!r} is wider than the grid")
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            placed.append(Placed(panel, len(placed) + 1, x, y, panel.width, panel.height))
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return placed
