"""The answers the dashboard's reads give: small frozen dataclasses of plain values that
compose the records they show (``collector.records``, ``collector.store`` rows,
``collector.analysis.status``) instead of copying their fields, so a quantity has one
name from the source to the page.

Each answer survives a round trip through ``to_json`` / ``from_json``
(``dashboard.queries.codec``), so a tick callback can put it in a ``dcc.Store`` and a
figure callback can rebuild it. The package re-exports every public name here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from collector.analysis.health import Health, HealthState
from collector.analysis.status import ModelStatus
from collector.records import SEVERITY_ORDER, DeviceSample, HostFacts, Prediction
from collector.store import StoredFinding, StoredModelConfig, StoredRecommendation, TargetState
from collector.store.alerts import AlertState, Notification, Silence

#: The time ranges a model page offers, by their query-string name.
RANGES: Final = {
    "5m": 300.0,
    "15m": 900.0,
    "1h": 3600.0,
    "6h": 6 * 3600.0,
    "24h": 24 * 3600.0,
    "7d": 7 * 24 * 3600.0,
}
DEFAULT_RANGE: Final = "15m"
#: Ranges up to this long are read from raw samples; longer ones from rollups.
RAW_RANGE_S: Final = 3600.0
#: Without any rollup in a long range, at most this much of it is read raw.
RAW_FALLBACK_S: Final = 6 * 3600.0
#: The max queue delays a what-if curve runs over (µs).
WHAT_IF_DELAYS_US: Final = (0, 100, 250, 500, 1000, 2000, 5000, 10000)


def parse_range(name: str | None) -> tuple[str, float]:
    """A range's name and seconds; an unknown or missing name gives the default."""
    if name in RANGES:
        return name, RANGES[name]
    return DEFAULT_RANGE, RANGES[DEFAULT_RANGE]


def is_open(finding: StoredFinding) -> bool:
    """The finding still holds (it has not been resolved)."""
    return finding.resolved_at is None


def severity_rank(severity: str | None) -> int:
    """0 for the most severe; an unknown severity (or none) after every known one."""
    return SEVERITY_ORDER.get(severity or "", len(SEVERITY_ORDER))


# --------------------------------------------------------------------------- overview


@dataclass(frozen=True)
class TargetTile:
    """A target's stored state, its ``health`` judged at the overview's time, how many
    of its models the overview lists, and its machine's facts (``facts.nvml_absent``:
    a host without NVIDIA GPU)."""

    state: TargetState
    models: int
    health: Health | None = None
    facts: HostFacts | None = None

    @property
    def now(self) -> HealthState:
        """Its state now (as last stored, for a tile made without ``health``)."""
        if self.health is not None:
            return self.health.state
        up = self.state.up
        return HealthState.UNKNOWN if up is None else HealthState(("down", "up")[up])


@dataclass(frozen=True)
class ModelRow:
    """One (target, model, version) over the overview's window: its status (rates,
    config, up) and its open findings."""

    status: ModelStatus
    findings: list[StoredFinding] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceTile:
    """One GPU or MIG instance's latest reading. ``utilisation_pct`` is NVML's SM
    activity when known, else the utilisation counter (``metric`` names the field).
    ``weight`` is the share of a whole GPU the tile stands for (1 for a GPU, its
    slice for a MIG instance, 0 for a GPU split into MIG instances, whose capacity
    its instances carry); ``idle_gpus`` is ``weight × (1 − utilisation)``."""

    target: str
    sample: DeviceSample
    utilisation_pct: float | None
    metric: str | None
    weight: float
    idle_gpus: float | None


@dataclass(frozen=True)
class OverviewData:
    """The overview over the ``window_s`` before ``generated_at`` (or why it could not
    be read): targets, model rows, device tiles, and the idle capacity they add up to."""

    generated_at: float
    window_s: float
    error: str | None = None
    last_sample_at: float | None = None  # the newest reading of any kind
    targets: list[TargetTile] = field(default_factory=list)
    models: list[ModelRow] = field(default_factory=list)
    devices: list[DeviceTile] = field(default_factory=list)
    device_findings: list[StoredFinding] = field(default_factory=list)
    idle_gpus: float | None = None  # Σ DeviceTile.idle_gpus, None without readings
    instances_total: int = 0  # model instances with a known busy share
    instances_idle: float | None = None  # Σ instances × (1 − busy share)

    @property
    def empty(self) -> bool:
        """No target has ever been seen (as opposed to: none recently)."""
        return not self.targets and not self.models

    @property
    def down_targets(self) -> list[TargetState]:
        return [t.state for t in self.targets if t.now is HealthState.DOWN]

    @property
    def stale(self) -> bool:
        """No collector has scraped any target lately, so nothing shown is live (a
        target is stale only then: see ``collector.analysis.health``)."""
        return any(t.now is HealthState.STALE for t in self.targets)


# --------------------------------------------------------------------------- a model


@dataclass(frozen=True)
class ModelSeries:
    """A model's rates over a range, column-wise; a ``None`` in every column marks a
    gap (no samples), so lines break there. Each column is one ``ModelRates`` figure
    per point (``requests_per_s``, ``avg_batch_size``, ``fail_per_s``), latencies in
    ms per request (``queue_us_per_request``, ``compute_us_per_request``), and the
    pending-request gauge."""

    bucket_s: float
    source: str  # "raw", "rollup" or "none"
    t: list[float] = field(default_factory=list)
    requests_per_s: list[float | None] = field(default_factory=list)
    avg_batch_size: list[float | None] = field(default_factory=list)
    queue_ms: list[float | None] = field(default_factory=list)
    compute_ms: list[float | None] = field(default_factory=list)
    pending_request_count: list[float | None] = field(default_factory=list)
    fail_per_s: list[float | None] = field(default_factory=list)
    truncated_to_s: float | None = None  # set when a long range was read only in part

    @property
    def empty(self) -> bool:
        return not any(v is not None for v in self.requests_per_s)


@dataclass(frozen=True)
class BatchDistribution:
    """Executions and mean execution time per executed batch size over a range."""

    sizes: list[int] = field(default_factory=list)
    executions: list[int] = field(default_factory=list)
    mean_ms: list[float] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.sizes


@dataclass(frozen=True)
class ServiceTimeView:
    """The fitted ``time(b) = intercept + per_sample × b`` and the points behind it;
    ``per_sample_ms`` is ``None`` when only one batch size was seen."""

    sizes: list[int]
    mean_ms: list[float]
    executions: list[int]
    intercept_ms: float
    per_sample_ms: float | None
    max_batch_size: int | None


@dataclass(frozen=True)
class RecommendationView:
    """A stored recommendation as the pages show it: its ``changes`` as ``[field,
    before, after]`` text, ``current_pbtxt``, the current config's batching fields
    rendered like the proposed ``config_pbtxt``, for a diff, the current figure and
    the model's most severe open finding."""

    stored: StoredRecommendation
    changes: list[list[str]] = field(default_factory=list)
    current_pbtxt: str = ""
    #: The one current and one predicted figure a page shows for it, and the gain
    #: between them (``None``: no gain claimed), all from
    #: ``dashboard.queries.model.shown_figures``.
    current: Prediction | None = None
    predicted: Prediction | None = None
    gain: float | None = None
    #: The most severe open finding of the model (``None``: it has none).
    severity: str | None = None


@dataclass(frozen=True)
class ModelDetail:
    target: str
    model: str
    range_name: str
    since: float
    until: float
    up: bool | None = None
    series: ModelSeries = field(default_factory=lambda: ModelSeries(0.0, "none"))
    distribution: BatchDistribution = field(default_factory=BatchDistribution)
    service_time: ServiceTimeView | None = None
    config: StoredModelConfig | None = None
    findings: list[StoredFinding] = field(default_factory=list)
    recommendation: RecommendationView | None = None
    error: str | None = None

    @property
    def known(self) -> bool:
        """The store has the model at all (a config or a sample)."""
        return self.config is not None or not self.series.empty


@dataclass(frozen=True)
class WhatIfView:
    """The batcher model's predictions for one model at its observed load: one per max
    queue delay in ``delays_us`` for the chosen preferred sizes and instance count, and
    ``current`` for today's config, against the objective (the SLO, or the current p95
    plus a margin)."""

    target: str
    model: str
    preferred: list[int]
    instances: int
    delays_us: list[int] = field(default_factory=list)
    predicted: list[Prediction] = field(default_factory=list)
    current: Prediction | None = None
    objective_p95_ms: float | None = None
    objective: str = ""
    current_delay_us: int | None = None  # None: dynamic batching is off today
    max_batch_size: int | None = None
    max_instances: int = 4
    error: str | None = None


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class EventsView:
    """Events of every kind the store keeps, newest first, with the choices the
    page's filters offer. Today every event is a finding; alert states and
    notification deliveries join as further readers in
    ``dashboard.queries.events.EVENT_READERS``, so the page does not change."""

    events: list[StoredFinding] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    severities: list[str] = field(default_factory=list)
    error: str | None = None


# --------------------------------------------------------------------------- alerts


@dataclass(frozen=True)
class AlertRow:
    """An alert as the alerts page lists it: its stored state, and the silence in force
    that holds its notifications back (``None``: not silenced)."""

    alert: AlertState
    silenced_by: Silence | None = None


@dataclass(frozen=True)
class ReceiverOutbox:
    """One receiver's notifications in the outbox, by delivery state, and why nothing
    is sent to it (``gone_reason``: it answered 410 Gone)."""

    receiver: str
    pending: int = 0
    delivered: int = 0
    dead: int = 0
    gone: int = 0
    gone_reason: str | None = None


@dataclass(frozen=True)
class AlertsView:
    """The alerts page at ``generated_at``: every alert (pending and firing first),
    the silences in force, the outbox per receiver and its latest undelivered
    notifications (``failed``: dead or gone, their bodies left out: the page shows how
    delivery went, not what was posted), and the choices the silence form offers."""

    generated_at: float
    alerts: list[AlertRow] = field(default_factory=list)
    silences: list[Silence] = field(default_factory=list)
    outbox: list[ReceiverOutbox] = field(default_factory=list)
    failed: list[Notification] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def firing(self) -> int:
        return sum(1 for r in self.alerts if r.alert.state == "firing")


# --------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class HeatRow:
    """One row of a utilisation heatmap: a GPU, MIG instance or model-instance
    process, its utilisation (percent) per time bucket (``None``: no reading)."""

    label: str
    kind: str  # "gpu", "mig", "process"
    values: list[float | None]


@dataclass(frozen=True)
class DevicesView:
    range_name: str
    since: float
    until: float
    t: list[float] = field(default_factory=list)  # bucket starts
    devices: list[HeatRow] = field(default_factory=list)  # GPU / MIG utilisation
    processes: list[HeatRow] = field(default_factory=list)  # per model-instance process
    process_metric: str = "CPU % of one core"
    memory_used_gb: list[HeatRow] = field(default_factory=list)
    power_w: list[HeatRow] = field(default_factory=list)
    #: Set when processes were read over only the last this-many seconds of the range.
    process_window_s: float | None = None
    #: Set when a long range without rollups was read raw over only its last part.
    devices_truncated_to_s: float | None = None
    #: Hosts without NVIDIA GPU (no NVML library or driver): name -> the reason.
    no_gpu_hosts: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def empty(self) -> bool:
        return not self.devices and not self.processes
