"""What one evaluation of the detectors looks at: the last ``window_s`` seconds of the
store, reduced to a typed window per subject (a ``ModelWindow`` per (target, model),
a ``DeviceWindow`` per GPU or MIG instance). Rates come from
``collector.analysis.rates``, a model's from its lean readings
(``Store.counter_series``, see ``increases``); the store is read through its methods
(no SQL here)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from collector.analysis.detect.increases import series_increase
from collector.analysis.detect.settings import DetectorSettings
from collector.analysis.health import is_fresh, scrape_interval_s
from collector.analysis.rates import (
    gauge_max,
    gauge_mean,
    merge_over_series,
    rates_from_increase,
)
from collector.records import ModelConfig, ModelRates
from collector.store import Store, StoredDevice, StoredProcess
from collector.store.windows import CounterReading


@dataclass(frozen=True)
class ModelWindow:
    """One (target, model) over one window, summed over its versions.

    ``rates`` are each version's window rates merged over the versions
    (``merge_over_series``: counters across resets, see ``collector.analysis.rates``);
    ``instances`` is the config's instance count times the versions seen (each
    version runs its own instances), ``rates.in_server`` the mean number of requests
    in the server (Little's law). ``pending_*`` describe the pending-request gauge,
    summed over versions (``None`` when Triton does not report it).
    ``batch_executions`` maps each executed batch size to its executions in the
    window (from the statistics API's ``batch_stats``; empty without it).
    """

    target: str
    model: str
    versions: tuple[str, ...]
    window_start: float
    window_end: float
    samples: int
    rates: ModelRates
    config: ModelConfig | None = None
    instances: int | None = None
    pending_mean: float | None = None
    pending_last: float | None = None
    pending_slope_per_s: float | None = None
    batch_executions: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceWindow:
    """One GPU or MIG instance over one window.

    ``metric`` names the reading used (``"sm_active_pct"`` or
    ``"utilization_gpu_pct"``) from ``source`` (``"nvml"`` preferred, ``"triton"`` when
    NVML has no reading for the device); ``target`` is the target that reported it.
    ``traffic_rps`` is the request rate of the Triton models served from the device
    (joined through NVML's per-process readings, or the Triton target that reports it),
    ``None`` when that cannot be known; ``traffic_queue_share`` the highest queue share
    among them.
    """

    target: str
    uuid: str
    kind: str
    name: str | None
    source: str
    metric: str
    window_start: float
    window_end: float
    samples: int
    mean_pct: float
    max_pct: float
    traffic_rps: float | None = None
    traffic_targets: tuple[str, ...] = ()
    traffic_queue_share: float | None = None


@dataclass(frozen=True)
class DetectionWindow:
    """Everything one evaluation looks at: ``[start, end]`` and the subjects in it that
    had enough data to be evaluated."""

    start: float
    end: float
    models: tuple[ModelWindow, ...] = ()
    devices: tuple[DeviceWindow, ...] = ()


# --------------------------------------------------------------------------- reading


def read_window(
    store: Store, settings: DetectorSettings, *, now: float | None = None
) -> DetectionWindow:
    """The window ``[now - window_s, now]`` of every model, device and process in the
    store, reduced to the typed windows the detectors take. A series or device with
    fewer than ``min_samples`` readings in the window is left out (not evaluated), and
    so is one whose newest reading is not fresh at ``now`` (its target is gone, or no
    collector runs): no finding is made from a window without fresh samples."""
    now = time.time() if now is None else now
    start = now - settings.window_s
    configs = {key: c.config for key, c in store.latest_model_configs().items()}
    targets = {t.name: t for t in store.targets()}

    def fresh(target: str, newest: float) -> bool:
        return is_fresh(newest, now, scrape_interval_s(targets.get(target)))

    # Each series' readings, oldest first, of the versions still fresh.
    series: dict[tuple[str, str], dict[str, Sequence[CounterReading]]] = defaultdict(dict)
    for s in store.counter_series(since=start, until=now):
        versions = series[(s.target, s.model)]
        if fresh(s.target, s.readings[-1].collected_at):
            versions[s.version] = s.readings
    models = tuple(
        mw
        for (target, model), versions in sorted(series.items())
        if (mw := _model_window(target, model, versions, configs.get((target, model)), settings))
        is not None
    )
    device_rows = store.device_samples(since=start, until=now)
    newest: dict[tuple[str, str, str], float] = defaultdict(float)
    for d in device_rows:
        key = (d.target, d.sample.source, d.sample.uuid)
        newest[key] = max(newest[key], d.collected_at)
    devices = _device_windows(
        [
            d
            for d in device_rows
            if fresh(d.target, newest[(d.target, d.sample.source, d.sample.uuid)])
        ],
        store.process_samples(since=start, until=now),
        models,
        settings,
    )
    return DetectionWindow(start=start, end=now, models=models, devices=devices)


def _model_window(
    target: str,
    model: str,
    versions: Mapping[str, Sequence[CounterReading]],
    config: ModelConfig | None,
    settings: DetectorSettings,
) -> ModelWindow | None:
    used = {v: s for v, s in sorted(versions.items()) if len(s) >= settings.min_samples}
    if not used:
        return None
    instance_count = max(config.instance_count, 1) if config else None
    increases = [series_increase(s) for s in used.values()]
    rates = merge_over_series(
        [rates_from_increase(i.increase, instance_count=instance_count) for i in increases]
    )
    if rates is None:
        return None
    pending = [_pending(s) for s in used.values()]
    return ModelWindow(
        target=target,
        model=model,
        versions=tuple(used),
        window_start=min(s[0].collected_at for s in used.values()),
        window_end=max(s[-1].collected_at for s in used.values()),
        samples=sum(len(s) for s in used.values()),
        rates=rates,
        config=config,
        instances=instance_count * len(used) if instance_count is not None else None,
        pending_mean=_sum_known(p[0] for p in pending),
        pending_last=_sum_known(p[1] for p in pending),
        pending_slope_per_s=_sum_known(p[2] for p in pending),
        batch_executions=_batch_executions(i.batch_executions for i in increases),
    )


def _batch_executions(series: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """Executions per executed batch size over the window, summed over ``series``."""
    executions: dict[int, int] = defaultdict(int)
    for by_size in series:
        for size, count in by_size.items():
            executions[size] += count
    return dict(sorted(executions.items()))


def _pending(
    readings: Sequence[CounterReading],
) -> tuple[float | None, float | None, float | None]:
    """Mean, last value and least-squares slope (per second) of the pending gauge."""
    points = [(r.collected_at, p) for r in readings if (p := r.pending_request_count) is not None]
    mean = gauge_mean(p for _, p in points)
    if mean is None:
        return None, None, None
    slope = None
    if len(points) >= 2:
        t_mean = sum(t for t, _ in points) / len(points)
        spread = sum((t - t_mean) ** 2 for t, _ in points)
        if spread > 0:
            slope = sum((t - t_mean) * (p - mean) for t, p in points) / spread
    return mean, points[-1][1], slope


def _sum_known(values: Iterable[float | None]) -> float | None:
    """The sum of the known values; ``None`` when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _device_windows(
    devices: Sequence[StoredDevice],
    processes: Sequence[StoredProcess],
    models: Sequence[ModelWindow],
    settings: DetectorSettings,
) -> tuple[DeviceWindow, ...]:
    """One window per device uuid: NVML's readings when it has any for the device
    (SM activity is the better measure of idle capacity than "a kernel was running"),
    else Triton's."""
    by_uuid: dict[str, dict[str, list[StoredDevice]]] = defaultdict(lambda: defaultdict(list))
    for d in devices:
        if d.sample.healthy:
            by_uuid[d.sample.uuid][d.sample.source].append(d)
    traffic = _Traffic(models, processes)
    out: list[DeviceWindow] = []
    for _, by_source in sorted(by_uuid.items()):
        triton_targets = sorted({d.target for d in by_source.get("triton", [])})
        for source in ("nvml", "triton", *sorted(set(by_source) - {"nvml", "triton"})):
            window = _device_window(by_source.get(source, []), settings)
            if window is None:
                continue
            rps, served, queue_share = traffic.of_device(window, triton_targets)
            out.append(
                replace(
                    window,
                    traffic_rps=rps,
                    traffic_targets=served,
                    traffic_queue_share=queue_share,
                )
            )
            break
    return tuple(out)


def _device_window(rows: Sequence[StoredDevice], settings: DetectorSettings) -> DeviceWindow | None:
    if not rows:
        return None
    # One target reports the device: the first by name, should two Triton servers
    # on one host both report the same GPU (their readings are the same).
    target = min(r.target for r in rows)
    rows = [r for r in rows if r.target == target]
    metric = (
        "sm_active_pct"
        if any(r.sample.sm_active_pct is not None for r in rows)
        else "utilization_gpu_pct"
    )
    readings = [
        (r.collected_at, value) for r in rows if (value := getattr(r.sample, metric)) is not None
    ]
    if len(readings) < settings.min_samples:
        return None
    last = rows[-1].sample
    values = [v for _, v in readings]
    return DeviceWindow(
        target=target,
        uuid=last.uuid,
        kind=last.kind,
        name=last.name,
        source=last.source,
        metric=metric,
        window_start=readings[0][0],
        window_end=readings[-1][0],
        samples=len(readings),
        mean_pct=gauge_mean(values) or 0.0,
        max_pct=gauge_max(values) or 0.0,
    )


class _Traffic:
    """Which Triton traffic runs on which device.

    NVML lists the pids on each GPU (role ``"gpu"``, under the host's target); the host
    source lists each Triton target's server and Python-backend stub pids (under the
    Triton target). A server pid on the device means all of that target's models; a
    stub pid means its model only.
    """

    def __init__(self, models: Sequence[ModelWindow], processes: Sequence[StoredProcess]) -> None:
        self._models = {(m.target, m.model): m for m in models}
        self._gpu_pids: dict[tuple[str, str], set[int]] = defaultdict(set)
        self._listing_hosts: set[str] = set()
        self._host_pids: dict[int, set[tuple[str, str | None]]] = defaultdict(set)
        for p in processes:
            s = p.sample
            if s.source == "nvml":
                self._listing_hosts.add(p.target)
                if s.gpu_uuid is not None:
                    self._gpu_pids[(p.target, s.gpu_uuid)].add(s.pid)
            elif s.role == "server":
                self._host_pids[s.pid].add((p.target, None))
            elif s.role == "stub" and s.model is not None:
                self._host_pids[s.pid].add((p.target, s.model))

    def of_device(
        self, device: DeviceWindow, triton_targets: Sequence[str]
    ) -> tuple[float | None, tuple[str, ...], float | None]:
        """(requests/s, targets, highest queue share) of the traffic on ``device``."""
        served: set[tuple[str, str | None]] = set()
        for pid in self._gpu_pids.get((device.target, device.uuid), ()):
            served |= self._host_pids.get(pid, set())
        if not served and triton_targets:
            # Triton reports this GPU: its models may run there (Triton does not say
            # which model runs on which GPU).
            served = {(t, None) for t in triton_targets}
        if not served:
            # NVML lists processes on this host but no Triton process on this device:
            # it serves no Triton traffic. Without any listing the answer is unknown.
            return (0.0, (), None) if device.target in self._listing_hosts else (None, (), None)
        whole = {t for t, m in served if m is None}
        chosen = [m for (t, name), m in self._models.items() if t in whole or (t, name) in served]
        shares = [m.rates.queue_share for m in chosen if m.rates.queue_share is not None]
        return (
            sum(m.rates.requests_per_s for m in chosen),
            tuple(sorted({t for t, _ in served})),
            max(shares, default=None),
        )
