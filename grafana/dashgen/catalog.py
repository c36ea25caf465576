"""The bundled dashboards, where their JSON lives, and the one function that writes it."""

from __future__ import annotations

from pathlib import Path

from grafana.dashgen.batching import BATCHING_OVERVIEW
from grafana.dashgen.devices import GPUS_AND_INSTANCES
from grafana.dashgen.drilldown import MODEL_DRILLDOWN
from grafana.dashgen.render import dashboard_json, dashboard_text
from grafana.dashgen.spec import Dashboard, layout

__all__ = ["DASHBOARDS", "DASHBOARD_DIR", "dashboard_texts", "write_dashboards"]

DASHBOARDS: tuple[Dashboard, ...] = (BATCHING_OVERVIEW, GPUS_AND_INSTANCES, MODEL_DRILLDOWN)
# The committed JSON: what provisioning mounts and users import.
DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "dashboards"


def dashboard_texts() -> dict[str, str]:
    """Each bundled dashboard's file name and JSON text."""
    return {d.filename: dashboard_text(dashboard_json(d, layout(d.rows))) for d in DASHBOARDS}


def write_dashboards(out_dir: Path = DASHBOARD_DIR) -> list[Path]:
    """Write every bundled dashboard's JSON into ``out_dir``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in dashboard_texts().items():
        path = out_dir / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
