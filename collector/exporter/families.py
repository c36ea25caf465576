"""The exporter's metric families: their names, types, units, help and labels.

These names are a contract: the bundled Grafana dashboards, the Prometheus rules and
users' own queries depend on them. They live here, once; the exporter's collectors
yield exactly these families and the dashboards' generator names metrics through
these constants, so a rename breaks the build, not a dashboard in the field.

Naming follows Prometheus's practice: one ``batchscope_`` prefix, base units
(``_seconds``, ``_bytes``, ``_ratio`` for 0..1), ``_total`` on counters, ``_info``
for facts carried in labels (value 1). Counters are exported where Prometheus can
take the rate itself; gauges only for what the analysis alone knows, over its window.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FAMILIES", "Family", "Kind", "family"]


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    INFO = "info"


@dataclass(frozen=True)
class Family:
    """One metric family. ``name`` is exactly what appears in the exposition and in
    PromQL, ``_total`` and ``_info`` suffixes included."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    # True when a panel on it has data only on a machine with an NVIDIA GPU.
    needs_gpu: bool = False


_MODEL = ("target", "model", "version")

FAMILIES: tuple[Family, ...] = (
    # ---------------------------------------------------------------- batch_stats
    Family(
        "batchscope_model_executions_total",
        Kind.COUNTER,
        "Executions of the model at each executed batch size (Triton statistics API "
        "batch_stats), cumulative since the model loaded.",
        (*_MODEL, "batch_size"),
    ),
    Family(
        "batchscope_model_execution_compute_seconds_total",
        Kind.COUNTER,
        "Compute time (input + infer + output) of executions at each batch size, "
        "cumulative since the model loaded.",
        (*_MODEL, "batch_size"),
    ),
    # ---------------------------------------------------------- the analysis window
    Family(
        "batchscope_model_average_batch_size",
        Kind.GAUGE,
        "Inferences per execution over the analysis window (batchscope's own figure).",
        _MODEL,
    ),
    Family(
        "batchscope_model_queue_ratio",
        Kind.GAUGE,
        "Share of request time spent queued over the analysis window.",
        _MODEL,
    ),
    Family(
        "batchscope_model_instance_busy_ratio",
        Kind.GAUGE,
        "Share of the window the model's instances were computing (batch_stats compute "
        "time / (window x instance count)).",
        _MODEL,
    ),
    Family(
        "batchscope_model_idle_instances",
        Kind.GAUGE,
        "Idle capacity in instance-equivalents over the analysis window: instance count "
        "x (1 - busy ratio).",
        _MODEL,
    ),
    Family(
        "batchscope_analysis_window_seconds",
        Kind.GAUGE,
        "Length of the window the analysis gauges are computed over.",
        (),
    ),
    # --------------------------------------------------------- the effective config
    Family(
        "batchscope_model_config_info",
        Kind.INFO,
        "The model's effective batching config as Triton reports it (value 1).",
        ("target", "model", "dynamic_batching", "preferred_batch_sizes", "timeout_action"),
    ),
    Family(
        "batchscope_model_max_batch_size",
        Kind.GAUGE,
        "max_batch_size of the model's config (0: the model does not batch).",
        ("target", "model"),
    ),
    Family(
        "batchscope_model_preferred_batch_size",
        Kind.GAUGE,
        "One preferred_batch_size of the dynamic batcher; position is its index.",
        ("target", "model", "position"),
    ),
    Family(
        "batchscope_model_max_queue_delay_seconds",
        Kind.GAUGE,
        "max_queue_delay_microseconds of the dynamic batcher, in seconds.",
        ("target", "model"),
    ),
    Family(
        "batchscope_model_instances",
        Kind.GAUGE,
        "Instance count of the model (instance_group counts summed).",
        ("target", "model"),
    ),
    # ------------------------------------------------- findings and recommendations
    Family(
        "batchscope_finding",
        Kind.GAUGE,
        "1 while a finding is active (idle capacity, queue saturation, batching off ...).",
        ("target", "kind", "severity", "model", "device"),
    ),
    Family(
        "batchscope_recommendation_info",
        Kind.INFO,
        "The latest recommendation per model (value 1); change lists the config fields it changes.",
        ("target", "model", "kind", "change"),
    ),
    Family(
        "batchscope_recommendation_current_requests_per_second",
        Kind.GAUGE,
        "Throughput observed when the latest recommendation was made.",
        ("target", "model"),
    ),
    Family(
        "batchscope_recommendation_predicted_requests_per_second",
        Kind.GAUGE,
        "Throughput predicted for the recommended config at the observed load.",
        ("target", "model"),
    ),
    Family(
        "batchscope_recommendation_current_p95_seconds",
        Kind.GAUGE,
        "p95 latency observed when the latest recommendation was made.",
        ("target", "model"),
    ),
    Family(
        "batchscope_recommendation_predicted_p95_seconds",
        Kind.GAUGE,
        "p95 latency predicted for the recommended config at the observed load.",
        ("target", "model"),
    ),
    Family(
        "batchscope_recommendation_confidence_ratio",
        Kind.GAUGE,
        "Confidence of the latest recommendation, 0..1.",
        ("target", "model"),
    ),
    # ------------------------------------------------------------------- sources
    Family(
        "batchscope_source_up",
        Kind.GAUGE,
        "1 when the source's last scrape of the target succeeded and is fresh, else 0.",
        ("source", "target"),
    ),
    Family(
        "batchscope_source_scrape_duration_seconds",
        Kind.GAUGE,
        "Duration of the source's last scrape of the target.",
        ("source", "target"),
    ),
    # ---------------------------------------------- devices, MIG and processes
    Family(
        "batchscope_device_utilization_ratio",
        Kind.GAUGE,
        "Share of time a kernel ran on the GPU or MIG instance (NVML utilization.gpu).",
        ("target", "source", "uuid", "kind", "parent_uuid", "name"),
        needs_gpu=True,
    ),
    Family(
        "batchscope_device_sm_active_ratio",
        Kind.GAUGE,
        "Share of SMs busy on the GPU or MIG instance (GPM SM activity), where supported.",
        ("target", "uuid", "kind", "parent_uuid", "name"),
        needs_gpu=True,
    ),
    Family(
        "batchscope_device_memory_used_bytes",
        Kind.GAUGE,
        "Device memory in use on the GPU or MIG instance.",
        ("target", "source", "uuid", "kind", "parent_uuid", "name"),
        needs_gpu=True,
    ),
    Family(
        "batchscope_process_cpu_cores",
        Kind.GAUGE,
        "CPU used by a Triton process or Python-backend model instance, in cores.",
        ("target", "pid", "role", "model", "model_instance"),
    ),
    Family(
        "batchscope_process_sm_utilization_ratio",
        Kind.GAUGE,
        "Share of the GPU's SMs used by the process (NVML per-process utilisation).",
        ("target", "pid", "model", "model_instance", "gpu_uuid"),
        needs_gpu=True,
    ),
    Family(
        "batchscope_process_gpu_memory_bytes",
        Kind.GAUGE,
        "GPU memory used by the process.",
        ("target", "pid", "model", "model_instance", "gpu_uuid"),
        needs_gpu=True,
    ),
    # -------------------------------------------------------------------- alerts
    Family(
        "batchscope_alert",
        Kind.GAUGE,
        "1 per batchscope alert that is pending or firing (state); model or device "
        "names its subject.",
        ("alertname", "rule", "severity", "state", "target", "model", "device"),
    ),
    Family(
        "batchscope_alert_notifications",
        Kind.GAUGE,
        "Notifications in the alert outbox per receiver and state (pending, delivered, "
        "dead, gone); finished ones are kept for alerts.keep_s.",
        ("receiver", "state"),
    ),
    # ------------------------------------------------ the store, from this process
    Family(
        "batchscope_store_up",
        Kind.GAUGE,
        "1 while the store takes this process's writes; 0 while it cannot and writes "
        "are held in memory.",
        (),
    ),
    Family(
        "batchscope_store_writes_held",
        Kind.GAUGE,
        "Writes held in memory because the store could not take them (0 when none).",
        (),
    ),
    Family(
        "batchscope_store_writes_held_bytes",
        Kind.GAUGE,
        "Estimated size of the writes held in memory.",
        (),
    ),
    Family(
        "batchscope_store_writes_lost_total",
        Kind.COUNTER,
        "Writes that never reached the store since this process started: dropped as "
        "the oldest over the buffer's bound (reason=dropped) or refused by the store "
        "for good (reason=rejected).",
        ("reason",),
    ),
    Family(
        "batchscope_store_outages_total",
        Kind.COUNTER,
        "Times the store stopped taking this process's writes since it started.",
        (),
    ),
    Family(
        "batchscope_build_info",
        Kind.INFO,
        "The running batchscope's version (value 1).",
        ("version",),
    ),
)

_BY_NAME = {f.name: f for f in FAMILIES}


def family(name: str) -> Family:
    """The family named ``name`` (a KeyError names an unknown metric)."""
    return _BY_NAME[name]
