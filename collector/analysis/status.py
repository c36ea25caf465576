"""The latest window per target and model, device and process: what ``batchscope
status`` prints and the UI's overview reads.

A status composes the records it shows instead of copying their fields: a model's
``rates`` are a ``ModelRates`` (``collector.analysis.rates``) and its ``config`` a
``BatcherConfig``; a device's ``sample`` is its latest ``DeviceSample``; a process
holds its latest ``ProcessSample`` and NVML's reading of the same (target, pid). Their
JSON (``StatusReport.to_json_dict``, ``status --json``) nests the records under those
names with the records' own field names; the shape is pinned by a golden test.

Everything is judged from ``now`` (``collector.analysis.health``): a target's state
is its ``Health`` now, not what its last scrape said; a model's window ends at ``now``
and a series whose newest sample is stale gets no rates (its row says ``stale``); a
device or process is listed only from a fresh reading.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from collector.analysis.detect.increases import series_increase
from collector.analysis.health import (
    Health,
    HealthState,
    is_fresh,
    scrape_interval_s,
    target_healths,
)
from collector.analysis.rates import gauge_mean, rates_from_increase, request_p95_us, window_rates
from collector.records import (
    BatcherConfig,
    DeviceSample,
    HostFacts,
    ModelRates,
    ModelSample,
    ProcessSample,
)
from collector.store import (
    Store,
    StoredDevice,
    StoredProcess,
    StoreOutage,
    TargetState,
)
from collector.store.windows import CounterReading

__all__ = [
    "DeviceStatus",
    "ModelStatus",
    "ProcessStatus",
    "StatusReport",
    "TargetStatus",
    "build_status",
    "judge_targets",
]

# A series' newest sample is looked for this much before the window, so that scrapes
# sparser than the window still give a pair to take rates from.
_LOOKBACK_S = 300.0
# The store's outages (writes held in memory, some perhaps dropped) are shown this long.
STORE_OUTAGES_SHOWN_S = 86400.0


@dataclass(frozen=True)
class TargetStatus:
    """One target: what the store keeps of it (``target``), its ``health`` judged at
    the report's time, and the latest facts about its machine (``None`` when no
    source reported any; ``facts.nvml_absent`` says a host has no NVIDIA GPU)."""

    target: TargetState
    health: Health
    facts: HostFacts | None = None

    @property
    def name(self) -> str:
        return self.target.name


@dataclass(frozen=True)
class ModelStatus:
    """One (target, model, version) at the report's time.

    ``state`` is its target's health state, or ``"stale"`` when the target is up but
    this series had no fresh sample (the model is gone); ``up`` is ``state == "up"``.
    ``rates`` are over the window ending *now*, ``None`` when the series has no fresh
    sample or fewer than two samples; ``pending_request_count`` is the latest gauge
    and ``request_p95_us`` Triton's request-time p95 (when published), both only from
    a fresh sample; ``config`` the model's current batcher config (``None`` when none
    was read)."""

    target: str
    model: str
    version: str
    up: bool
    last_sample_at: float
    rates: ModelRates | None
    pending_request_count: float | None
    config: BatcherConfig | None
    state: str = ""  # "" in a hand-made row: "up" or "down" as ``up`` says
    request_p95_us: float | None = None

    def __post_init__(self) -> None:
        if not self.state:
            object.__setattr__(self, "state", str(HealthState.UP if self.up else HealthState.DOWN))


@dataclass(frozen=True)
class DeviceStatus:
    """One GPU or MIG instance as a source reported it last (``sample.source``)."""

    target: str
    last_sample_at: float
    sample: DeviceSample


@dataclass(frozen=True)
class ProcessStatus:
    """One process of a target, alive in the target's newest host tick.

    ``sample`` is its latest reading: the host source's for a Triton process, NVML's
    for a GPU process that no watched Triton owns. ``cpu_pct_mean`` is its CPU share
    (percent of one core) averaged over the window. ``gpu`` is NVML's reading of the
    same process, when there is one (see ``_process_statuses`` for the join)."""

    target: str
    last_sample_at: float
    sample: ProcessSample
    cpu_pct_mean: float | None = None
    gpu: ProcessSample | None = None


@dataclass(frozen=True)
class StatusReport:
    generated_at: float
    window_s: float
    targets: list[TargetStatus] = field(default_factory=list)
    models: list[ModelStatus] = field(default_factory=list)
    devices: list[DeviceStatus] = field(default_factory=list)
    processes: list[ProcessStatus] = field(default_factory=list)
    # The store's outages that ended in the last ``STORE_OUTAGES_SHOWN_S``.
    store_outages: list[StoreOutage] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, object]:
        return {
            "generated_at": self.generated_at,
            "window_s": self.window_s,
            "targets": [asdict(t) for t in self.targets],
            "models": [asdict(m) for m in self.models],
            "devices": [asdict(d) for d in self.devices],
            "processes": [asdict(p) for p in self.processes],
        }


def judge_targets(store: Store, now: float) -> list[TargetStatus]:
    """Every target the store knows, judged at ``now``, with its machine's facts."""
    states = store.targets()
    return [
        TargetStatus(target=t, health=h, facts=store.host_facts(t.name))
        for t, h in zip(states, target_healths(states, now), strict=True)
    ]


def build_status(store: Store, *, window_s: float = 60.0, now: float | None = None) -> StatusReport:
    """Every target judged at ``now``; rates over the ``window_s`` before ``now`` of
    each series with a fresh sample, with the model's current config; the latest
    fresh reading of each device; the processes alive in their target's newest host
    tick, when that tick is fresh."""
    now = time.time() if now is None else now
    targets = judge_targets(store, now)
    by_name = {t.name: t for t in targets}
    models = _model_statuses(store, by_name, window_s, now)
    device_rows = [
        d for d in store.device_samples(since=now - window_s, until=now) if _fresh(d, by_name, now)
    ]
    devices = _device_statuses(device_rows)
    processes = _process_statuses(
        store.process_samples(since=now - window_s, until=now), _machines(device_rows)
    )
    return StatusReport(
        generated_at=now,
        window_s=window_s,
        targets=targets,
        models=models,
        devices=devices,
        processes=[p for p in processes if _fresh(p, by_name, now)],
        store_outages=store.store_outages(since=now - max(window_s, STORE_OUTAGES_SHOWN_S)),
    )


def _fresh(
    reading: StoredDevice | StoredProcess | ProcessStatus,
    targets: Mapping[str, TargetStatus],
    now: float,
) -> bool:
    """Whether a reading of a target is still current at ``now`` (by the interval its
    target is scraped at)."""
    known = targets.get(reading.target)
    interval = scrape_interval_s(known.target if known is not None else None)
    at = reading.last_sample_at if isinstance(reading, ProcessStatus) else reading.collected_at
    return is_fresh(at, now, interval)


def _model_statuses(
    store: Store, targets: Mapping[str, TargetStatus], window_s: float, now: float
) -> list[ModelStatus]:
    """Each series with a sample in the window or the lookback before it. Its rates
    come from the lean readings of the window (``series_increase``, what
    ``window_rates`` makes of the same samples); only its newest sample is read whole,
    and its last pair where the window holds fewer than two samples."""
    newest_samples = store.newest_model_samples(since=now - window_s - _LOOKBACK_S, until=now)
    in_window = {
        (s.target, s.model, s.version): s.readings
        for s in store.counter_series(since=now - window_s, until=now)
    }
    configs = store.latest_model_configs()
    statuses: list[ModelStatus] = []
    for newest in sorted(newest_samples, key=lambda s: (s.target, s.model, s.version)):
        target, model, version = newest.target, newest.model, newest.version
        known = targets.get(target)
        fresh = is_fresh(
            newest.collected_at, now, scrape_interval_s(known.target if known else None)
        )
        state = known.health.state if known is not None else HealthState.UNKNOWN
        if state is HealthState.UP and not fresh:
            state = HealthState.STALE  # the target answers, this series no longer does
        stored = configs.get((target, model))
        rates = None
        if fresh:
            instances = stored.config.instance_count if stored else None
            readings = in_window.get((target, model, version), ())
            rates = (
                _window_rates(readings, instances)
                if len(readings) >= 2
                else _last_pair_rates(store, newest, now - window_s - _LOOKBACK_S, instances)
            )
        statuses.append(
            ModelStatus(
                target=target,
                model=model,
                version=version,
                up=state is HealthState.UP,
                state=str(state),
                last_sample_at=newest.collected_at,
                rates=rates,
                pending_request_count=newest.metrics.pending_request_count if fresh else None,
                config=BatcherConfig.from_model_config(stored.config) if stored else None,
                request_p95_us=request_p95_us(newest) if fresh else None,
            )
        )
    return statuses


def _window_rates(readings: Sequence[CounterReading], instances: int | None) -> ModelRates:
    """``window_rates`` of the samples behind ``readings``."""
    return rates_from_increase(series_increase(readings).increase, instance_count=instances)


def _last_pair_rates(
    store: Store, newest: ModelSample, since: float, instances: int | None
) -> ModelRates | None:
    """Scrapes sparser than the window: the rates of the series' last pair."""
    rows = store.model_samples(
        target=newest.target,
        model=newest.model,
        version=newest.version,
        since=since,
        until=newest.collected_at,
    )
    return window_rates(rows[-2:], instance_count=instances)


def _device_statuses(rows: Sequence[StoredDevice]) -> list[DeviceStatus]:
    """The latest reading per (target, source, device)."""
    latest: dict[tuple[str, str, str], DeviceStatus] = {}
    for d in rows:
        latest[(d.target, d.sample.source, d.sample.uuid)] = DeviceStatus(
            target=d.target, last_sample_at=d.collected_at, sample=d.sample
        )
    return sorted(latest.values(), key=lambda d: (d.target, d.sample.uuid))


def _machines(devices: Sequence[StoredDevice]) -> dict[str, str]:
    """The machine each Triton target runs on, named as NVML files its readings (the
    collector's host): the one whose NVML sees a GPU that the Triton server reports.
    GPU uuids are unique across machines; a target whose server reports no GPU has no
    known machine."""
    nvml_machine = {d.sample.uuid: d.target for d in devices if d.sample.source == "nvml"}
    return {
        d.target: nvml_machine[d.sample.uuid]
        for d in devices
        if d.sample.source == "triton" and d.sample.uuid in nvml_machine
    }


def _process_statuses(
    rows: Sequence[StoredProcess], machines: Mapping[str, str]
) -> list[ProcessStatus]:
    """The host's processes per (target, pid), each with NVML's reading of the same
    pid on the machine the target runs on (``machines``; pids are only unique on one
    machine, so never a reading of another machine's process); NVML's processes that
    no host process joined, on their own. Only processes seen in the newest tick of
    their target are still alive."""
    gpu: dict[tuple[str, int], StoredProcess] = {}
    readings: dict[tuple[str, int], list[StoredProcess]] = defaultdict(list)
    for p in rows:
        if p.sample.source == "nvml":
            gpu[(p.target, p.sample.pid)] = p
        else:
            readings[(p.target, p.sample.pid)].append(p)
    on_machine = {
        (target, pid): (machines[target], pid) for target, pid in readings if target in machines
    }
    joined = set(on_machine.values())
    for key, p in gpu.items():
        if key not in joined and key not in readings:  # not part of a watched Triton
            readings[key].append(p)
    statuses: list[ProcessStatus] = []
    for key, seen in sorted(readings.items()):
        last = seen[-1]
        reading = gpu.get(on_machine.get(key, key))
        statuses.append(
            ProcessStatus(
                target=last.target,
                last_sample_at=last.collected_at,
                sample=last.sample,
                cpu_pct_mean=gauge_mean(r.sample.cpu_pct for r in seen),
                gpu=reading.sample if reading is not None else None,
            )
        )
    newest_tick: dict[str, float] = {}
    for s in statuses:
        newest_tick[s.target] = max(newest_tick.get(s.target, 0.0), s.last_sample_at)
    return [s for s in statuses if s.last_sample_at >= newest_tick[s.target] - 1e-6]
