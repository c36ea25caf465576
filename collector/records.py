"""Typed records that sources, the store, analysis and presentation exchange.

This module is a leaf: it imports nothing from batchscope. Every record is a frozen
dataclass; units are part of the field names; a reading that the target does not
provide is ``None`` (never 0, never a string such as "N/A").

Timestamps are Unix seconds (float, UTC).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field, fields
from typing import Any, Final, TypeVar, cast

__all__ = [
    "MODEL_COUNTERS",
    "SEVERITY_ORDER",
    "BatchStat",
    "BatcherConfig",
    "ConfigChange",
    "Finding",
    "Prediction",
    "Recommendation",
    "DeviceSample",
    "Duration",
    "ModelConfig",
    "ModelMetrics",
    "ModelSample",
    "HostFacts",
    "ModelPeaks",
    "ModelRates",
    "ModelStats",
    "ProcessSample",
    "QueuePolicy",
    "ScrapeHealth",
    "ServerMetrics",
    "TritonSnapshot",
    "build_record",
]


_R = TypeVar("_R")
_new_object = object.__new__
_NOT_DIRECT: frozenset[str] = frozenset()


def build_record(cls: type[_R], values: dict[str, Any]) -> _R:
    """``cls(**values)`` for a dataclass ``cls``; when ``values`` holds every field of
    a dataclass without ``__post_init__`` or slots, made by filling the record's
    ``__dict__`` instead: the same record (equality, hash, pickling, still frozen) at
    less than half the CPU of the frozen ``__init__``, which sets each field through
    ``object.__setattr__`` -- it shows when thousands of records are made at once."""
    if values.keys() != _directly_made_fields(cast(type, cls)):
        return cls(**values)
    record = _new_object(cls)
    record.__dict__.update(values)
    return record


@functools.cache
def _directly_made_fields(cls: type) -> frozenset[str]:
    """The fields of ``cls`` when ``build_record`` may fill its ``__dict__``; else none."""
    direct = (
        not hasattr(cls, "__post_init__")
        and "__slots__" not in vars(cls)
        and all(f.init for f in fields(cls))
    )
    return frozenset(f.name for f in fields(cls)) if direct else _NOT_DIRECT


# --------------------------------------------------------------------------- Triton

# Marks a field of ``ModelMetrics`` as a cumulative counter that rates are made of.
_COUNTER = {"counter": True}


@dataclass(frozen=True)
class ModelMetrics:
    """The ``nv_inference_*`` and ``nv_cache_*`` families of one (model, version),
    summed over ``gpu_uuid`` (Triton splits execution series per GPU)."""

    model: str
    version: str
    request_success: float = field(default=0.0, metadata=_COUNTER)
    request_failure_by_reason: dict[str, float] = field(default_factory=dict)
    inference_count: float = field(default=0.0, metadata=_COUNTER)
    exec_count: float = field(default=0.0, metadata=_COUNTER)
    request_duration_us: float = field(default=0.0, metadata=_COUNTER)
    queue_duration_us: float = field(default=0.0, metadata=_COUNTER)
    compute_input_duration_us: float = field(default=0.0, metadata=_COUNTER)
    compute_infer_duration_us: float = field(default=0.0, metadata=_COUNTER)
    compute_output_duration_us: float = field(default=0.0, metadata=_COUNTER)
    pending_request_count: float | None = None
    cache_hit_count: float | None = None
    cache_miss_count: float | None = None
    cache_hit_duration_us: float | None = None
    cache_miss_duration_us: float | None = None
    load_duration_s: float | None = None
    # Optional summary families (``--metrics-config summary_latencies=true``):
    # family name -> {quantile -> value in µs}; ``_count``/``_sum`` are not kept.
    summary_quantiles_us: dict[str, dict[float, float]] = field(default_factory=dict)
    # Optional histogram families (``histogram_latencies=true``, e.g.
    # ``nv_inference_first_response_histogram_ms``): family name -> {upper bound ``le``
    # (``inf`` for +Inf) -> cumulative count}, summed over series.
    histogram_buckets: dict[str, dict[float, float]] = field(default_factory=dict)

    @property
    def request_failure(self) -> float:
        return sum(self.request_failure_by_reason.values())


#: The cumulative counters of ``ModelMetrics`` (failures by reason aside, a mapping):
#: ``collector.analysis.rates`` turns their increases into rates.
MODEL_COUNTERS: tuple[str, ...] = tuple(
    f.name for f in fields(ModelMetrics) if f.metadata.get("counter")
)


@dataclass(frozen=True)
class Duration:
    """A statistics-API ``duration_stat``: a count and total nanoseconds."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True)
class BatchStat:
    """Cumulative executions and time at one *executed* batch size."""

    batch_size: int
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()

    @property
    def exec_count(self) -> int:
        return self.compute_infer.count

    @property
    def compute_ns(self) -> int:
        return self.compute_input.ns + self.compute_infer.ns + self.compute_output.ns

    @functools.cached_property
    def figures(self) -> tuple[int, ...]:
        """This entry as plain numbers (``BATCH_STAT_FIGURES``), read once per record:
        the store and the rates both read every entry of every scrape, and an entry
        that did not change keeps its record from one scrape to the next."""
        return _batch_stat_figures(self)


#: A ``BatchStat`` as plain numbers, in this order: the batch size, then each duration's
#: count and nanoseconds (attribute paths). The store keeps each size's entry so and the
#: rates read it so; the execution count of a batch size is ``compute_infer.count``.
BATCH_STAT_FIGURES = (
    "batch_size",
    "compute_input.count",
    "compute_input.ns",
    "compute_infer.count",
    "compute_infer.ns",
    "compute_output.count",
    "compute_output.ns",
)
_batch_stat_figures = operator.attrgetter(*BATCH_STAT_FIGURES)


@dataclass(frozen=True)
class ModelStats:
    """One entry of ``GET /v2/models/stats`` (cumulative since the model loaded)."""

    model: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    cache_hit: Duration = Duration()
    cache_miss: Duration = Duration()
    batch_stats: tuple[BatchStat, ...] = ()


@dataclass(frozen=True)
class QueuePolicy:
    timeout_action: str = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """The batching-relevant part of a model's effective config
    (``GET /v2/models/NAME/config``); ``raw_json`` keeps the whole document so a
    change can be sent back complete."""

    model: str
    max_batch_size: int = 0
    dynamic_batching: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    priority_levels: int = 0
    default_queue_policy: QueuePolicy | None = None
    instance_count: int = 1
    instance_kind: str = "KIND_AUTO"
    backend: str | None = None
    platform: str | None = None
    raw_json: str = "{}"


@dataclass(frozen=True)
class ServerMetrics:
    """Server-wide, per-interval families (``nv_cpu_*``, ``nv_pinned_*``)."""

    cpu_utilization: float | None = None  # ratio 0..1 over all cores
    cpu_memory_total_bytes: float | None = None
    cpu_memory_used_bytes: float | None = None
    pinned_memory_pool_total_bytes: float | None = None
    pinned_memory_pool_used_bytes: float | None = None


# --------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class DeviceSample:
    """One GPU or MIG instance, read once per tick.

    ``source`` says who measured it: ``"nvml"`` (our own NVML reading) or ``"triton"``
    (Triton's ``nv_gpu_*`` families). ``kind`` is ``"gpu"`` or ``"mig"``; a MIG
    instance names its parent GPU in ``parent_uuid``.
    """

    source: str
    uuid: str
    kind: str = "gpu"
    index: int | None = None
    name: str | None = None
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    utilization_gpu_pct: float | None = None  # time share with >=1 kernel running
    utilization_memory_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None
    sm_clock_mhz: int | None = None
    sm_active_pct: float | None = None  # GPM SM_UTIL: share of SMs busy
    sm_occupancy_pct: float | None = None  # GPM SM_OCCUPANCY
    tensor_active_pct: float | None = None  # GPM ANY_TENSOR_UTIL
    healthy: bool = True
    error: str | None = None


@dataclass(frozen=True)
class ProcessSample:
    """One process on the host: the Triton server, a Python-backend stub (one per
    model instance), or a GPU process seen by NVML.

    ``role`` is ``"server"``, ``"stub"`` or ``"gpu"``. CPU share is percent of one
    core over the last tick (``None`` on the first tick of a pid).
    """

    source: str
    pid: int
    role: str
    model: str | None = None
    instance_name: str | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    gpu_uuid: str | None = None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    gpu_memory_bytes: int | None = None


@dataclass(frozen=True)
class HostFacts:
    """Facts about the machine a target runs on, read by the host source once per tick
    (the analysis must not use the facts of whatever machine runs batchscope), and by
    the NVML source about its own host.

    ``nvml_absent`` is set by the NVML source when the host has no NVML library or
    driver, i.e. no NVIDIA GPU it could read: the reason, in words. It is a fact about
    the host, not a failure; ``None`` when NVML is there or was not asked."""

    target: str
    collected_at: float
    cpu_count: int
    nvml_absent: str | None = None


# --------------------------------------------------------------------------- envelopes


@dataclass(frozen=True)
class TritonSnapshot:
    """Everything one scrape of one Triton target returned."""

    target: str
    collected_at: float
    server_version: str | None = None
    model_metrics: tuple[ModelMetrics, ...] = ()
    model_stats: tuple[ModelStats, ...] = ()
    model_configs: tuple[ModelConfig, ...] = ()
    gpus: tuple[DeviceSample, ...] = ()
    server: ServerMetrics | None = None
    # Parts that failed while the rest succeeded, e.g. {"config:mlp": "HTTP 400 ..."}.
    partial_errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ScrapeHealth:
    """How another scraper fared at its latest scrape of a Triton target: in fleet mode
    Prometheus scrapes the servers and its ``up`` series says whether each answered.

    ``source`` is the batchscope source that read it (``"prometheus"``);
    ``scraped_at`` when that scrape started (the sample's own timestamp, not when
    batchscope asked); ``interval_s`` how often the target is looked at, at least the
    collector's interval, so a slower scraper does not make the target look stale."""

    target: str
    source: str
    scraped_at: float
    up: bool
    duration_s: float = 0.0
    interval_s: float | None = None
    error: str | None = None


# --------------------------------------------------------------------------- derived


@dataclass(frozen=True)
class ModelRates:
    """Per-window rates of one (model, version), derived from two or more counter
    samples; a counter reset inside the window starts a new segment (see
    ``collector.analysis.rates``)."""

    window_s: float
    requests_per_s: float
    inferences_per_s: float
    executions_per_s: float
    fail_per_s: float
    fail_per_s_by_reason: dict[str, float] = field(default_factory=dict)
    avg_batch_size: float | None = None
    queue_us_per_request: float | None = None
    compute_input_us_per_request: float | None = None
    compute_infer_us_per_request: float | None = None
    compute_output_us_per_request: float | None = None
    request_us_per_request: float | None = None
    queue_share: float | None = None
    busy_share: float | None = None  # Σ batch compute time / (window × instances)
    resets: int = 0

    @property
    def in_server(self) -> float:
        """Mean number of requests inside the server (Little's law: λ × W)."""
        if self.request_us_per_request is None:
            return 0.0
        return self.requests_per_s * self.request_us_per_request / 1e6

    @property
    def failed_share(self) -> float | None:
        """Failed requests / all finished requests over the window; ``None`` without any.
        (``requests_per_s`` counts successes only, as Triton's ``request_success``.)"""
        total = self.requests_per_s + self.fail_per_s
        return self.fail_per_s / total if total > 0 else None

    @property
    def compute_us_per_request(self) -> float | None:
        """Input + infer + output time per request; ``None`` when none of them is known."""
        parts = [
            v
            for v in (
                self.compute_input_us_per_request,
                self.compute_infer_us_per_request,
                self.compute_output_us_per_request,
            )
            if v is not None
        ]
        return sum(parts) if parts else None


@dataclass(frozen=True)
class ModelPeaks:
    """The highest per-scrape rates of one (model, version) within a window (a rollup
    bucket); ``None`` when no scrape in it had the figure."""

    requests_per_s: float | None = None
    avg_batch_size: float | None = None
    queue_us_per_request: float | None = None
    request_us_per_request: float | None = None
    queue_share: float | None = None
    busy_share: float | None = None


@dataclass(frozen=True)
class ModelSample:
    """One scrape of one (model, version) on one target: the raw counters from the
    metrics endpoint and the statistics API, and the rates since the previous scrape
    (``None`` for the first scrape of a series)."""

    target: str
    collected_at: float
    metrics: ModelMetrics
    stats: ModelStats | None = None
    rates: ModelRates | None = None

    @property
    def model(self) -> str:
        return self.metrics.model

    @property
    def version(self) -> str:
        return self.metrics.version


# --------------------------------------------------------------------------- analysis


#: Finding severities, most severe first: the order the findings page lists them in,
#: in Python (``dashboard.queries.views.severity_rank``) and in SQL (the store's).
SEVERITY_ORDER: Final = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """Something the detectors concluded about a window.

    ``kind``: ``"idle_capacity"``, ``"queue_saturation"``, ``"batching_off"``,
    ``"batch_below_preferred"``, ``"config_applied"`` (before/after of an applied change)
    ... ``severity``: ``"info"``, ``"warning"`` or ``"critical"``. ``subject`` is the
    model name or the device uuid. ``evidence`` holds the numbers behind the summary,
    with units in the keys (``queue_share``, ``sm_active_pct``, ``idle_instances``).
    """

    kind: str
    severity: str
    target: str
    subject: str
    summary: str
    window_start: float
    window_end: float
    evidence: dict[str, float | int | str | bool | None] = field(default_factory=dict)


@dataclass(frozen=True)
class BatcherConfig:
    """The part of a model config that decides how requests become executions."""

    max_batch_size: int
    dynamic_batching: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    instance_count: int = 1
    max_queue_size: int = 0  # 0 = unbounded
    default_timeout_us: int = 0  # 0 = no queue timeout
    timeout_action: str = "REJECT"

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> BatcherConfig:
        policy = config.default_queue_policy
        return cls(
            max_batch_size=config.max_batch_size,
            dynamic_batching=config.dynamic_batching,
            preferred_batch_sizes=tuple(config.preferred_batch_sizes),
            max_queue_delay_us=config.max_queue_delay_us,
            instance_count=max(config.instance_count, 1),
            max_queue_size=policy.max_queue_size if policy else 0,
            default_timeout_us=policy.default_timeout_us if policy else 0,
            timeout_action=policy.timeout_action if policy else "REJECT",
        )


@dataclass(frozen=True)
class ConfigChange:
    """One field of the config, ``field: before -> after``."""

    field: str
    before: object
    after: object

    def __str__(self) -> str:
        return f"{self.field}: {self.before} -> {self.after}"


@dataclass(frozen=True)
class Prediction:
    """Throughput and latency of one config under one load (observed or predicted).
    Latencies are as a client sees them (server time plus the client's own overhead)."""

    qps: float
    p95_ms: float | None  # None when it cannot be known (no summary, no model yet)
    p50_ms: float | None = None
    avg_batch_size: float | None = None
    busy_share: float | None = None


@dataclass(frozen=True)
class Recommendation:
    """A concrete config change for one model, with what it is predicted to gain.

    ``kind`` is ``"tune"`` (a change fitted to observed batch_stats), ``"probe"`` (a
    safe first step, e.g. dynamic batching with no delay, taken because batch_stats
    cannot yet show how the model scales with batch size) or ``"no_change"`` (the
    current config is already the best the model found; ``reason`` says why).
    """

    target: str
    model: str
    created_at: float
    kind: str
    changes: tuple[ConfigChange, ...]
    current_config: BatcherConfig
    proposed_config: BatcherConfig
    current: Prediction  # observed
    predicted: Prediction  # for the proposed config at the observed load
    confidence: float  # 0..1
    reason: str
    slo_p95_ms: float | None = None
    config_pbtxt: str = ""
    config_json: str = "{}"  # the whole config for Triton's load API
    evidence: dict[str, float | int | str | bool | None] = field(default_factory=dict)
