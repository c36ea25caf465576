"""Typed rows the store hands back: what it knows beyond the records themselves
(which target, when it was collected) around the record from ``collector.records``.

Every row is a frozen dataclass; times are Unix seconds (float, UTC); a value the
store does not have is ``None``. Nothing here touches SQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collector import records

__all__ = [
    "RECOMMENDATION_OUTCOMES",
    "RECOMMENDATION_STATUSES",
    "DetectorStreak",
    "DeviceRollup",
    "ModelRollup",
    "ProcessBucket",
    "RetentionReport",
    "ScrapeRecord",
    "StoredDevice",
    "StoredFinding",
    "StoredModelConfig",
    "StoredProcess",
    "StoredRecommendation",
    "StoreOutage",
    "StoredServer",
    "TargetState",
    "TargetTransition",
]


@dataclass(frozen=True)
class TargetState:
    """What the store knows about one target's health.

    ``up`` is ``None`` until the target's first scrape that decides it (see
    ``Store.record_scrape``). ``sources`` maps each source that ever scraped the target
    to whether its latest scrape succeeded. ``last_seen_at`` is the start of the latest
    successful deciding scrape; ``last_scrape_at`` / ``last_duration_s`` describe the
    latest deciding scrape, successful or not. ``interval_s`` is the scrape interval
    of the collector that scraped it last (``None`` before intervals were kept);
    ``collector.analysis.health.target_health`` judges from these whether the target
    is up *now*. ``url`` and ``metrics_url`` are where a collector scrapes a Triton
    target (``None`` for a host, or before they were kept).
    """

    name: str
    kind: str
    up: bool | None
    consecutive_failures: int = 0
    last_error_kind: str | None = None
    last_error: str | None = None
    last_seen_at: float | None = None
    last_scrape_at: float | None = None
    last_duration_s: float | None = None
    server_version: str | None = None
    interval_s: float | None = None
    url: str | None = None
    metrics_url: str | None = None
    sources: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class ScrapeRecord:
    """One scrape of ``target`` by ``source``, as ``Store.record_scrape`` and
    ``Store.write_scrape`` keep it: it succeeded when ``error_kind`` is ``None``.

    ``interval_s`` is how often the scraping collector scrapes; ``first_in_run`` marks
    the first scrape of this source by a collector that just started."""

    target: str
    source: str
    kind: str
    started_at: float
    duration_s: float
    error_kind: str | None = None
    error: str | None = None
    interval_s: float | None = None
    first_in_run: bool = False


@dataclass(frozen=True)
class TargetTransition:
    """A (target, source) went up or down at ``at`` (or was scraped for the first time)."""

    target: str
    source: str
    at: float
    up: bool
    error_kind: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class _Collected:
    """Where and when the record of a stored row was collected."""

    target: str
    collected_at: float


@dataclass(frozen=True)
class StoredModelConfig(_Collected):
    """A model's config as first seen at ``collected_at`` (a row exists per change)."""

    config: records.ModelConfig

    @property
    def model(self) -> str:
        return self.config.model


@dataclass(frozen=True)
class StoredDevice(_Collected):
    sample: records.DeviceSample


@dataclass(frozen=True)
class StoredProcess(_Collected):
    sample: records.ProcessSample


@dataclass(frozen=True, kw_only=True)
class ProcessBucket(records.ProcessSample):
    """One process's readings averaged over one time bucket (``bucket`` counts
    buckets from the start of the read): a ``ProcessSample`` of the means of its
    ``cpu_pct`` and ``sm_util_pct`` (``None`` when no sample had the reading; the
    other readings are not kept)."""

    target: str
    bucket: int
    sample_count: int


@dataclass(frozen=True)
class StoredServer(_Collected):
    metrics: records.ServerMetrics


@dataclass(frozen=True)
class ModelRollup:
    """One closed bucket ``[bucket_start, bucket_start + bucket_s)`` of one (model,
    version)'s raw samples.

    ``rates`` are the rates over the windows of the bucket's rated scrapes, merged by
    ``collector.analysis.rates.merge_over_time`` (``rates.window_s`` is the time they
    cover), ``peaks`` the highest per-scrape figures; both ``None`` when no scrape in
    the bucket had rates (the first scrape of a series has none). The pending-request
    gauge is a plain mean and a maximum over every scrape that had it.
    """

    target: str
    model: str
    version: str
    bucket_start: float
    bucket_s: float
    sample_count: int
    rates: records.ModelRates | None = None
    peaks: records.ModelPeaks | None = None
    pending_request_count: float | None = None
    pending_request_count_max: float | None = None


@dataclass(frozen=True)
class DeviceRollup:
    """One closed bucket of one device's raw samples: ``mean`` holds the plain means
    of the readings a rollup keeps (over the samples that had them), ``peak`` the
    maxima of some of them (see ``schema.DEVICE_MEAN_READINGS`` and
    ``DEVICE_PEAK_READINGS``); both name the device, and leave every other reading
    ``None``."""

    target: str
    bucket_start: float
    bucket_s: float
    sample_count: int
    mean: records.DeviceSample
    peak: records.DeviceSample

    @property
    def source(self) -> str:
        return self.mean.source

    @property
    def uuid(self) -> str:
        return self.mean.uuid

    @property
    def kind(self) -> str:
        return self.mean.kind


@dataclass(frozen=True)
class RetentionReport:
    """Rows deleted by one ``Store.apply_retention`` call, per table."""

    model_samples: int = 0
    batch_stats: int = 0  # entries of the deleted model samples (kept in their rows)
    server_samples: int = 0
    device_samples: int = 0
    process_samples: int = 0
    model_rollups: int = 0
    device_rollups: int = 0

    @property
    def total(self) -> int:
        return (
            self.model_samples
            + self.batch_stats
            + self.server_samples
            + self.device_samples
            + self.process_samples
            + self.model_rollups
            + self.device_rollups
        )


@dataclass(frozen=True, kw_only=True)
class StoredFinding(records.Finding):
    """A stored ``Finding``: its id, when it was stored and when it was resolved
    (``None`` while it holds)."""

    id: int
    created_at: float
    resolved_at: float | None = None


@dataclass(frozen=True)
class DetectorStreak:
    """How many consecutive evaluations a detector's condition on one (kind, target,
    subject) has held or been clear: the hysteresis state of ``collector.analysis.detect``.

    ``since`` is the start of the window in which the current holding streak began
    (``None`` while it is not holding); ``evaluated_at`` is the ``now`` of the latest
    evaluation that counted.
    """

    kind: str
    target: str
    subject: str
    holding: int = 0
    clearing: int = 0
    since: float | None = None
    evaluated_at: float = 0.0

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.target, self.subject)


#: What an apply may record about a recommendation.
RECOMMENDATION_OUTCOMES = ("applied", "kept", "rolled_back", "failed")
#: ``"open"`` until an outcome is recorded.
RECOMMENDATION_STATUSES = ("open", *RECOMMENDATION_OUTCOMES)


@dataclass(frozen=True)
class StoredRecommendation:
    """A stored ``Recommendation`` and what became of it: ``status`` is ``"open"``
    until an apply records ``"applied"``, ``"kept"``, ``"rolled_back"`` or ``"failed"``
    at ``applied_at`` with its ``verification`` figures."""

    id: int
    recommendation: records.Recommendation
    status: str = "open"
    applied_at: float | None = None
    verification: dict[str, Any] | None = None

    @property
    def target(self) -> str:
        return self.recommendation.target

    @property
    def model(self) -> str:
        return self.recommendation.model

    @property
    def created_at(self) -> float:
        return self.recommendation.created_at

    @property
    def kind(self) -> str:
        """``"tune"``, ``"probe"`` or ``"no_change"``."""
        return self.recommendation.kind

    @property
    def confidence(self) -> float:
        return self.recommendation.confidence


@dataclass(frozen=True)
class StoreOutage:
    """A time the store could not take the collector's writes (locked, disk full,
    unreachable), from its first failed write to the last held one written: how many
    writes were held in memory, written later, and dropped (the oldest, over the
    bound ``store_buffer_max_writes`` / ``_bytes``); ``reason`` is the store's error."""

    started_at: float
    ended_at: float
    held: int
    written: int
    dropped: int
    reason: str
