"""Every query the bundled dashboards run, as typed records, and the substitution of
Grafana's template variables, so a test can run each one on a live Prometheus."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from grafana.dashgen.catalog import DASHBOARDS
from grafana.dashgen.metrics import Need
from grafana.dashgen.render import ref_ids
from grafana.dashgen.spec import Dashboard, Panel, layout

__all__ = [
    "TEMPLATE_VARIABLES",
    "PanelQuery",
    "VariableQuery",
    "panel_queries",
    "substitute",
    "variable_queries",
]

TEMPLATE_VARIABLES = frozenset(v.name for d in DASHBOARDS for v in d.variables)


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel (or one annotation) of a bundled dashboard. ``expr`` is raw,
    with ``$__rate_interval`` and the template variables still in it."""

    dashboard_uid: str
    panel_id: int  # 0 for an annotation
    panel_title: str  # the annotation's name for an annotation
    ref_id: str
    expr: str
    legend: str
    instant: bool
    is_annotation: bool
    # What it needs beyond a running Triton and batchscope exporter to return data.
    needs: frozenset[Need]

    @property
    def needs_gpu(self) -> bool:
        return bool(self.needs & {Need.GPU, Need.MIG})

    @property
    def needs_summaries(self) -> bool:
        return Need.SUMMARIES in self.needs


@dataclass(frozen=True)
class VariableQuery:
    """A template variable's ``label_values(selector, label)`` query."""

    dashboard_uid: str
    name: str
    query: str
    selector: str
    label: str


def _of_dashboard(dashboard: Dashboard) -> list[PanelQuery]:
    found = []
    for placed in layout(dashboard.rows):
        if not isinstance(placed.item, Panel):
            continue
        panel = placed.item
        for query, ref_id in zip(panel.queries, ref_ids(panel), strict=True):
            found.append(
                PanelQuery(
                    dashboard_uid=dashboard.uid,
                    panel_id=placed.panel_id,
                    panel_title=panel.title,
                    ref_id=ref_id,
                    expr=query.expr,
                    legend=query.legend,
                    instant=query.instant,
                    is_annotation=False,
                    needs=query.all_needs,
                )
            )
    for annotation in dashboard.annotations:
        found.append(
            PanelQuery(
                dashboard_uid=dashboard.uid,
                panel_id=0,
                panel_title=annotation.name,
                ref_id="annotation",
                expr=annotation.expr,
                legend=annotation.title_format,
                instant=False,
                is_annotation=True,
                needs=annotation.all_needs,
            )
        )
    return found


def panel_queries(dashboards: tuple[Dashboard, ...] = DASHBOARDS) -> list[PanelQuery]:
    """Every panel query and annotation query of ``dashboards``, in dashboard order."""
    return [q for d in dashboards for q in _of_dashboard(d)]


def variable_queries(dashboards: tuple[Dashboard, ...] = DASHBOARDS) -> list[VariableQuery]:
    """Every template variable's query of ``dashboards`` (the datasource variable has none)."""
    return [
        VariableQuery(d.uid, v.name, v.query, v.selector, v.label_name)
        for d in dashboards
        for v in d.variables
    ]


_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def substitute(
    expr: str,
    *,
    rate_interval: str = "1m",
    regex: str = ".*",
    values: Mapping[str, str] | None = None,
) -> str:
    """``expr`` as Grafana would send it: ``$__rate_interval`` becomes ``rate_interval``
    and each template variable its value in ``values``, else ``regex`` (what the variables'
    "All" sends). An unknown variable raises ValueError."""
    chosen = values or {}

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name == "__rate_interval":
            return rate_interval
        if name in TEMPLATE_VARIABLES:
            return chosen.get(name, regex)
        raise ValueError(f"unknown variable ${name} in {expr!r}")

    return _VARIABLE.sub(value_of, expr)
