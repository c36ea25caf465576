"""The bundled Grafana dashboards as code: typed records (``spec``) for each dashboard,
rendered with grafana-foundation-sdk into the committed JSON under ``grafana/dashboards``.

Regenerate with ``python -m grafana.dashgen``. ``panel_queries()`` and
``variable_queries()`` list every query the dashboards run, and ``substitute()`` fills
their template variables, so tests can run them on a real Prometheus.
"""

from __future__ import annotations

from grafana.dashgen.catalog import DASHBOARD_DIR, DASHBOARDS, dashboard_texts, write_dashboards
from grafana.dashgen.metrics import Need
from grafana.dashgen.queries import (
    TEMPLATE_VARIABLES,
    PanelQuery,
    VariableQuery,
    panel_queries,
    substitute,
    variable_queries,
)

__all__ = [
    "DASHBOARDS",
    "DASHBOARD_DIR",
    "TEMPLATE_VARIABLES",
    "Need",
    "PanelQuery",
    "VariableQuery",
    "dashboard_texts",
    "panel_queries",
    "substitute",
    "variable_queries",
    "write_dashboards",
]
