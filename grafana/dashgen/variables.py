"""The template variables the dashboards share (the datasource variable is added to
every dashboard by the renderer)."""

from __future__ import annotations

from dataclasses import replace

from grafana.dashgen.metrics import exporter, triton
from grafana.dashgen.spec import TRITON, Variable, selector

__all__ = ["INSTANCE", "MODEL", "ONE_MODEL", "TARGET"]

INSTANCE = Variable(
    name="instance",
    label="Triton",
    selector=triton("nv_inference_request_success"),
    label_name="instance",
    description="Triton servers, by the instance label of Prometheus's scrape of Triton.",
)
TARGET = Variable(
    name="target",
    label="batchscope target",
    selector=exporter("batchscope_source_up"),
    label_name="target",
    description="The Tritons batchscope's exporter watches, by its target label.",
)
MODEL = Variable(
    name="model",
    label="Model",
    selector=selector(triton("nv_inference_request_success"), TRITON),
    label_name="model",
    description="Models served by the selected Tritons.",
)
ONE_MODEL = replace(MODEL, multi=False, description="The model to drill into.")
