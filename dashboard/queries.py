"""Everything the dashboard reads, and the only module of ``dashboard`` that imports
``collector.store``.

``DashboardQueries`` wraps one ``Store`` and answers with small frozen dataclasses
(``OverviewData``, ``ModelDetail`` and their parts) whose fields are plain values, so
a tick callback can put them in a ``dcc.Store`` (``to_json``) and a figure callback
can rebuild them (``from_json``) without knowing how they were read.

Reads are bounded: the overview reads one status window; a model page reads one
model over one range, from raw samples up to ``RAW_RANGE_S`` and from rollups (plus
the raw tail not rolled up yet) beyond, downsampled to at most ``max_points``
points. Nothing here raises on a database failure: each answer carries ``error``
(a one-line message for the banner) and the exception is logged.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import types
import typing
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, Final, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from collector.analysis.configs import render_pbtxt
from collector.analysis.fit import fit_service_time
from collector.analysis.rates import (
    CounterIncrease,
    batch_stats_increase,
    counter_increase,
    rates_from_increase,
    stats_reset,
)
from collector.analysis.recommend import (
    BatcherModel,
    RecommendSettings,
    batcher_model,
    observe_model,
    recommendation_from_dict,
)
from collector.analysis.status import build_status
from collector.errors import ConfigError
from collector.records import BatcherConfig, BatchStat, DeviceSample, Duration, ModelSample
from collector.store import DeviceRollup, ModelRollup, Store, StoredFinding, StoredRecommendation

__all__ = [
    "DEFAULT_RANGE",
    "RANGES",
    "RAW_RANGE_S",
    "BatchDistribution",
    "ConfigView",
    "DashboardQueries",
    "DeviceTile",
    "DevicesView",
    "EventsView",
    "HeatRow",
    "FindingView",
    "ModelDetail",
    "ModelRow",
    "ModelSeries",
    "OverviewData",
    "RecommendationView",
    "ServiceTimeView",
    "TargetTile",
    "WhatIfView",
    "from_json",
    "parse_range",
    "to_json",
]

log = logging.getLogger("batchscope.dashboard")

#: The time ranges a model page offers, by their query-string name.
RANGES: Final = {"5m": 300.0, "15m": 900.0, "1h": 3600.0, "6h": 6 * 3600.0,
                 "24h": 24 * 3600.0, "7d": 7 * 24 * 3600.0}
DEFAULT_RANGE: Final = "15m"
#: Ranges up to this long are read from raw samples; longer ones from rollups.
RAW_RANGE_S: Final = 3600.0
#: Without any rollup in a long range, at most this much of it is read raw.
RAW_FALLBACK_S: Final = 6 * 3600.0
# Raw reads start this much before the range, so the first pair has a predecessor.
_LEAD_S: Final = 60.0
# Batch stats of a long range: the sample nearest each end within this much.
_EDGE_S: Final = 300.0
#: A what-if reuses a calibrated batcher model this long.
WHAT_IF_MODEL_TTL_S: Final = 60.0
#: The max queue delays a what-if curve runs over (µs).
WHAT_IF_DELAYS_US: Final = (0, 100, 250, 500, 1000, 2000, 5000, 10000)
_WHAT_IF_SETTINGS: Final = RecommendSettings(window_s=30.0)
# A sample pair spanning more scrape intervals than this is drawn as a gap.
_GAP_INTERVALS: Final = 3.0

_T = TypeVar("_T")


def parse_range(name: str | None) -> tuple[str, float]:
    """A range's name and seconds; an unknown or missing name gives the default."""
    if name in RANGES:
        return name, RANGES[name]
    return DEFAULT_RANGE, RANGES[DEFAULT_RANGE]


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class FindingView:
    """A finding as the pages show it; ``active`` while it is not resolved."""

    id: int
    kind: str
    severity: str
    target: str
    subject: str
    summary: str
    window_start: float
    window_end: float
    created_at: float
    resolved_at: float | None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.resolved_at is None


@dataclass(frozen=True)
class TargetTile:
    name: str
    kind: str
    up: bool | None
    last_error: str | None
    last_seen_at: float | None
    consecutive_failures: int
    models: int


@dataclass(frozen=True)
class ModelRow:
    """One (target, model, version) over the overview's window (from ``build_status``)."""

    target: str
    model: str
    version: str
    up: bool
    qps: float | None
    avg_batch_size: float | None
    max_batch_size: int | None
    preferred_batch_sizes: list[int]
    dynamic_batching: bool | None
    queue_share: float | None
    busy_share: float | None
    pending: float | None
    fail_per_s: float | None
    instance_count: int | None
    last_sample_at: float
    findings: list[FindingView] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceTile:
    """One GPU or MIG instance. ``utilisation_pct`` is NVML's SM activity when known,
    else the utilisation counter (``metric`` says which). ``weight`` is the share of
    a whole GPU the tile stands for (1 for a GPU, its slice for a MIG instance, 0 for
    a GPU split into MIG instances, whose capacity its instances carry); ``idle_gpus``
    is ``weight × (1 − utilisation)``."""

    target: str
    uuid: str
    kind: str
    name: str | None
    source: str
    utilisation_pct: float | None
    metric: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_w: float | None
    healthy: bool
    weight: float
    idle_gpus: float | None
    parent_uuid: str | None = None  # a MIG instance's GPU


@dataclass(frozen=True)
class OverviewData:
    generated_at: float
    window_s: float
    targets: list[TargetTile] = field(default_factory=list)
    models: list[ModelRow] = field(default_factory=list)
    devices: list[DeviceTile] = field(default_factory=list)
    device_findings: list[FindingView] = field(default_factory=list)
    idle_gpus: float | None = None  # Σ DeviceTile.idle_gpus, None without readings
    instances_total: int = 0  # model instances with a known busy share
    instances_idle: float | None = None  # Σ instances × (1 − busy share)
    last_sample_at: float | None = None
    error: str | None = None

    @property
    def empty(self) -> bool:
        """No target has ever been seen (as opposed to: none recently)."""
        return not self.targets and not self.models

    @property
    def down_targets(self) -> list[TargetTile]:
        return [t for t in self.targets if t.up is False]


@dataclass(frozen=True)
class ModelSeries:
    """A model's rates over a range, column-wise; a ``None`` in every column marks a
    gap (no samples), so lines break there. Latencies are per request, in ms;
    ``compute_ms`` is input + infer + output."""

    bucket_s: float
    source: str  # "raw", "rollup" or "none"
    t: list[float] = field(default_factory=list)
    qps: list[float | None] = field(default_factory=list)
    avg_batch_size: list[float | None] = field(default_factory=list)
    queue_ms: list[float | None] = field(default_factory=list)
    compute_ms: list[float | None] = field(default_factory=list)
    pending: list[float | None] = field(default_factory=list)
    fail_per_s: list[float | None] = field(default_factory=list)
    truncated_to_s: float | None = None  # set when a long range was read only in part

    @property
    def empty(self) -> bool:
        return not any(v is not None for v in self.qps)


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
class ConfigView:
    model: str
    collected_at: float
    max_batch_size: int
    dynamic_batching: bool
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    instance_count: int
    instance_kind: str
    backend: str | None
    platform: str | None
    raw_json: str  # pretty-printed


@dataclass(frozen=True)
class RecommendationView:
    id: int
    created_at: float
    status: str
    kind: str
    reason: str
    confidence: float
    changes: list[list[str]]  # [field, before, after], as text
    current_qps: float | None
    current_p95_ms: float | None
    predicted_qps: float | None
    predicted_p95_ms: float | None
    config_pbtxt: str
    applied_at: float | None = None
    target: str = ""
    model: str = ""
    current_pbtxt: str = ""  # the same fields as config_pbtxt, for the current config
    slo_p95_ms: float | None = None
    verification: dict[str, Any] | None = None
    # The proposed batching, for a what-if to start from.
    proposed_delay_us: int = 0
    proposed_preferred: list[int] = field(default_factory=list)
    proposed_instances: int = 1
    max_batch_size: int | None = None


@dataclass(frozen=True)
class WhatIfView:
    """The batcher model's predictions for one model at its observed load: QPS and
    p95 for each max queue delay, with the chosen preferred sizes and instance count,
    against the objective (the SLO, or the current p95 plus 10 %)."""

    target: str
    model: str
    preferred: list[int]
    instances: int
    delays_us: list[int] = field(default_factory=list)
    qps: list[float] = field(default_factory=list)
    p95_ms: list[float | None] = field(default_factory=list)
    objective_p95_ms: float | None = None
    objective: str = ""
    current_qps: float | None = None
    current_p95_ms: float | None = None
    current_delay_us: int | None = None
    max_batch_size: int | None = None
    max_instances: int = 4
    error: str | None = None


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
    config: ConfigView | None = None
    findings: list[FindingView] = field(default_factory=list)
    recommendation: RecommendationView | None = None
    error: str | None = None

    @property
    def known(self) -> bool:
        """The store has the model at all (a config or a sample)."""
        return self.config is not None or not self.series.empty


# --------------------------------------------------------------------------- JSON


def to_json(value: Any) -> Any:
    """A dataclass answer as JSON-ready dicts and lists (for a ``dcc.Store``)."""
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def from_json(cls: type[_T], data: Any) -> _T:
    """Rebuild an answer of type ``cls`` from ``to_json``'s output."""
    return typing.cast(_T, _build(cls, data))


def _build(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(options[0], data) if len(options) == 1 else data
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return [_build(item, v) for v in data]
    if isinstance(tp, type) and is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _build(hints[f.name], data[f.name])
                     for f in fields(tp) if f.name in data})
    return data


# --------------------------------------------------------------------------- the queries


class DashboardQueries:
    """The dashboard's reads over the store at ``store_url``.

    The store is opened on first use and reopened after a failure to open, so a
    dashboard started before its database answers comes up with a banner and
    recovers by itself. Safe to share between threads (each ``Store`` call has its
    own session).
    """

    def __init__(self, store_url: str, *,
                 store_factory: Callable[[str], Store] = Store,
                 clock: Callable[[], float] = time.time,
                 slo_p95_ms: dict[str, float] | None = None) -> None:
        self._url = store_url
        self._factory = store_factory
        self._clock = clock
        self._store: Store | None = None
        self._lock = threading.Lock()
        self._slo = dict(slo_p95_ms or {})
        # (target, model) -> (built at, model): calibrating one takes seconds, so a
        # what-if slider reuses it for WHAT_IF_MODEL_TTL_S.
        self._models: dict[tuple[str, str], tuple[float, BatcherModel | None]] = {}
        # Curves drawn from the current model, so moving only the delay is instant.
        self._curves: dict[tuple[Any, ...], tuple[BatcherModel, WhatIfView]] = {}

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _open(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = self._factory(self._url)
            return self._store

    def _guard(self, what: str, read: Callable[[Store], _T], failed: Callable[[str], _T]) -> _T:
        try:
            return read(self._open())
        except (ConfigError, SQLAlchemyError, OSError) as err:
            log.warning("dashboard: %s failed: %s", what, _one_line(err), exc_info=True)
            return failed(_store_error(err))

    # ------------------------------------------------------------------ overview

    def overview(self, *, window_s: float = 60.0, now: float | None = None) -> OverviewData:
        """Every target, every model row and every device over the latest window."""
        at = self._clock() if now is None else now
        return self._guard(
            "overview", lambda store: _overview(store, window_s=window_s, now=at),
            lambda error: OverviewData(generated_at=at, window_s=window_s, error=error))

    # ------------------------------------------------------------------ one model

    def model_detail(self, target: str, model: str, *, range_name: str | None = None,
                     now: float | None = None, max_points: int = 240) -> ModelDetail:
        """Everything a model page shows, from one pass over the store."""
        name, seconds = parse_range(range_name)
        until = self._clock() if now is None else now
        since = until - seconds

        def read(store: Store) -> ModelDetail:
            series, distribution = _series_and_distribution(
                store, target, model, since, until, max_points=max_points)
            config = _config_view(store, target, model)
            up = next((t.up for t in store.targets() if t.name == target), None)
            return ModelDetail(
                target=target, model=model, range_name=name, since=since, until=until, up=up,
                series=series, distribution=distribution,
                service_time=_service_time(distribution,
                                           config.max_batch_size if config else None),
                config=config, findings=_model_findings(store, target, model, since),
                recommendation=_latest_recommendation(store, target, model))

        return self._guard(
            f"model page of {model!r} on {target!r}", read,
            lambda error: ModelDetail(target=target, model=model, range_name=name,
                                      since=since, until=until, error=error))

    def model_series(self, target: str, model: str, *, since: float, until: float,
                     max_points: int = 240) -> ModelSeries:
        return self._guard(
            "model series",
            lambda s: _series_and_distribution(s, target, model, since, until,
                                               max_points=max_points)[0],
            lambda _error: ModelSeries(0.0, "none"))

    def batch_distribution(self, target: str, model: str, *, since: float,
                           until: float) -> BatchDistribution:
        return self._guard(
            "batch distribution",
            lambda s: _series_and_distribution(s, target, model, since, until)[1],
            lambda _error: BatchDistribution())

    def service_time(self, target: str, model: str, *, since: float,
                     until: float) -> ServiceTimeView | None:
        def read(store: Store) -> ServiceTimeView | None:
            distribution = _series_and_distribution(store, target, model, since, until)[1]
            config = _config_view(store, target, model)
            return _service_time(distribution, config.max_batch_size if config else None)

        return self._guard("service time", read, lambda _error: None)

    def findings(self, target: str, model: str, *, since: float) -> list[FindingView]:
        return self._guard("findings", lambda s: _model_findings(s, target, model, since),
                           lambda _error: [])

    def latest_recommendation(self, target: str, model: str) -> RecommendationView | None:
        return self._guard("recommendation", lambda s: _latest_recommendation(s, target, model),
                           lambda _error: None)

    def recommendations(self) -> tuple[list[RecommendationView], str | None]:
        """The latest recommendation of every model, most confident change first; and
        an error line when the store could not be read."""
        def read(store: Store) -> tuple[list[RecommendationView], str | None]:
            latest: dict[tuple[str, str], StoredRecommendation] = {}
            for r in store.recommendations():
                latest[(r.target, r.model)] = r  # oldest first: the last one wins
            views = [_recommendation_view(r) for r in latest.values()]
            views.sort(key=lambda v: (not v.changes, v.target, v.model))
            return views, None

        return self._guard("recommendations", read, lambda error: ([], error))

    def events(self, *, since_s: float = 7 * 24 * 3600.0, target: str | None = None,
               subject: str | None = None, kind: str | None = None,
               severity: str | None = None, state: str = "active",
               now: float | None = None) -> EventsView:
        """Findings (and, later, other events) matching the filters; ``state`` is
        ``active``, ``past`` or ``all``; past ones from the last ``since_s``."""
        at = self._clock() if now is None else now
        return self._guard(
            "events", lambda s: _events(s, since=at - since_s, target=target, subject=subject,
                                        kind=kind, severity=severity, state=state),
            lambda error: EventsView(error=error))

    def devices(self, *, range_name: str | None = None, now: float | None = None,
                max_points: int = 120) -> DevicesView:
        """Utilisation of every GPU / MIG instance and model-instance process over a
        range, bucketed for a heatmap, with memory and power."""
        name, seconds = parse_range(range_name)
        until = self._clock() if now is None else now
        since = until - seconds
        return self._guard(
            "devices", lambda s: _devices(s, since=since, until=until, name=name,
                                          max_points=max_points),
            lambda error: DevicesView(range_name=name, since=since, until=until, error=error))

    def what_if(self, target: str, model: str, *, preferred: Sequence[int],
                instances: int, now: float | None = None) -> WhatIfView:
        """Predicted QPS and p95 over the max queue delays for ``preferred`` sizes and
        ``instances`` instances, at the load last observed for the model."""
        at = self._clock() if now is None else now
        view = WhatIfView(target=target, model=model, preferred=sorted(set(preferred)),
                          instances=instances)

        def read(store: Store) -> WhatIfView:
            batcher = self._batcher_model(store, target, model, at)
            if batcher is None:
                return replace(view, error="not enough traffic observed for a prediction yet")
            key = (target, model, tuple(view.preferred), instances)
            with self._lock:
                cached = self._curves.get(key)
            if cached is not None and cached[0] is batcher:
                return cached[1]
            curve = _what_if(batcher, view, self._slo.get(model))
            with self._lock:
                if len(self._curves) > 256:
                    self._curves.clear()
                self._curves[key] = (batcher, curve)
            return curve

        return self._guard(f"what-if of {model!r}", read,
                           lambda error: replace(view, error=error))

    def _batcher_model(self, store: Store, target: str, model: str,
                       now: float) -> BatcherModel | None:
        key = (target, model)
        with self._lock:
            cached = self._models.get(key)
        if cached is not None and now - cached[0] < WHAT_IF_MODEL_TTL_S:
            return cached[1]
        obs = observe_model(store, target, model, settings=_WHAT_IF_SETTINGS, now=now)
        built = batcher_model(obs, _WHAT_IF_SETTINGS) if obs is not None else None
        with self._lock:
            self._models[key] = (now, built)
        return built


def _one_line(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def _store_error(err: BaseException) -> str:
    if isinstance(err, ConfigError):
        return f"the store cannot be opened: {_one_line(err)}"
    return f"the store is unreachable: {_one_line(err)}"


# --------------------------------------------------------------------------- overview


def _finding_view(f: StoredFinding) -> FindingView:
    return FindingView(id=f.id, kind=f.kind, severity=f.severity, target=f.target,
                       subject=f.subject, summary=f.summary, window_start=f.window_start,
                       window_end=f.window_end, created_at=f.created_at,
                       resolved_at=f.resolved_at, evidence=dict(f.evidence))


def _overview(store: Store, *, window_s: float, now: float) -> OverviewData:
    report = build_status(store, window_s=window_s, now=now)
    findings = [_finding_view(f) for f in store.active_findings()]
    by_subject: dict[tuple[str, str], list[FindingView]] = defaultdict(list)
    for f in findings:
        by_subject[(f.target, f.subject)].append(f)

    models = [
        ModelRow(target=m.target, model=m.model, version=m.version, up=m.up, qps=m.qps,
                 avg_batch_size=m.avg_batch_size, max_batch_size=m.max_batch_size,
                 preferred_batch_sizes=list(m.preferred_batch_sizes or []),
                 dynamic_batching=m.dynamic_batching, queue_share=m.queue_share,
                 busy_share=m.busy_share, pending=m.pending, fail_per_s=m.fail_per_s,
                 instance_count=m.instance_count, last_sample_at=m.last_sample_at,
                 findings=by_subject.get((m.target, m.model), []))
        for m in report.models
    ]
    model_count: dict[str, int] = defaultdict(int)
    for m in models:
        model_count[m.target] += 1
    targets = [TargetTile(name=t.name, kind=t.kind, up=t.up, last_error=t.last_error,
                          last_seen_at=t.last_seen_at,
                          consecutive_failures=t.consecutive_failures,
                          models=model_count.get(t.name, 0))
               for t in store.targets()]

    devices = _device_tiles(report.devices)
    uuids = {d.uuid for d in devices}
    device_findings = [f for f in findings if f.subject in uuids]
    idle = [d.idle_gpus for d in devices if d.idle_gpus is not None]

    instances_total = 0
    instances_idle = 0.0
    for m in models:
        if m.instance_count and m.busy_share is not None:
            instances_total += m.instance_count
            instances_idle += m.instance_count * (1.0 - min(max(m.busy_share, 0.0), 1.0))
    return OverviewData(
        generated_at=now, window_s=window_s, targets=targets, models=models, devices=devices,
        device_findings=device_findings, idle_gpus=sum(idle) if idle else None,
        instances_total=instances_total,
        instances_idle=instances_idle if instances_total else None,
        last_sample_at=store.latest_collected_at())


def _device_tiles(devices: Sequence[Any]) -> list[DeviceTile]:
    """One tile per device uuid (NVML's reading preferred over Triton's), weighted by
    the share of a GPU each stands for."""
    chosen: dict[str, Any] = {}
    for d in devices:
        held = chosen.get(d.uuid)
        if held is None or (held.source != "nvml" and d.source == "nvml"):
            chosen[d.uuid] = d
    children: dict[str, list[Any]] = defaultdict(list)
    for d in chosen.values():
        if d.kind == "mig" and d.parent_uuid:
            children[d.parent_uuid].append(d)

    tiles: list[DeviceTile] = []
    for d in sorted(chosen.values(), key=lambda d: (d.target, d.index is None, d.index, d.uuid)):
        if d.sm_active_pct is not None:
            util, metric = d.sm_active_pct, "sm_active_pct"
        elif d.utilization_gpu_pct is not None:
            util, metric = d.utilization_gpu_pct, "utilization_gpu_pct"
        else:
            util, metric = None, None
        if d.kind == "mig":
            parent = chosen.get(d.parent_uuid or "")
            siblings = children.get(d.parent_uuid or "", [d])
            if parent is not None and parent.memory_total_bytes and d.memory_total_bytes:
                weight = min(d.memory_total_bytes / parent.memory_total_bytes, 1.0)
            else:
                weight = 1.0 / max(len(siblings), 1)
        else:
            weight = 0.0 if children.get(d.uuid) else 1.0
        idle = weight * (1.0 - min(max(util, 0.0), 100.0) / 100.0) if util is not None else None
        tiles.append(DeviceTile(
            target=d.target, uuid=d.uuid, kind=d.kind, name=d.name, source=d.source,
            utilisation_pct=util, metric=metric, memory_used_bytes=d.memory_used_bytes,
            memory_total_bytes=d.memory_total_bytes, power_w=d.power_w, healthy=d.healthy,
            weight=round(weight, 4), idle_gpus=idle, parent_uuid=d.parent_uuid))
    return tiles


# --------------------------------------------------------------------------- one model


def _series_and_distribution(store: Store, target: str, model: str, since: float,
                             until: float, *, max_points: int = 240,
                             ) -> tuple[ModelSeries, BatchDistribution]:
    config = store.latest_model_configs(target).get((target, model))
    instances = config.config.instance_count if config else None
    max_points = max(int(max_points), 2)
    if until - since <= RAW_RANGE_S:
        samples = store.model_samples(target=target, model=model, since=since - _LEAD_S,
                                      until=until)
        series = _raw_series(samples, since, until, max_points, instances)
        return series, _distribution_pairwise(samples, since)

    rollups = store.model_rollups(target=target, model=model, since=since, until=until)
    distribution = _distribution_edges(store, target, model, since, until)
    if not rollups:
        start = max(since, until - RAW_FALLBACK_S)
        samples = store.model_samples(target=target, model=model, since=start - _LEAD_S,
                                      until=until)
        series = _raw_series(samples, start, until, max_points, instances)
        if start > since:
            series = _replace(series, truncated_to_s=until - start)
        return series, distribution
    bucket_s = min(r.bucket_s for r in rollups)
    rollups = [r for r in rollups if r.bucket_s == bucket_s]
    rolled_until = max(r.bucket_start + r.bucket_s for r in rollups)
    tail: list[ModelSample] = []
    if rolled_until < until:
        tail = store.model_samples(target=target, model=model, since=rolled_until - _LEAD_S,
                                   until=until)
    step = max(bucket_s, (until - since) / max_points)
    return _rollup_series(rollups, tail, rolled_until, until, step, instances), distribution


def _replace(series: ModelSeries, **changes: Any) -> ModelSeries:
    return ModelSeries(**{**{f.name: getattr(series, f.name) for f in fields(series)},
                          **changes})


def _by_version(samples: Iterable[ModelSample]) -> dict[str, list[ModelSample]]:
    out: dict[str, list[ModelSample]] = defaultdict(list)
    for s in samples:
        out[s.version].append(s)
    return out


class _Columns:
    """Accumulates the columns of a ``ModelSeries``, with a gap row where buckets
    are missing."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def gap(self, t: float) -> None:
        self.rows.append((t, None, None, None, None, None, None))

    def add(self, t: float, qps: float | None, batch: float | None, queue_ms: float | None,
            compute_ms: float | None, pending: float | None, fail: float | None) -> None:
        self.rows.append((t, qps, batch, queue_ms, compute_ms, pending, fail))

    def series(self, bucket_s: float, source: str) -> ModelSeries:
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * 7
        return ModelSeries(bucket_s=bucket_s, source=source if self.rows else "none",
                           t=list(cols[0]), qps=list(cols[1]), avg_batch_size=list(cols[2]),
                           queue_ms=list(cols[3]), compute_ms=list(cols[4]),
                           pending=list(cols[5]), fail_per_s=list(cols[6]))


def _ms(us: float | None) -> float | None:
    return us / 1000.0 if us is not None else None


def _compute_ms(input_us: float | None, infer_us: float | None,
                output_us: float | None) -> float | None:
    parts = [v for v in (input_us, infer_us, output_us) if v is not None]
    return sum(parts) / 1000.0 if parts else None


def _median_interval(samples: Sequence[ModelSample]) -> float | None:
    gaps = sorted(b.collected_at - a.collected_at for a, b in zip(samples, samples[1:],
                                                                   strict=False))
    return gaps[len(gaps) // 2] if gaps else None


def _raw_series(samples: Sequence[ModelSample], since: float, until: float, max_points: int,
                instances: int | None) -> ModelSeries:
    """Rates per bucket from the counter increases of the sample pairs ending in it,
    summed over versions (their windows overlap: seconds are the longest, not the sum).

    A bucket is never shorter than the scrape interval, so a steady series has no
    empty buckets; a pair spanning more than ``_GAP_INTERVALS`` intervals (the
    collector or the target was down) puts a gap row before its bucket."""
    versions = _by_version(samples)
    interval = min((i for v in versions.values() if (i := _median_interval(v)) is not None),
                   default=1.0)
    bucket_s = max((until - since) / max_points, interval, 1.0)
    long_pair = max(_GAP_INTERVALS * interval, 2 * bucket_s)
    increases: dict[int, dict[str, CounterIncrease]] = defaultdict(dict)
    pending: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    last_t: dict[int, float] = {}
    gap_before: set[int] = set()
    for version, series in versions.items():
        for prev, cur in zip(series, series[1:], strict=False):
            if cur.collected_at < since:
                continue
            k = int((cur.collected_at - since) // bucket_s)
            if cur.collected_at - prev.collected_at > long_pair and prev.collected_at >= since:
                gap_before.add(k)
            inc = increases[k].setdefault(version, CounterIncrease())
            inc.add(counter_increase(prev, cur))
            last_t[k] = max(last_t.get(k, cur.collected_at), cur.collected_at)
            if cur.metrics.pending_request_count is not None:
                pending[k][version].append(cur.metrics.pending_request_count)
    out = _Columns()
    for k in sorted(increases):
        if k in gap_before and out.rows:
            out.gap(out.rows[-1][0] + interval)
        total = CounterIncrease()
        seconds = 0.0
        for inc in increases[k].values():
            seconds = max(seconds, inc.seconds)
            inc.seconds = 0.0
            total.add(inc)
        total.seconds = seconds
        if seconds <= 0:
            continue
        count = instances * len(increases[k]) if instances else None
        r = rates_from_increase(total, instance_count=count)
        waiting = [sum(v) / len(v) for v in pending[k].values() if v]
        out.add(last_t[k], r.requests_per_s, r.avg_batch_size, _ms(r.queue_us_per_request),
                _compute_ms(r.compute_input_us_per_request, r.compute_infer_us_per_request,
                            r.compute_output_us_per_request),
                sum(waiting) if waiting else None, r.fail_per_s)
    return out.series(bucket_s, "raw")


def _weighted(values: Iterable[tuple[float | None, float]]) -> float | None:
    pairs = [(v, w) for v, w in values if v is not None]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total > 0:
        return sum(v * w for v, w in pairs) / total
    return sum(v for v, _ in pairs) / len(pairs)


def _rollup_series(rollups: Sequence[ModelRollup], tail: Sequence[ModelSample],
                   rolled_until: float, until: float, step: float,
                   instances: int | None) -> ModelSeries:
    """Rollup buckets merged over versions and into ``step``-long points, then the raw
    samples after the last rollup."""
    groups: dict[float, list[ModelRollup]] = defaultdict(list)
    origin = min(r.bucket_start for r in rollups)
    for r in rollups:
        groups[origin + math.floor((r.bucket_start - origin) / step) * step].append(r)
    out = _Columns()
    previous: float | None = None
    for start in sorted(groups):
        if previous is not None and start - previous > step * 1.5:
            out.gap(previous + step)
        previous = start
        rows = groups[start]
        span = {r.bucket_start for r in rows}
        buckets = max(len(span), 1)

        def rate(name: str, rows: list[ModelRollup] = rows, buckets: int = buckets
                 ) -> float | None:
            values = [getattr(r, name) for r in rows if getattr(r, name) is not None]
            return sum(values) / buckets if values else None  # Σ versions, mean over time

        def requests(r: ModelRollup) -> float:
            return (r.requests_per_s or 0.0) * r.rated_s

        def executions(r: ModelRollup) -> float:
            return (r.executions_per_s or 0.0) * r.rated_s

        batch = _weighted((r.avg_batch_size, executions(r)) for r in rows)
        queue = _weighted((r.queue_us_per_request, requests(r)) for r in rows)
        compute = _weighted((_compute_ms(r.compute_input_us_per_request,
                                         r.compute_infer_us_per_request,
                                         r.compute_output_us_per_request), requests(r))
                            for r in rows)
        pending_values = [r.pending_request_count for r in rows
                          if r.pending_request_count is not None]
        out.add(start + step / 2, rate("requests_per_s"), batch, _ms(queue), compute,
                sum(pending_values) / buckets if pending_values else None, rate("fail_per_s"))
    if tail:
        raw = _raw_series(tail, rolled_until, until,
                          max(int((until - rolled_until) / step), 1), instances)
        for row in zip(raw.t, raw.qps, raw.avg_batch_size, raw.queue_ms, raw.compute_ms,
                       raw.pending, raw.fail_per_s, strict=True):
            out.rows.append(row)
    return out.series(step, "rollup")


def _sum_batches(increases: Iterable[BatchStat], into: dict[int, list[int]]) -> None:
    for b in increases:
        t = into.setdefault(b.batch_size, [0, 0, 0, 0])
        t[0] += b.exec_count
        t[1] += b.compute_input.ns
        t[2] += b.compute_infer.ns
        t[3] += b.compute_output.ns


def _distribution(totals: dict[int, list[int]]) -> BatchDistribution:
    sizes = sorted(s for s, t in totals.items() if t[0] > 0)
    return BatchDistribution(
        sizes=sizes, executions=[totals[s][0] for s in sizes],
        mean_ms=[(totals[s][1] + totals[s][2] + totals[s][3]) / totals[s][0] / 1e6
                 for s in sizes])


def _distribution_pairwise(samples: Sequence[ModelSample], since: float) -> BatchDistribution:
    """Exact: the batch_stats increase of every pair ending in the range."""
    totals: dict[int, list[int]] = {}
    for series in _by_version(samples).values():
        for prev, cur in zip(series, series[1:], strict=False):
            if cur.collected_at < since or cur.stats is None:
                continue
            reset = prev.stats is None or stats_reset(prev, cur)
            _sum_batches(batch_stats_increase(prev.stats.batch_stats if prev.stats else None,
                                              cur.stats.batch_stats, reset=reset), totals)
    return _distribution(totals)


def _distribution_edges(store: Store, target: str, model: str, since: float,
                        until: float) -> BatchDistribution:
    """For a long range, the difference between the cumulative batch_stats near its two
    ends (two small reads). A reload inside the range leaves only what the sizes
    accrued since (``batch_stats_increase`` treats a size that went down as reset)."""
    first = _by_version(store.model_samples(target=target, model=model, since=since,
                                            until=min(since + _EDGE_S, until)))
    last = _by_version(store.model_samples(target=target, model=model,
                                           since=max(until - _EDGE_S, since), until=until))
    totals: dict[int, list[int]] = {}
    for version, newest in last.items():
        end = newest[-1]
        if end.stats is None:
            continue
        start = first.get(version, [None])[0]
        before = start.stats.batch_stats if start is not None and start.stats else None
        _sum_batches(batch_stats_increase(before, end.stats.batch_stats), totals)
    return _distribution(totals)


def _service_time(distribution: BatchDistribution,
                  max_batch_size: int | None) -> ServiceTimeView | None:
    if distribution.empty:
        return None
    fit = fit_service_time([
        BatchStat(batch_size=s, compute_infer=Duration(n, int(ms * n * 1e6)))
        for s, n, ms in zip(distribution.sizes, distribution.executions, distribution.mean_ms,
                            strict=True)])
    if fit is None:
        return None
    return ServiceTimeView(
        sizes=[p.batch_size for p in fit.points], mean_ms=[p.mean_ms for p in fit.points],
        executions=[p.executions for p in fit.points], intercept_ms=fit.intercept_ms,
        per_sample_ms=fit.per_sample_ms, max_batch_size=max_batch_size or None)


def _config_view(store: Store, target: str, model: str) -> ConfigView | None:
    stored = store.latest_model_configs(target).get((target, model))
    if stored is None:
        return None
    c = stored.config
    try:
        raw = json.dumps(json.loads(c.raw_json), indent=2, sort_keys=True)
    except ValueError:
        raw = c.raw_json
    return ConfigView(model=c.model, collected_at=stored.collected_at,
                      max_batch_size=c.max_batch_size, dynamic_batching=c.dynamic_batching,
                      preferred_batch_sizes=list(c.preferred_batch_sizes),
                      max_queue_delay_us=c.max_queue_delay_us, instance_count=c.instance_count,
                      instance_kind=c.instance_kind, backend=c.backend, platform=c.platform,
                      raw_json=raw)


def _model_findings(store: Store, target: str, model: str, since: float) -> list[FindingView]:
    """The model's open findings and those created in the range; open ones first,
    then newest first."""
    seen: dict[int, FindingView] = {}
    for f in [*store.active_findings(target=target), *store.findings(target=target, since=since)]:
        if f.subject == model:
            seen[f.id] = _finding_view(f)
    return sorted(seen.values(), key=lambda f: (not f.active, -f.created_at, -f.id))


def _latest_recommendation(store: Store, target: str,
                           model: str) -> RecommendationView | None:
    stored = store.recommendations(target=target, model=model)
    if not stored:
        return None
    return _recommendation_view(stored[-1])


def _recommendation_view(r: StoredRecommendation) -> RecommendationView:
    predicted = r.predicted or {}
    try:
        rec = recommendation_from_dict(dict(r.change))
    except (KeyError, TypeError, ValueError):
        # Not a full recommendation document: show what the row itself holds.
        return RecommendationView(
            id=r.id, created_at=r.created_at, status=r.status, kind=r.status,
            reason=str(r.change.get("reason", "")), confidence=r.confidence, changes=[],
            current_qps=None, current_p95_ms=None, predicted_qps=predicted.get("qps"),
            predicted_p95_ms=predicted.get("p95_ms"), config_pbtxt=r.config_fragment,
            applied_at=r.applied_at)
    return RecommendationView(
        id=r.id, created_at=r.created_at, status=r.status, kind=rec.kind, reason=rec.reason,
        confidence=r.confidence,
        changes=[[c.field, str(c.before), str(c.after)] for c in rec.changes],
        current_qps=rec.current.qps, current_p95_ms=rec.current.p95_ms,
        predicted_qps=rec.predicted.qps, predicted_p95_ms=rec.predicted.p95_ms,
        config_pbtxt=r.config_fragment or rec.config_pbtxt, applied_at=r.applied_at,
        target=r.target, model=r.model,
        current_pbtxt=render_pbtxt(rec.current_config,
                                   instance_kind=_instance_kind(rec.config_json)),
        slo_p95_ms=rec.slo_p95_ms,
        verification=dict(r.verification) if r.verification else None,
        proposed_delay_us=rec.proposed_config.max_queue_delay_us,
        proposed_preferred=list(rec.proposed_config.preferred_batch_sizes),
        proposed_instances=rec.proposed_config.instance_count,
        max_batch_size=rec.proposed_config.max_batch_size)


def _instance_kind(config_json: str) -> str:
    try:
        groups = json.loads(config_json).get("instance_group") or [{}]
        return str(groups[0].get("kind") or "KIND_CPU")
    except (ValueError, AttributeError, IndexError):
        return "KIND_CPU"


def _what_if(batcher: BatcherModel, view: WhatIfView, slo_p95_ms: float | None) -> WhatIfView:
    obs = batcher.observation
    current = obs.batcher
    settings = batcher.settings
    sizes = [p for p in view.preferred if 1 <= p <= current.max_batch_size]
    instances = min(max(view.instances, 1), settings.max_instances)
    qps: list[float] = []
    p95: list[float | None] = []
    for delay in WHAT_IF_DELAYS_US:
        config = BatcherConfig(max_batch_size=current.max_batch_size, dynamic_batching=True,
                               preferred_batch_sizes=tuple(sizes), max_queue_delay_us=delay,
                               instance_count=instances)
        p = batcher.predict(config, requests=settings.screen_requests)
        qps.append(p.qps)
        p95.append(p.p95_ms)
    now = batcher.predict(current, requests=settings.screen_requests)
    if slo_p95_ms is not None:
        objective, text = slo_p95_ms, f"SLO p95 ≤ {slo_p95_ms:g} ms"
    else:
        objective = now.p95_ms * settings.latency_margin if now.p95_ms else None
        text = f"current p95 + {settings.latency_margin - 1:.0%}"
    return replace(view, preferred=sizes, instances=instances,
                   delays_us=list(WHAT_IF_DELAYS_US), qps=qps, p95_ms=p95,
                   objective_p95_ms=objective, objective=text, current_qps=now.qps,
                   current_p95_ms=now.p95_ms,
                   current_delay_us=current.max_queue_delay_us if current.dynamic_batching
                   else None,
                   max_batch_size=current.max_batch_size, max_instances=settings.max_instances)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class EventsView:
    """Events of every kind the store keeps, newest first, with the choices the
    page's filters offer. Today every event is a finding (``FindingView``); alert
    states and notification deliveries join as further readers in ``_EVENT_READERS``
    with the same fields, so the page does not change."""

    events: list[FindingView] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    severities: list[str] = field(default_factory=list)
    error: str | None = None


def _finding_events(store: Store, since: float) -> list[FindingView]:
    seen = {f.id: f for f in store.findings(since=since)}
    seen.update({f.id: f for f in store.active_findings()})
    return [_finding_view(f) for f in seen.values()]


#: Each reader turns one kind of stored event into ``FindingView``s since a time.
_EVENT_READERS: Final = (_finding_events,)
_SEVERITY_ORDER: Final = {"critical": 0, "warning": 1, "info": 2}


def _events(store: Store, *, since: float, target: str | None, subject: str | None,
            kind: str | None, severity: str | None, state: str) -> EventsView:
    every = [e for read in _EVENT_READERS for e in read(store, since)]
    chosen = [e for e in every
              if (target is None or e.target == target)
              and (subject is None or e.subject == subject)
              and (kind is None or e.kind == kind)
              and (severity is None or e.severity == severity)
              and (state == "all" or (state == "active") == e.active)]
    chosen.sort(key=lambda e: (not e.active, _SEVERITY_ORDER.get(e.severity, 3),
                               -e.created_at, -e.id))
    return EventsView(events=chosen[:500], targets=sorted({e.target for e in every}),
                      subjects=sorted({e.subject for e in every}),
                      kinds=sorted({e.kind for e in every}),
                      severities=sorted({e.severity for e in every},
                                        key=lambda s: _SEVERITY_ORDER.get(s, 3)))


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
    error: str | None = None

    @property
    def empty(self) -> bool:
        return not self.devices and not self.processes


def _bucketed(points: Iterable[tuple[str, str, float, float | None]], since: float,
              bucket_s: float, buckets: int) -> list[HeatRow]:
    """(label, kind, time, value) points averaged per label and time bucket."""
    sums: dict[tuple[str, str], list[list[float]]] = {}
    for label, kind, at, value in points:
        if value is None or not math.isfinite(value):
            continue
        i = int((at - since) // bucket_s)
        if 0 <= i < buckets:
            acc = sums.get((label, kind))
            if acc is None:
                acc = sums[(label, kind)] = [[0.0, 0.0] for _ in range(buckets)]
            acc[i][0] += value
            acc[i][1] += 1
    return [HeatRow(label=label, kind=kind,
                    values=[a[0] / a[1] if a[1] else None for a in acc])
            for (label, kind), acc in sorted(sums.items())]


def _device_label(target: str, s: DeviceSample) -> str:
    index = s.index if s.index is not None else ""
    return f"{target} · {s.name or s.kind} {index} ({s.uuid[-8:]})"


def _devices(store: Store, *, since: float, until: float, name: str,
             max_points: int) -> DevicesView:
    """GPU / MIG rows from rollups (plus the raw tail) beyond ``RAW_RANGE_S`` and
    from raw samples below; process rows from raw samples of at most the last
    ``RAW_FALLBACK_S`` (processes come and go, so they have no rollups)."""
    bucket_s = max((until - since) / max_points, 1.0)
    buckets = max(int(math.ceil((until - since) / bucket_s)), 1)
    raw_since = since
    rollups: list[DeviceRollup] = []
    truncated_to_s: float | None = None
    if until - since > RAW_RANGE_S:
        rollups = store.device_rollups(since=since, until=until)
        if rollups:
            width = min(r.bucket_s for r in rollups)
            rollups = [r for r in rollups if r.bucket_s == width]
            raw_since = max(r.bucket_start + r.bucket_s for r in rollups)
        else:
            raw_since = max(since, until - RAW_FALLBACK_S)
            truncated_to_s = until - raw_since if raw_since > since else None

    device_util: list[tuple[str, str, float, float | None]] = []
    memory: list[tuple[str, str, float, float | None]] = []
    power: list[tuple[str, str, float, float | None]] = []
    labels: dict[tuple[str, str], str] = {}
    raw = store.device_samples(since=raw_since, until=until)
    for d in raw:
        labels[(d.target, d.sample.uuid)] = _device_label(d.target, d.sample)
    def add(label: str, kind: str, at: float, sm_active: float | None,
            utilisation: float | None, memory_bytes: float | None,
            watts: float | None) -> None:
        # SM activity (GPM) when read, else the coarser utilisation counter.
        device_util.append((label, kind, at, sm_active if sm_active is not None
                            else utilisation))
        if memory_bytes is not None:
            memory.append((label, kind, at, memory_bytes / 1e9))
        power.append((label, kind, at, watts))

    for r in rollups:
        add(labels.get((r.target, r.uuid), f"{r.target} · {r.kind} ({r.uuid[-8:]})"), r.kind,
            r.bucket_start + r.bucket_s / 2, r.sm_active_pct, r.utilization_gpu_pct,
            r.memory_used_bytes, r.power_w)
    for d in raw:
        s = d.sample
        add(labels[(d.target, s.uuid)], s.kind, d.collected_at, s.sm_active_pct,
            s.utilization_gpu_pct, s.memory_used_bytes, s.power_w)

    process_since = max(since, until - RAW_FALLBACK_S)
    # Process buckets count from ``since`` so their cells line up with the devices'.
    skipped = int((process_since - since) // bucket_s)
    cells = store.process_buckets(since=since + skipped * bucket_s, until=until,
                                  bucket_s=bucket_s)
    gpu_cells = [c for c in cells if c.sm_util_pct is not None]
    metric = "SM % (NVML)" if gpu_cells else "CPU % of one core"
    process_rows: dict[str, list[float | None]] = {}
    for c in gpu_cells or [c for c in cells if c.role == "stub"]:
        label = f"{c.target} · {c.instance_name or c.model or c.role} (pid {c.pid})"
        values = process_rows.setdefault(label, [None] * buckets)
        if 0 <= skipped + c.bucket < buckets:
            values[skipped + c.bucket] = c.sm_util_pct if gpu_cells else c.cpu_pct
    return DevicesView(
        range_name=name, since=since, until=until,
        t=[since + i * bucket_s for i in range(buckets)],
        devices=_bucketed(device_util, since, bucket_s, buckets),
        processes=[HeatRow(label=label, kind="process", values=values)
                   for label, values in sorted(process_rows.items())],
        process_metric=metric,
        process_window_s=until - process_since if process_since > since else None,
        devices_truncated_to_s=truncated_to_s,
        memory_used_gb=_bucketed(memory, since, bucket_s, buckets),
        power_w=_bucketed(power, since, bucket_s, buckets))
