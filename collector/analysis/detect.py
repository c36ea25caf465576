"""Detectors: idle capacity, queue-delay saturation, and batching left on the table.

Three layers, each testable on its own:

1. ``read_window(store, settings, now=...)`` reads the last ``window_s`` seconds from
   the store (through its methods; no SQL here) and reduces them to typed windows per
   subject: a ``ModelWindow`` per (target, model), a ``DeviceWindow`` per GPU or MIG
   instance.
2. The detectors ``idle_capacity``, ``queue_saturation``, ``batching_off`` and
   ``batch_below_preferred`` are pure functions ``(DetectionWindow, DetectorSettings)
   -> list[Finding]``: a *candidate* finding says "the condition holds in this window",
   with the numbers behind it in ``evidence`` (units in the keys).
3. ``run_detectors(store, settings, now=...)`` evaluates them all once and applies
   hysteresis against the store: a condition opens a finding only after holding for
   ``sustain`` consecutive evaluations, refreshes it while it holds, and resolves it
   after ``clear_after`` consecutive clear evaluations, so a finding does not flap.

Severity rules (``Finding.severity``):

* ``idle_capacity`` — ``warning`` when the subject serves traffic (capacity is paid
  for and not used under load), ``info`` when it has none or its traffic is unknown
  (a consolidation opportunity, not a problem).
* ``queue_saturation`` — ``critical`` when queue share exceeds
  ``queue_share_critical`` or the queue policy rejects requests (clients are already
  failing or waiting far longer than compute takes); otherwise ``warning``.
* ``batching_off`` — ``warning``; ``critical`` when queue share also exceeds
  ``queue_share_critical``.
* ``batch_below_preferred`` — ``info``; ``warning`` when queue share also exceeds
  ``queue_share`` (requests wait, yet batches stay small).

Hysteresis state (the per-(kind, target, subject) streak counters) lives in the store
(``Store.detector_streaks``), not in the caller: a restarted collector, or a one-shot
``batchscope`` command, continues the count instead of starting over, and the
scheduler only has to call ``run_detectors`` once per analysis tick.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from collector.analysis.configs import has_own_batcher_choice
from collector.analysis.rates import (
    CounterIncrease,
    batch_stats_increase,
    counter_increase,
    is_reset,
    rates_from_increase,
)
from collector.errors import ConfigError
from collector.records import Finding, ModelConfig, ModelRates, ModelSample
from collector.store import DetectorStreak, Store, StoredDevice, StoredFinding, StoredProcess

__all__ = [
    "BATCHING_OFF",
    "BATCH_BELOW_PREFERRED",
    "DETECTOR_KINDS",
    "IDLE_CAPACITY",
    "QUEUE_SATURATION",
    "DetectionWindow",
    "DetectorSettings",
    "DeviceWindow",
    "ModelWindow",
    "batch_below_preferred",
    "batching_off",
    "detect",
    "detector_job",
    "detector_settings",
    "evaluated_keys",
    "idle_capacity",
    "queue_saturation",
    "read_window",
    "run_detectors",
]

IDLE_CAPACITY = "idle_capacity"
QUEUE_SATURATION = "queue_saturation"
BATCHING_OFF = "batching_off"
BATCH_BELOW_PREFERRED = "batch_below_preferred"
#: The kinds ``run_detectors`` owns; findings of other kinds (``config_applied`` ...)
#: are never updated or resolved by it.
DETECTOR_KINDS = (IDLE_CAPACITY, QUEUE_SATURATION, BATCHING_OFF, BATCH_BELOW_PREFERRED)

# Triton's failure reason for a request its queue policy turned away (queue full or
# queue timeout with timeout_action REJECT).
_REJECTED = "REJECTED"
# batching_off's "requests wait" test: at least one request pending on average.
_PENDING_CONCURRENT = 1.0

Key = tuple[str, str, str]  # (kind, target, subject)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class DetectorSettings:
    """Thresholds of the detectors and their hysteresis. Every field is validated at
    construction; a bad value raises ``ConfigError("analysis.<field>", ...)``.

    Window and hysteresis:

    * ``window_s`` (60) — seconds of samples one evaluation reads. A minute holds 12
      scrapes at the default 5 s interval, enough to smooth single-request noise, and
      with ``sustain`` = 3 a finding opens within about three minutes.
    * ``min_samples`` (3) — samples a model series or device needs in the window to be
      evaluated at all: three samples are two counter increases (one odd scrape cannot
      decide alone) and the fewest points a pending-count slope means anything over.
    * ``sustain`` (3) — consecutive evaluations a condition must hold before a finding
      opens, so a one-window burst opens nothing.
    * ``clear_after`` (3) — consecutive clear evaluations before an open finding
      resolves; symmetric with ``sustain``, so a condition that comes and goes every
      other window neither opens nor, once open, resolves: no flapping.
    * ``stale_after_s`` (900) — an open finding whose subject has had no evaluable
      window for this long (model unloaded, target gone) is resolved. Shorter gaps (a
      target down for a few scrapes) neither hold nor clear a condition.

    Evaluations closer together than half a window read mostly the same samples, so
    such a repeat refreshes open findings but does not advance a streak.

    Idle capacity:

    * ``idle_util_pct`` (30) — a GPU or MIG instance whose mean utilisation over the
      window (NVML ``sm_active_pct`` when GPM has it, else ``utilization_gpu_pct``,
      Triton's ``nv_gpu_utilization`` as the last resort) is below this percentage is
      idle. The production case behind batchscope ran at 15–30 % before batching was
      tuned and 91 % after.
    * ``idle_busy_share`` (0.3) — the same for a model's instances where no GPU
      reading exists (the CPU testbed): ``ModelRates.busy_share`` below it is idle.
    * ``traffic_rps`` (0.1) — requests per second above which a subject "has traffic";
      idle capacity with traffic is held back, without it could be consolidated.

    Queue-delay saturation:

    * ``queue_share`` (0.5) — Δqueue time / Δrequest time above which the queue
      dominates: requests wait longer than they compute.
    * ``queue_share_critical`` (0.8) — queue share above which it is critical.
    * ``pending_growth_per_s`` (0.1) — least-squares slope of the pending-request
      gauge over the window, in requests per second, above which the queue is not
      draining (0.1/s is six more waiting requests a minute).
    * ``reject_per_s`` (0.0) — ``REJECTED`` failures per second above which the queue
      policy counts as rejecting; 0 means any rejection in the window, since a queue
      timeout or full queue always turns clients away.
    * ``delay_limit_queue_ratio`` (0.5) — queue time per request at or above this
      share of ``max_queue_delay_microseconds`` means batches are closed by the delay
      timer: with arrivals spread over the wait, a batch sent when the oldest request
      hits the delay has a mean queue time of about half the delay, while one sent at
      a preferred size waits far less.
    * ``delay_limit_below_share`` (0.5) — share of executions below the smallest
      preferred batch size above which batches form "mostly" below it.

    Batching left on the table:

    * ``concurrency_min`` (1.5) — mean requests in the server (Little's law: L =
      Δrequest duration / window) at or above which traffic counts as concurrent: more
      than one request is usually in flight, so there is something to batch with.
    * ``below_preferred_ratio`` (0.5) — average batch below this × the smallest
      preferred batch size is far below preferred.
    * ``below_max_ratio`` (0.25) — without preferred sizes (the batcher then aims at
      ``max_batch_size``), average batch below this × ``max_batch_size`` is far below.
    """

    window_s: float = 60.0
    min_samples: int = 3
    sustain: int = 3
    clear_after: int = 3
    stale_after_s: float = 900.0
    idle_util_pct: float = 30.0
    idle_busy_share: float = 0.3
    traffic_rps: float = 0.1
    queue_share: float = 0.5
    queue_share_critical: float = 0.8
    pending_growth_per_s: float = 0.1
    reject_per_s: float = 0.0
    delay_limit_queue_ratio: float = 0.5
    delay_limit_below_share: float = 0.5
    concurrency_min: float = 1.5
    below_preferred_ratio: float = 0.5
    below_max_ratio: float = 0.25

    def __post_init__(self) -> None:
        _check_number(self, "window_s", low=0.0)
        _check_int(self, "min_samples", low=2)
        _check_int(self, "sustain", low=1)
        _check_int(self, "clear_after", low=1)
        _check_number(self, "stale_after_s", low=0.0)
        _check_number(self, "idle_util_pct", low=0.0, high=100.0)
        _check_number(self, "idle_busy_share", low=0.0, high=1.0)
        _check_number(self, "traffic_rps", low=0.0, low_inclusive=True)
        _check_number(self, "queue_share", low=0.0, high=1.0)
        _check_number(self, "queue_share_critical", low=0.0, high=1.0)
        if self.queue_share_critical < self.queue_share:
            raise ConfigError(
                "analysis.queue_share_critical",
                f"must be >= queue_share ({self.queue_share:g}), got {self.queue_share_critical!r}",
            )
        _check_number(self, "pending_growth_per_s", low=0.0)
        _check_number(self, "reject_per_s", low=0.0, low_inclusive=True)
        _check_number(self, "delay_limit_queue_ratio", low=0.0)
        _check_number(self, "delay_limit_below_share", low=0.0, high=1.0)
        _check_number(self, "concurrency_min", low=0.0)
        _check_number(self, "below_preferred_ratio", low=0.0, high=1.0)
        _check_number(self, "below_max_ratio", low=0.0, high=1.0)

    @property
    def min_gap_s(self) -> float:
        """Evaluations closer than this to the previous one do not advance a streak."""
        return self.window_s / 2


def _check_number(
    settings: DetectorSettings,
    name: str,
    *,
    low: float,
    high: float | None = None,
    low_inclusive: bool = False,
) -> None:
    value = getattr(settings, name)
    where = f"analysis.{name}"
    bounds = f"{'>=' if low_inclusive else '>'} {low:g}" + (
        f" and <= {high:g}" if high is not None else ""
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(where, f"must be a number {bounds}, got {value!r}")
    if (
        not math.isfinite(value)
        or (value < low if low_inclusive else value <= low)
        or (high is not None and value > high)
    ):
        raise ConfigError(where, f"must be {bounds}, got {value!r}")


def _check_int(settings: DetectorSettings, name: str, *, low: int) -> None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"analysis.{name}", f"must be an integer >= {low}, got {value!r}")


# --------------------------------------------------------------------------- window data


@dataclass(frozen=True)
class ModelWindow:
    """One (target, model) over one window, summed over its versions.

    ``rates`` come from the summed counter increases (across resets, see
    ``collector.analysis.rates``); ``busy_share`` divides by ``instances``, the
    config's instance count times the versions seen (each version runs its own
    instances). ``concurrency`` is the mean number of requests in the server,
    Δrequest duration / window (Little's law). ``pending_*`` describe the
    pending-request gauge (``None`` when Triton does not report it).
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
    concurrency: float
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
    fewer than ``min_samples`` readings in the window is left out (not evaluated)."""
    now = time.time() if now is None else now
    start = now - settings.window_s
    configs = {key: c.config for key, c in store.latest_model_configs().items()}
    series: dict[tuple[str, str], dict[str, list[ModelSample]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for s in store.model_samples(since=start, until=now):
        series[(s.target, s.model)][s.version].append(s)
    models = tuple(
        mw
        for (target, model), versions in sorted(series.items())
        if (mw := _model_window(target, model, versions, configs.get((target, model)), settings))
        is not None
    )
    devices = _device_windows(
        store.device_samples(since=start, until=now),
        store.process_samples(since=start, until=now),
        models,
        settings,
    )
    return DetectionWindow(start=start, end=now, models=models, devices=devices)


def _model_window(
    target: str,
    model: str,
    versions: Mapping[str, Sequence[ModelSample]],
    config: ModelConfig | None,
    settings: DetectorSettings,
) -> ModelWindow | None:
    used = {v: s for v, s in sorted(versions.items()) if len(s) >= settings.min_samples}
    if not used:
        return None
    total = CounterIncrease()
    seconds = 0.0
    executions: dict[int, int] = defaultdict(int)
    pending_mean: float | None = None
    pending_last: float | None = None
    pending_slope: float | None = None
    for samples in used.values():
        inc = CounterIncrease()
        for prev, cur in zip(samples, samples[1:], strict=False):
            inc.add(counter_increase(prev, cur))
            if cur.stats is not None:
                reset = is_reset(prev, cur) or prev.stats is None
                before = prev.stats.batch_stats if prev.stats else None
                for b in batch_stats_increase(before, cur.stats.batch_stats, reset=reset):
                    executions[b.batch_size] += b.exec_count
        # Versions share the wall-clock window: their increases add up, their
        # durations do not.
        seconds = max(seconds, inc.seconds)
        inc.seconds = 0.0
        total.add(inc)
        mean, last, slope = _pending(samples)
        pending_mean = _add_optional(pending_mean, mean)
        pending_last = _add_optional(pending_last, last)
        pending_slope = _add_optional(pending_slope, slope)
    total.seconds = seconds
    instances = max(config.instance_count, 1) * len(used) if config else None
    rates = rates_from_increase(total, instance_count=instances)
    return ModelWindow(
        target=target,
        model=model,
        versions=tuple(used),
        window_start=min(s[0].collected_at for s in used.values()),
        window_end=max(s[-1].collected_at for s in used.values()),
        samples=sum(len(s) for s in used.values()),
        rates=rates,
        concurrency=total.request_duration_us / 1e6 / seconds if seconds > 0 else 0.0,
        config=config,
        instances=instances,
        pending_mean=pending_mean,
        pending_last=pending_last,
        pending_slope_per_s=pending_slope,
        batch_executions=dict(sorted(executions.items())),
    )


def _pending(samples: Sequence[ModelSample]) -> tuple[float | None, float | None, float | None]:
    """Mean, last value and least-squares slope (per second) of the pending gauge."""
    points = [
        (s.collected_at, p) for s in samples if (p := s.metrics.pending_request_count) is not None
    ]
    if not points:
        return None, None, None
    mean = sum(p for _, p in points) / len(points)
    slope = None
    if len(points) >= 2:
        t_mean = sum(t for t, _ in points) / len(points)
        spread = sum((t - t_mean) ** 2 for t, _ in points)
        if spread > 0:
            slope = sum((t - t_mean) * (p - mean) for t, p in points) / spread
    return mean, points[-1][1], slope


def _add_optional(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else a + b


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
        mean_pct=sum(values) / len(values),
        max_pct=max(values),
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


# --------------------------------------------------------------------------- detectors


def idle_capacity(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """GPUs and MIG instances whose mean utilisation is below ``idle_util_pct``, and
    models whose instances are busy less than ``idle_busy_share`` of the window.

    The idle amount is in device or instance equivalents: a GPU at 25 % has 0.75 GPU
    idle; 2 instances at 20 % busy have 1.6 idle instance-equivalents.
    """
    found: list[Finding] = []
    for d in window.devices:
        if d.mean_pct >= settings.idle_util_pct:
            continue
        idle = min(max(1.0 - d.mean_pct / 100.0, 0.0), 1.0)
        unit = "MIG instance" if d.kind == "mig" else "GPU"
        has_traffic = None if d.traffic_rps is None else d.traffic_rps > settings.traffic_rps
        reading = "SM active" if d.metric == "sm_active_pct" else "utilisation"
        if has_traffic:
            queued = (d.traffic_queue_share or 0.0) > settings.queue_share
            why = f"while serving {d.traffic_rps:.1f} req/s; " + (
                "requests queue: batching or instance count is holding it back"
                if queued
                else "the load is light: bigger batches or consolidation would use it"
            )
        elif has_traffic is None:
            why = "(traffic on it unknown)"
        else:
            why = "with no traffic; could be consolidated"
        found.append(
            Finding(
                kind=IDLE_CAPACITY,
                severity="warning" if has_traffic else "info",
                target=d.target,
                subject=d.uuid,
                summary=(
                    f"{unit} {d.uuid}: {reading} {d.mean_pct:.1f}% over "
                    f"{d.window_end - d.window_start:.0f} s — {idle:.2f} {unit} idle {why}"
                ),
                window_start=d.window_start,
                window_end=d.window_end,
                evidence={
                    "device_kind": d.kind,
                    "device_name": d.name,
                    "source": d.source,
                    "metric": d.metric,
                    "utilization_pct": d.mean_pct,
                    "utilization_pct_max": d.max_pct,
                    "idle_threshold_pct": settings.idle_util_pct,
                    "idle_devices": idle,
                    "traffic_rps": d.traffic_rps,
                    "traffic_targets": ",".join(d.traffic_targets),
                    "traffic_queue_share": d.traffic_queue_share,
                    "samples": d.samples,
                    "window_s": d.window_end - d.window_start,
                },
            )
        )
    for m in window.models:
        busy = m.rates.busy_share
        if busy is None or m.instances is None or busy >= settings.idle_busy_share:
            continue
        idle = m.instances * (1.0 - min(max(busy, 0.0), 1.0))
        rps = m.rates.requests_per_s
        has_traffic = rps > settings.traffic_rps
        queue_share = m.rates.queue_share
        if not has_traffic:
            why = "no traffic: could be unloaded or consolidated"
        elif queue_share is not None and queue_share > settings.queue_share:
            why = "requests queue anyway: batching or instance count is holding it back"
        else:
            why = f"the load is light for {m.instances} instance(s): fewer would serve it"
        found.append(
            Finding(
                kind=IDLE_CAPACITY,
                severity="warning" if has_traffic else "info",
                target=m.target,
                subject=m.model,
                summary=(
                    f"{m.model}: {m.instances} instance(s) {busy:.0%} busy at {rps:.1f} req/s "
                    f"over {m.rates.window_s:.0f} s — {idle:.2f} idle instance-equivalents; {why}"
                ),
                window_start=m.window_start,
                window_end=m.window_end,
                evidence={
                    "busy_share": busy,
                    "idle_threshold_busy_share": settings.idle_busy_share,
                    "instance_count": m.instances,
                    "idle_instances": idle,
                    "requests_per_s": rps,
                    "queue_share": queue_share,
                    "samples": m.samples,
                    "window_s": m.rates.window_s,
                },
            )
        )
    return found


def queue_saturation(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """Models whose queue dominates: queue share above ``queue_share``, the pending
    gauge growing faster than ``pending_growth_per_s``, the queue policy rejecting
    (``REJECTED`` failures above ``reject_per_s``), or — with dynamic batching and
    preferred sizes — batches mostly below the smallest preferred size while queue
    time per request is near ``max_queue_delay`` (the timer, not a preferred size,
    closes the batches). One finding per model; ``evidence["reasons"]`` lists which
    tests held."""
    found: list[Finding] = []
    for m in window.models:
        r = m.rates
        reasons: list[str] = []
        parts: list[str] = []
        if r.queue_share is not None and r.queue_share > settings.queue_share:
            reasons.append("queue_share")
            parts.append(f"queue {r.queue_share:.0%} of request time")
        slope = m.pending_slope_per_s
        if (
            slope is not None
            and slope > settings.pending_growth_per_s
            and (m.pending_last or 0.0) > 0
        ):
            reasons.append("pending_growth")
            parts.append(f"pending +{slope:.2f}/s to {m.pending_last:g}")
        rejected = r.fail_per_s_by_reason.get(_REJECTED, 0.0)
        if rejected > settings.reject_per_s:
            reasons.append("rejects")
            parts.append(f"{rejected:.2f} rejected/s")
        delay = _delay_limit(m, settings)
        if delay is not None:
            reasons.append("delay_limit")
            parts.append(
                f"{delay['below_preferred_exec_share']:.0%} of batches below preferred "
                f"{delay['smallest_preferred_batch_size']} at the "
                f"{delay['max_queue_delay_us']} µs delay limit"
            )
        if not reasons:
            continue
        critical = (r.queue_share or 0.0) > settings.queue_share_critical or "rejects" in reasons
        evidence: dict[str, float | int | str | bool | None] = {
            "reasons": ",".join(reasons),
            "queue_share": r.queue_share,
            "queue_us_per_request": r.queue_us_per_request,
            "request_us_per_request": r.request_us_per_request,
            "requests_per_s": r.requests_per_s,
            "rejected_per_s": rejected,
            "pending_mean": m.pending_mean,
            "pending_last": m.pending_last,
            "pending_slope_per_s": slope,
            "avg_batch_size": r.avg_batch_size,
            "samples": m.samples,
            "window_s": r.window_s,
        }
        if delay is not None:
            evidence.update(delay)
        found.append(
            Finding(
                kind=QUEUE_SATURATION,
                severity="critical" if critical else "warning",
                target=m.target,
                subject=m.model,
                summary=f"{m.model}: queue-delay saturation — {'; '.join(parts)}",
                window_start=m.window_start,
                window_end=m.window_end,
                evidence=evidence,
            )
        )
    return found


def _delay_limit(m: ModelWindow, settings: DetectorSettings) -> dict[str, float | int] | None:
    """The "batches form at the delay limit" test; its evidence when it holds."""
    config = m.config
    if (
        config is None
        or not config.dynamic_batching
        or not config.preferred_batch_sizes
        or config.max_queue_delay_us <= 0
        or m.rates.queue_us_per_request is None
    ):
        return None
    total = sum(m.batch_executions.values())
    if total <= 0:
        return None
    smallest = min(config.preferred_batch_sizes)
    below = sum(n for size, n in m.batch_executions.items() if size < smallest) / total
    queue_ratio = m.rates.queue_us_per_request / config.max_queue_delay_us
    if below < settings.delay_limit_below_share or queue_ratio < settings.delay_limit_queue_ratio:
        return None
    return {
        "below_preferred_exec_share": below,
        "smallest_preferred_batch_size": smallest,
        "max_queue_delay_us": config.max_queue_delay_us,
        "queue_to_delay_ratio": queue_ratio,
        "executions": total,
    }


def batching_off(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """Models that could batch (``max_batch_size`` > 1) but have dynamic batching off
    while their requests overlap: mean in-server requests at or above
    ``concurrency_min``, or at least one request pending on average. Ensembles and
    sequence-batched models are left out: their batching is configured elsewhere."""
    found: list[Finding] = []
    for m in window.models:
        config = m.config
        if (
            config is None
            or config.dynamic_batching
            or config.max_batch_size <= 1
            or not has_own_batcher_choice(config)
            or m.rates.requests_per_s <= 0
        ):
            continue
        pending = m.pending_mean or 0.0
        if m.concurrency < settings.concurrency_min and pending < _PENDING_CONCURRENT:
            continue
        queue_share = m.rates.queue_share
        critical = queue_share is not None and queue_share > settings.queue_share_critical
        found.append(
            Finding(
                kind=BATCHING_OFF,
                severity="critical" if critical else "warning",
                target=m.target,
                subject=m.model,
                summary=(
                    f"{m.model}: dynamic batching is off with {m.concurrency:.1f} requests in "
                    f"the server on average at {m.rates.requests_per_s:.1f} req/s "
                    f"(max_batch_size {config.max_batch_size}); concurrent requests run "
                    "one at a time"
                ),
                window_start=m.window_start,
                window_end=m.window_end,
                evidence={
                    "in_server_requests": m.concurrency,
                    "concurrency_threshold": settings.concurrency_min,
                    "pending_mean": m.pending_mean,
                    "requests_per_s": m.rates.requests_per_s,
                    "avg_batch_size": m.rates.avg_batch_size,
                    "queue_share": queue_share,
                    "max_batch_size": config.max_batch_size,
                    "instance_count": config.instance_count,
                    "samples": m.samples,
                    "window_s": m.rates.window_s,
                },
            )
        )
    return found


def batch_below_preferred(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """Models with dynamic batching on and concurrent traffic (mean in-server requests
    at or above ``concurrency_min``) whose average batch is far below what the batcher
    aims at: below ``below_preferred_ratio`` × the smallest preferred size, or, with no
    preferred sizes, below ``below_max_ratio`` × ``max_batch_size``."""
    found: list[Finding] = []
    for m in window.models:
        config = m.config
        avg = m.rates.avg_batch_size
        if (
            config is None
            or not config.dynamic_batching
            or config.max_batch_size <= 1
            or not has_own_batcher_choice(config)
            or avg is None
            or m.concurrency < settings.concurrency_min
        ):
            continue
        if config.preferred_batch_sizes:
            reference, basis = min(config.preferred_batch_sizes), "preferred_batch_size"
            limit = settings.below_preferred_ratio * reference
        else:
            reference, basis = config.max_batch_size, "max_batch_size"
            limit = settings.below_max_ratio * reference
        if avg >= limit:
            continue
        queue_share = m.rates.queue_share
        queued = queue_share is not None and queue_share > settings.queue_share
        found.append(
            Finding(
                kind=BATCH_BELOW_PREFERRED,
                severity="warning" if queued else "info",
                target=m.target,
                subject=m.model,
                summary=(
                    f"{m.model}: average batch {avg:.1f} vs {basis} {reference} with "
                    f"{m.concurrency:.1f} requests in the server on average "
                    f"(max_queue_delay {config.max_queue_delay_us} µs)"
                ),
                window_start=m.window_start,
                window_end=m.window_end,
                evidence={
                    "avg_batch_size": avg,
                    "reference_batch_size": reference,
                    "reference": basis,
                    "batch_to_reference_ratio": avg / reference,
                    "in_server_requests": m.concurrency,
                    "requests_per_s": m.rates.requests_per_s,
                    "queue_share": queue_share,
                    "max_queue_delay_us": config.max_queue_delay_us,
                    "max_batch_size": config.max_batch_size,
                    "samples": m.samples,
                    "window_s": m.rates.window_s,
                },
            )
        )
    return found


_DETECTORS = (idle_capacity, queue_saturation, batching_off, batch_below_preferred)


def detect(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """Every detector's candidate findings for one window."""
    return [f for detector in _DETECTORS for f in detector(window, settings)]


def evaluated_keys(window: DetectionWindow) -> set[Key]:
    """The (kind, target, subject)s this window had the data to decide: a key in it
    without a candidate finding is *clear*; a key outside it is unknown this time."""
    keys: set[Key] = set()
    for m in window.models:
        keys |= {
            (QUEUE_SATURATION, m.target, m.model),
            (BATCHING_OFF, m.target, m.model),
            (BATCH_BELOW_PREFERRED, m.target, m.model),
        }
        if m.rates.busy_share is not None and m.instances is not None:
            keys.add((IDLE_CAPACITY, m.target, m.model))
    keys |= {(IDLE_CAPACITY, d.target, d.uuid) for d in window.devices}
    return keys


# --------------------------------------------------------------------------- hysteresis


def run_detectors(
    store: Store, settings: DetectorSettings, *, now: float | None = None
) -> list[StoredFinding]:
    """Evaluate every detector on the window ending at ``now`` and apply hysteresis
    against the store; returns the active findings (of every kind) afterwards.

    Per (kind, target, subject), one evaluation:

    * condition holds — the holding streak grows (the clear streak resets); an open
      finding is refreshed (severity, summary, ``window_end``, evidence); without
      one, a finding opens once the streak reaches ``sustain``, its ``window_start``
      the start of the streak's first window;
    * condition clear (the subject was evaluated, no candidate) — the holding streak
      resets; an open finding's clear streak grows and it resolves at ``clear_after``;
    * no data (too few samples, target down) — nothing changes, except that an open
      finding whose ``window_end`` is older than ``stale_after_s`` resolves, and a
      streak not evaluated for that long is forgotten.

    Streaks are kept in the store (``Store.replace_detector_streaks``). Call it once
    per analysis tick; a call less than ``settings.min_gap_s`` after the previous one
    refreshes open findings but does not count as another evaluation.
    """
    now = time.time() if now is None else now
    window = read_window(store, settings, now=now)
    candidates: dict[Key, Finding] = {}
    for f in detect(window, settings):
        candidates[(f.kind, f.target, f.subject)] = f
    evaluated = evaluated_keys(window)
    streaks = {s.key: s for s in store.detector_streaks()}
    active = _active_by_key(store, now)

    kept: list[DetectorStreak] = []
    for key in sorted(set(candidates) | set(streaks) | set(active)):
        streak = streaks.get(key) or DetectorStreak(*key)
        counts = now - streak.evaluated_at >= settings.min_gap_s
        finding = active.get(key)
        candidate = candidates.get(key)
        if candidate is not None:
            if counts:
                streak = replace(
                    streak,
                    holding=streak.holding + 1,
                    clearing=0,
                    since=streak.since if streak.holding > 0 else candidate.window_start,
                    evaluated_at=now,
                )
            if finding is not None:
                store.update_finding(
                    finding.id,
                    severity=candidate.severity,
                    summary=candidate.summary,
                    window_end=candidate.window_end,
                    evidence=candidate.evidence,
                )
            elif streak.holding >= settings.sustain:
                store.add_finding(
                    kind=candidate.kind,
                    severity=candidate.severity,
                    target=candidate.target,
                    subject=candidate.subject,
                    summary=candidate.summary,
                    window_start=(
                        streak.since if streak.since is not None else candidate.window_start
                    ),
                    window_end=candidate.window_end,
                    evidence=candidate.evidence,
                    created_at=now,
                )
        elif key in evaluated:
            if counts:
                streak = replace(
                    streak,
                    holding=0,
                    clearing=streak.clearing + 1 if finding is not None else 0,
                    since=None,
                    evaluated_at=now,
                )
            if finding is not None and streak.clearing >= settings.clear_after:
                store.resolve_finding(finding.id, now)
                continue
        elif finding is not None and now - finding.window_end > settings.stale_after_s:
            store.resolve_finding(finding.id, now)
            continue
        elif finding is None and now - streak.evaluated_at > settings.stale_after_s:
            continue  # a streak whose subject went away: forget it
        if streak.holding > 0 or finding is not None:
            kept.append(streak)
    store.replace_detector_streaks(kept)
    return store.active_findings()


def _active_by_key(store: Store, now: float) -> dict[Key, StoredFinding]:
    """Open findings of the detectors' kinds by key. Should a key have two (a crash
    between writes), the oldest stays and the others are resolved."""
    active: dict[Key, StoredFinding] = {}
    for f in store.active_findings():
        if f.kind not in DETECTOR_KINDS:
            continue
        key = (f.kind, f.target, f.subject)
        if key in active:
            store.resolve_finding(f.id, now)
        else:
            active[key] = f
    return active


def detector_settings(raw: Mapping[str, object]) -> DetectorSettings:
    """``DetectorSettings`` from the ``analysis:`` section of the settings file."""
    known = {f.name for f in fields(DetectorSettings)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"analysis.{key}",
                              f"unknown setting; known: {', '.join(sorted(known))}")
    return DetectorSettings(**raw)  # type: ignore[arg-type]  (validated in __post_init__)


def detector_job(settings: DetectorSettings | None = None,
                 ) -> Callable[[Store, float], list[StoredFinding]]:
    """The detectors as a scheduler analysis (``CollectorService(analyses=[...])``)."""
    chosen = settings or DetectorSettings()

    def run_detectors_job(store: Store, now: float) -> list[StoredFinding]:
        return run_detectors(store, chosen, now=now)

    return run_detectors_job
