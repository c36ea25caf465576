"""Turn the dashboard records into Grafana JSON with grafana-foundation-sdk's typed
builders, and write them with a stable key order."""

from __future__ import annotations

import json
import re
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from grafana.dashgen.metrics import Need
from grafana.dashgen.spec import Annotation, Dashboard, Panel, Placed, Query, Row, Variable, Viz

__all__ = [
    "DATASOURCE_VARIABLE",
    "PROVISIONED_DATASOURCE_NAME",
    "PROVISIONED_DATASOURCE_UID",
    "dashboard_json",
    "dashboard_text",
    "describe",
    "ref_ids",
]

DATASOURCE_VARIABLE = "datasource"
# The uid of the datasource grafana/provisioning/datasources/batchscope.yaml creates: the
# datasource variable starts on it, so provisioned dashboards resolve without a click;
# after an import by hand the user picks a Prometheus in the variable.
PROVISIONED_DATASOURCE_UID = "batchscope-prometheus"
PROVISIONED_DATASOURCE_NAME = "Prometheus (batchscope)"
_DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_DASHED = {"fill": "dash", "dash": [10, 10]}


def ref_ids(panel: Panel) -> list[str]:
    """Grafana's query ids, A, B, C ... in the panel's order."""
    return [chr(ord("A") + i) for i in range(len(panel.queries))]


def describe(panel: Panel) -> str:
    """The panel's description, with what its queries need beyond Triton and batchscope
    (a GPU, Triton's summaries ...), so an empty panel explains itself."""
    needs = [q.all_needs for q in panel.queries]
    common_needs = frozenset.intersection(*needs)
    notes = []
    if common_needs:
        notes.append(f"Has data only with {_and(common_needs)}.")
    for query, query_needs in zip(panel.queries, needs, strict=True):
        if query_needs - common_needs:
            notes.append(
                f'Series "{_readable(query.legend)}" has data only with '
                f"{_and(query_needs - common_needs)}."
            )
    return " ".join([panel.description, *notes])


def _readable(legend: str) -> str:
    """``{{model}} preferred`` as ``<model> preferred``."""
    return _LEGEND_LABEL.sub(r"<\1>", legend)


def _and(needs: frozenset[Need]) -> str:
    if Need.MIG in needs:  # a MIG instance implies an NVIDIA GPU
        needs = needs - {Need.GPU}
    return " and ".join(sorted(n.value for n in needs))


def _target(query: Query, ref_id: str, viz: Viz) -> prometheus.Dataquery:
    target = (
        prometheus.Dataquery()
        .expr(query.expr)
        .legend_format(query.legend or "__auto")
        .ref_id(ref_id)
        .datasource(_DATASOURCE)
    )
    if viz is Viz.TABLE:
        target = target.instant().format(PromQueryFormat.TABLE)
    elif query.instant:
        target = target.instant()
    else:
        target = target.range()
    return target


def _timeseries(panel: Panel) -> timeseries.Panel:
    builder = timeseries.Panel().fill_opacity(10 if not panel.stacked else 60)
    if panel.stacked:
        builder = builder.stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
        )
    if panel.reference_series:
        builder = builder.override_by_regexp(
            panel.reference_series,
            [
                dashboard.DynamicConfigValue(id_val="custom.lineStyle", value=_DASHED),
                dashboard.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
            ],
        )
    return builder


def _table() -> table.Panel:
    # Info metrics carry their facts in labels: show those, not time, value or the
    # exporter's scrape address (target names the Triton).
    hidden = {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True}
    return table.Panel().with_transformation(
        dashboard.DataTransformerConfig(id_val="organize", options={"excludeByName": hidden})
    )


def _panel(placed: Placed, panel: Panel) -> timeseries.Panel | stat.Panel | table.Panel:
    builder: timeseries.Panel | stat.Panel | table.Panel
    if panel.viz is Viz.TIMESERIES:
        builder = _timeseries(panel)
    elif panel.viz is Viz.STAT:
        builder = stat.Panel()
    else:
        builder = _table()
    builder = (
        builder.id(placed.panel_id)
        .title(panel.title)
        .description(describe(panel))
        .unit(panel.unit)
        .datasource(_DATASOURCE)
        .grid_pos(dashboard.GridPos(h=placed.h, w=placed.w, x=placed.x, y=placed.y))
        .targets(
            [
                _target(q, ref, panel.viz)
                for q, ref in zip(panel.queries, ref_ids(panel), strict=True)
            ]
        )
    )
    if panel.min_value is not None:
        builder = builder.min(panel.min_value)
    if panel.max_value is not None:
        builder = builder.max(panel.max_value)
    return builder


def _row(placed: Placed, row: Row) -> builders.Row:
    return (
        builders.Row(row.title)
        .id(placed.panel_id)
        .grid_pos(dashboard.GridPos(h=placed.h, w=placed.w, x=placed.x, y=placed.y))
    )


def _variable(variable: Variable) -> builders.QueryVariable:
    builder = (
        builders.QueryVariable(variable.name)
        .label(variable.label)
        .description(variable.description)
        .datasource(_DATASOURCE)
        .query(variable.query)
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
        .multi(variable.multi)
        .include_all(variable.multi)
    )
    if variable.multi:
        # ".*" rather than the list of values: it also matches series without the label
        # (a device finding has model="") and keeps queries short on big fleets.
        builder = builder.all_value(".*").current(
            dashboard.VariableOption(selected=True, text=["All"], value=["$__all"])
        )
    return builder


def _datasource_variable() -> builders.DatasourceVariable:
    return (
        builders.DatasourceVariable(DATASOURCE_VARIABLE)
        .label("Prometheus")
        .type("prometheus")
        .current(
            dashboard.VariableOption(
                selected=True, text=PROVISIONED_DATASOURCE_NAME, value=PROVISIONED_DATASOURCE_UID
            )
        )
    )


def _other_dashboards() -> builders.DashboardLink:
    """A menu of the other batchscope dashboards, keeping the time range and variables."""
    return (
        builders.DashboardLink("batchscope dashboards")
        .type(dashboard.DashboardLinkType.DASHBOARDS)
        .tags(["batchscope"])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
    )


def _annotation(annotation: Annotation) -> builders.AnnotationQuery:
    return (
        builders.AnnotationQuery()
        .name(annotation.name)
        .datasource(_DATASOURCE)
        .enable(True)
        .icon_color(annotation.color)
        .expr(annotation.expr)
    )


def _annotation_fields(annotation: Annotation) -> dict[str, object]:
    """Fields of Grafana's Prometheus annotation that the SDK's generic model lacks."""
    return {
        "step": "60s",
        "titleFormat": annotation.title_format,
        "textFormat": annotation.text_format,
        "tagKeys": annotation.tag_keys,
        "useValueForTime": False,
    }


def _builder(spec: Dashboard, placed: list[Placed]) -> builders.Dashboard:
    builder = (
        builders.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(["batchscope", "triton"])
        .editable()
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .with_variable(_datasource_variable())
        .link(_other_dashboards())
    )
    for variable in spec.variables:
        builder = builder.with_variable(_variable(variable))
    for annotation in spec.annotations:
        builder = builder.annotation(_annotation(annotation))
    for item in placed:
        if isinstance(item.item, Row):
            builder = builder.with_row(_row(item, item.item))
        else:
            builder = builder.with_panel(_panel(item, item.item))
    return builder


def dashboard_json(spec: Dashboard, placed: list[Placed]) -> dict[str, Any]:
    """The Grafana JSON model of ``spec`` laid out as ``placed``."""
    model = json.loads(json.dumps(_builder(spec, placed).build(), cls=JSONEncoder))
    assert isinstance(model, dict)
    by_name = {a.name: a for a in spec.annotations}
    for entry in model.get("annotations", {}).get("list", []):
        entry.update(_annotation_fields(by_name[entry["name"]]))
    return model


def dashboard_text(model: dict[str, Any]) -> str:
    """The file's text: sorted keys, two-space indent, a trailing newline, so
    regenerating gives the same bytes."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
