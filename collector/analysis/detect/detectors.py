"""The detectors: pure functions ``(DetectionWindow, DetectorSettings) ->
list[Finding]``. A *candidate* finding says "the condition holds in this window", with
the numbers behind it in ``evidence`` (units in the keys); the hysteresis
(``collector.analysis.detect.hysteresis``) decides when findings open and resolve."""

from __future__ import annotations

from collections.abc import Callable

from collector.analysis.capacity import idle_instance_equivalents
from collector.analysis.configs import has_own_batcher_choice, operator_preferred_sizes
from collector.analysis.detect.settings import DetectorSettings
from collector.analysis.detect.windows import DetectionWindow, DeviceWindow, ModelWindow
from collector.records import Finding, ModelConfig, ModelRates

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
Evidence = dict[str, float | int | str | bool | None]


def _finding(
    kind: str,
    severity: str,
    subject: str,
    window: ModelWindow | DeviceWindow,
    summary: str,
    evidence: Evidence,
) -> Finding:
    """A candidate finding about ``subject`` over its window."""
    return Finding(
        kind=kind,
        severity=severity,
        target=window.target,
        subject=subject,
        summary=summary,
        window_start=window.window_start,
        window_end=window.window_end,
        evidence=evidence,
    )


def idle_capacity(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """GPUs and MIG instances whose mean utilisation is below ``idle_util_pct``, and
    models whose instances are busy less than ``idle_busy_share`` of the window.

    The idle amount is in device or instance equivalents: a GPU at 25 % has 0.75 GPU
    idle; 2 instances at 20 % busy have 1.6 idle instance-equivalents. Severity is
    ``warning`` when the subject serves traffic, else ``info``.
    """
    devices = [_idle_device(d, settings) for d in window.devices]
    models = [_idle_model(m, settings) for m in window.models]
    return [f for f in devices + models if f is not None]


def _idle_device(d: DeviceWindow, settings: DetectorSettings) -> Finding | None:
    if d.mean_pct >= settings.idle_util_pct:
        return None
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
    summary = (
        f"{unit} {d.uuid}: {reading} {d.mean_pct:.1f}% over "
        f"{d.window_end - d.window_start:.0f} s — {idle:.2f} {unit} idle {why}"
    )
    return _finding(
        IDLE_CAPACITY,
        "warning" if has_traffic else "info",
        d.uuid,
        d,
        summary,
        {
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


def _idle_model(m: ModelWindow, settings: DetectorSettings) -> Finding | None:
    busy = m.rates.busy_share
    if busy is None or m.instances is None or busy >= settings.idle_busy_share:
        return None
    idle = idle_instance_equivalents(m.instances, busy)
    rps = m.rates.requests_per_s
    has_traffic = rps > settings.traffic_rps
    if not has_traffic:
        why = "no traffic: could be unloaded or consolidated"
    elif _queue_above(m.rates, settings.queue_share):
        why = "requests queue anyway: batching or instance count is holding it back"
    else:
        why = f"the load is light for {m.instances} instance(s): fewer would serve it"
    summary = (
        f"{m.model}: {m.instances} instance(s) {busy:.0%} busy at {rps:.1f} req/s "
        f"over {m.rates.window_s:.0f} s — {idle:.2f} idle instance-equivalents; {why}"
    )
    return _finding(
        IDLE_CAPACITY,
        "warning" if has_traffic else "info",
        m.model,
        m,
        summary,
        {
            "busy_share": busy,
            "idle_threshold_busy_share": settings.idle_busy_share,
            "instance_count": m.instances,
            "idle_instances": idle,
            "requests_per_s": rps,
            "queue_share": m.rates.queue_share,
            "samples": m.samples,
            "window_s": m.rates.window_s,
        },
    )


def queue_saturation(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """Models whose queue dominates: queue share above ``queue_share``, the pending
    gauge growing faster than ``pending_growth_per_s``, the queue policy rejecting
    (``REJECTED`` failures above ``reject_per_s``), or — with dynamic batching and
    preferred sizes — batches mostly below the smallest preferred size while queue
    time per request is near ``max_queue_delay`` (the timer, not a preferred size,
    closes the batches). One finding per model; ``evidence["reasons"]`` lists which
    tests held. ``critical`` past ``queue_share_critical`` or when requests are
    rejected, else ``warning``."""
    return _per_model(window, settings, _queue_saturation)


def _queue_saturation(m: ModelWindow, settings: DetectorSettings) -> Finding | None:
    r = m.rates
    held: dict[str, str] = {}  # reason -> its part of the summary
    if _queue_above(r, settings.queue_share):
        held["queue_share"] = f"queue {r.queue_share:.0%} of request time"
    slope = m.pending_slope_per_s
    if slope is not None and slope > settings.pending_growth_per_s and (m.pending_last or 0.0) > 0:
        held["pending_growth"] = f"pending +{slope:.2f}/s to {m.pending_last:g}"
    rejected = r.fail_per_s_by_reason.get(_REJECTED, 0.0)
    if rejected > settings.reject_per_s:
        held["rejects"] = f"{rejected:.2f} rejected/s"
    delay = _delay_limit(m, settings)
    if delay is not None:
        held["delay_limit"] = (
            f"{delay['below_preferred_exec_share']:.0%} of batches below preferred "
            f"{delay['smallest_preferred_batch_size']} at the "
            f"{delay['max_queue_delay_us']} µs delay limit"
        )
    if not held:
        return None
    critical = _queue_above(r, settings.queue_share_critical) or "rejects" in held
    evidence: Evidence = {
        "reasons": ",".join(held),
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
        **(delay or {}),
    }
    summary = f"{m.model}: queue-delay saturation — {'; '.join(held.values())}"
    return _finding(
        QUEUE_SATURATION, "critical" if critical else "warning", m.model, m, summary, evidence
    )


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


def _tunable(m: ModelWindow, *, batching: bool) -> ModelConfig | None:
    """The model's config when it could batch (``max_batch_size`` > 1), its dynamic
    batching is ``batching``, and the choice is its own: ensembles and sequence-batched
    models are left out, their batching is configured elsewhere."""
    config = m.config
    if (
        config is None
        or config.dynamic_batching != batching
        or config.max_batch_size <= 1
        or not has_own_batcher_choice(config)
    ):
        return None
    return config


def batching_off(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """Models that could batch (``max_batch_size`` > 1) but have dynamic batching off
    while their requests overlap: mean in-server requests at or above
    ``concurrency_min``, or at least one request pending on average. Ensembles and
    sequence-batched models are left out: their batching is configured elsewhere.
    ``critical`` when the queue share also passes ``queue_share_critical``."""
    return _per_model(window, settings, _batching_off)


def _batching_off(m: ModelWindow, settings: DetectorSettings) -> Finding | None:
    config = _tunable(m, batching=False)
    r = m.rates
    if config is None or r.requests_per_s <= 0:
        return None
    pending = m.pending_mean or 0.0
    if r.in_server < settings.concurrency_min and pending < _PENDING_CONCURRENT:
        return None
    critical = _queue_above(r, settings.queue_share_critical)
    summary = (
        f"{m.model}: dynamic batching is off with {r.in_server:.1f} requests in "
        f"the server on average at {r.requests_per_s:.1f} req/s "
        f"(max_batch_size {config.max_batch_size}); concurrent requests run "
        "one at a time"
    )
    return _finding(
        BATCHING_OFF,
        "critical" if critical else "warning",
        m.model,
        m,
        summary,
        {
            "in_server_requests": r.in_server,
            "concurrency_threshold": settings.concurrency_min,
            "pending_mean": m.pending_mean,
            "requests_per_s": r.requests_per_s,
            "avg_batch_size": r.avg_batch_size,
            "queue_share": r.queue_share,
            "max_batch_size": config.max_batch_size,
            "instance_count": config.instance_count,
            "samples": m.samples,
            "window_s": r.window_s,
        },
    )


def batch_below_preferred(window: DetectionWindow, settings: DetectorSettings) -> list[Finding]:
    """Models with dynamic batching on and concurrent traffic (mean in-server requests
    at or above ``concurrency_min``) whose average batch is far below what the batcher
    aims at: below ``below_preferred_ratio`` × the smallest preferred size, or, with no
    preferred sizes, below ``below_max_ratio`` × ``max_batch_size``. ``warning`` when
    the queue share also passes ``queue_share`` (requests wait, yet batches stay
    small), else ``info``. Preferred sizes are the operator's: Triton's auto-filled
    ``[max_batch_size]`` is none (``configs.preferred_sizes_origin``), and a batcher
    with neither preferred sizes nor a delay (the recommender's probe) aims at
    nothing, so it is not flagged."""
    return _per_model(window, settings, _batch_below_preferred)


def _batch_below_preferred(m: ModelWindow, settings: DetectorSettings) -> Finding | None:
    config = _tunable(m, batching=True)
    r = m.rates
    avg = r.avg_batch_size
    if config is None or avg is None or r.in_server < settings.concurrency_min:
        return None
    # Triton's own ``[max_batch_size]`` fill is no aim of the operator's; and with no
    # preferred size and no delay (the probe) the batcher waits for nothing: it sends
    # what is queued, so a small batch is the load, not a missed target.
    preferred = operator_preferred_sizes(config)
    if not preferred and config.max_queue_delay_us == 0:
        return None
    if preferred:
        reference, basis = min(preferred), "preferred_batch_size"
        limit = settings.below_preferred_ratio * reference
    else:
        reference, basis = config.max_batch_size, "max_batch_size"
        limit = settings.below_max_ratio * reference
    if avg >= limit:
        return None
    queued = _queue_above(r, settings.queue_share)
    summary = (
        f"{m.model}: average batch {avg:.1f} vs {basis} {reference} with "
        f"{r.in_server:.1f} requests in the server on average "
        f"(max_queue_delay {config.max_queue_delay_us} µs)"
    )
    return _finding(
        BATCH_BELOW_PREFERRED,
        "warning" if queued else "info",
        m.model,
        m,
        summary,
        {
            "avg_batch_size": avg,
            "reference_batch_size": reference,
            "reference": basis,
            "batch_to_reference_ratio": avg / reference,
            "in_server_requests": r.in_server,
            "requests_per_s": r.requests_per_s,
            "queue_share": r.queue_share,
            "max_queue_delay_us": config.max_queue_delay_us,
            "max_batch_size": config.max_batch_size,
            "samples": m.samples,
            "window_s": r.window_s,
        },
    )


def _queue_above(rates: ModelRates, share: float) -> bool:
    """Whether the queue's share of request time is known and above ``share``."""
    return rates.queue_share is not None and rates.queue_share > share


def _per_model(
    window: DetectionWindow,
    settings: DetectorSettings,
    detector: Callable[[ModelWindow, DetectorSettings], Finding | None],
) -> list[Finding]:
    found = [detector(m, settings) for m in window.models]
    return [f for f in found if f is not None]


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
