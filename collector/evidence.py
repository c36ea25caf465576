"""A finding's evidence as a reader sees it: each key a label, each value a figure with
its unit (``queue_us_per_request: 12345`` reads "queue time per request 12.3 ms").

``EVIDENCE_FIELDS`` is the one table of the keys the detectors, the recommender and
Apply write; a key it does not know is labelled from its name, its unit read from the
name's suffix (``_us``, ``_ms``, ``_s``, ``_per_s``, ``_pct``, ``_share``). The
dashboard and any text report both show evidence through ``evidence_items``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["EVIDENCE_FIELDS", "EvidenceField", "evidence_items", "evidence_text", "format_value"]


@dataclass(frozen=True)
class EvidenceField:
    """How one evidence value reads: ``label``, then the value times ``scale`` with
    ``unit`` after it; ``share`` values (0–1) read as a percentage."""

    label: str
    unit: str = ""
    scale: float = 1.0
    share: bool = False


def _share(label: str) -> EvidenceField:
    return EvidenceField(label, share=True)


def _ms_from_us(label: str) -> EvidenceField:
    return EvidenceField(label, "ms", 1e-3)


#: Every evidence key batchscope writes, in the order a reader wants them.
EVIDENCE_FIELDS: Final[dict[str, EvidenceField]] = {
    # what the model serves
    "requests_per_s": EvidenceField("requests", "req/s"),
    "avg_batch_size": EvidenceField("average batch size"),
    "queue_share": _share("time spent queued"),
    "queue_us_per_request": _ms_from_us("queue time per request"),
    "request_us_per_request": _ms_from_us("request time"),
    "queue_p95_us": _ms_from_us("queue p95"),
    "in_server_requests": EvidenceField("requests in the server"),
    "in_server": EvidenceField("requests in the server"),
    "concurrency_threshold": EvidenceField("concurrency threshold"),
    "pending_mean": EvidenceField("pending requests (mean)"),
    "pending_last": EvidenceField("pending requests (last)"),
    "pending_slope_per_s": EvidenceField("pending growth", "/s"),
    "rejected_per_s": EvidenceField("rejected", "req/s"),
    "reasons": EvidenceField("because"),
    # its batching
    "max_batch_size": EvidenceField("max batch size"),
    "max_queue_delay_us": EvidenceField("max queue delay", "µs"),
    "smallest_preferred_batch_size": EvidenceField("smallest preferred batch size"),
    "below_preferred_exec_share": _share("executions below preferred size"),
    "queue_to_delay_ratio": EvidenceField("queue time / max delay", "×"),
    "reference_batch_size": EvidenceField("reference batch size"),
    "reference": EvidenceField("reference"),
    "batch_to_reference_ratio": EvidenceField("batch / reference", "×"),
    "executions": EvidenceField("executions"),
    "instance_count": EvidenceField("instances"),
    "busy_share": _share("instances busy"),
    "idle_instances": EvidenceField("idle instances"),
    "idle_threshold_busy_share": _share("idle below busy"),
    # devices
    "device_name": EvidenceField("device"),
    "device_kind": EvidenceField("device kind"),
    "utilization_pct": EvidenceField("utilisation (mean)", "%"),
    "utilization_pct_max": EvidenceField("utilisation (max)", "%"),
    "idle_threshold_pct": EvidenceField("idle below", "%"),
    "idle_devices": EvidenceField("idle devices"),
    "metric": EvidenceField("metric"),
    "source": EvidenceField("source"),
    "traffic_rps": EvidenceField("traffic", "req/s"),
    "traffic_targets": EvidenceField("traffic on"),
    "traffic_queue_share": _share("traffic time queued"),
    # the recommender's observation
    "population": EvidenceField("concurrent clients"),
    "think_ms": EvidenceField("client think time", "ms"),
    "least_think_ms": EvidenceField("least think time", "ms"),
    "overhead_ms": EvidenceField("overhead per request", "ms"),
    "exec_ms_window": EvidenceField("execution time", "ms"),
    "saturated": EvidenceField("saturated"),
    "cpu_fraction": _share("CPU share"),
    "cores_available": EvidenceField("cores available"),
    "host_cpu_count": EvidenceField("host CPU cores"),
    "cpu_contention": EvidenceField("CPU contention"),
    "p95_limit_ms": EvidenceField("p95 limit", "ms"),
    "current_predicted_qps": EvidenceField("current, as modelled", "QPS"),
    "current_predicted_p95_ms": EvidenceField("current p95, as modelled", "ms"),
    "service_scale": EvidenceField("service time scale", "×"),
    "candidates": EvidenceField("candidates screened"),
    # Apply's verification
    "before_qps": EvidenceField("throughput before", "QPS"),
    "after_qps": EvidenceField("throughput after", "QPS"),
    "before_p95_ms": EvidenceField("p95 before", "ms"),
    "after_p95_ms": EvidenceField("p95 after", "ms"),
    "before_mean_ms": EvidenceField("mean latency before", "ms"),
    "after_mean_ms": EvidenceField("mean latency after", "ms"),
    "predicted_qps": EvidenceField("predicted throughput", "QPS"),
    "predicted_p95_ms": EvidenceField("predicted p95", "ms"),
    "rolled_back": EvidenceField("rolled back"),
    "changes": EvidenceField("changes"),
    # the window
    "samples": EvidenceField("samples"),
    "window_s": EvidenceField("window", "s"),
}

# A key the table does not know: its unit from its name's suffix (longest first).
_SUFFIXES: Final = (
    ("_per_s", EvidenceField("", "/s")),
    ("_share", EvidenceField("", share=True)),
    ("_pct", EvidenceField("", "%")),
    ("_us", EvidenceField("", "ms", 1e-3)),
    ("_ms", EvidenceField("", "ms")),
    ("_s", EvidenceField("", "s")),
)


def _field(key: str) -> EvidenceField:
    known = EVIDENCE_FIELDS.get(key)
    if known is not None:
        return known
    for suffix, shape in _SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            return EvidenceField(
                key[: -len(suffix)].replace("_", " "), shape.unit, shape.scale, shape.share
            )
    return EvidenceField(key.replace("_", " "))


def _number(value: float) -> str:
    """Three figures or so: 12345 → "12,345", 12.345 → "12.3", 0.1234 → "0.12"."""
    size = abs(value)
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and size < 1e15:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_value(key: str, value: object) -> str:
    """``value`` of evidence ``key`` as text, with its unit."""
    shape = _field(key)
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if shape.share:
            return f"{value:.0%}"
        number = _number(value * shape.scale)
        return f"{number} {shape.unit}" if shape.unit else number
    return str(value).replace("_", " ") if key == "reasons" else str(value)


def evidence_items(evidence: Mapping[str, object]) -> list[tuple[str, str]]:
    """``(label, value with unit)`` per evidence entry: the known keys in the table's
    order, then any others by name."""
    order = {key: i for i, key in enumerate(EVIDENCE_FIELDS)}
    keys = sorted(evidence, key=lambda k: (order.get(k, len(order)), k))
    return [(_field(k).label, format_value(k, evidence[k])) for k in keys]


def evidence_text(evidence: Mapping[str, object]) -> str:
    """The evidence on one line: "requests 420 req/s, time spent queued 30%, …"."""
    return ", ".join(f"{label} {value}" for label, value in evidence_items(evidence))
