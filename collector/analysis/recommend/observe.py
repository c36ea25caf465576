"""Observing one model: what the store holds of it over the look-back
(:func:`read_history`, the only store reads of the recommender), reduced by pure
functions to the inputs of the batcher model (:func:`observation_from`)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from collector.analysis.configs import effective_batcher
from collector.analysis.fit import (
    ServiceTimeFit,
    arrival_stats,
    fit_service_time,
    mean_execution_ms,
)
from collector.analysis.health import DEFAULT_INTERVAL_S, is_fresh, scrape_interval_s
from collector.analysis.rates import (
    gauge_mean,
    increase_from_rates,
    window_batch_stats,
    window_rates,
)
from collector.analysis.recommend.settings import DEFAULT_SETTINGS, RecommendSettings
from collector.records import (
    BatcherConfig,
    BatchStat,
    HostFacts,
    ModelConfig,
    ModelRates,
    ModelSample,
)
from collector.sources.triton import REQUEST_SUMMARY
from collector.store import Store, StoredModelConfig, StoredProcess, StoredServer

SUMMARY_MAX_AGE_S = 60.0  # prometheus-cpp's default sliding window for summaries
_RELOAD_LEAD_S = 2.0  # a reload starts this long, at most, before its config is seen

Evidence = dict[str, float | int | str | bool | None]


@dataclass(frozen=True)
class ModelHistory:
    """What the store holds of one model over the look-back ``[since, until]``: the
    raw material of an :class:`Observation`.

    ``config`` is the latest stored config, ``config_changes`` the times at which a
    changed config was seen (the first stored config is not a change). ``processes``
    are the host source's readings of the model's instances, ``servers`` Triton's
    server-wide metrics, ``host`` the facts of the machine the target runs on
    (``None`` when the host source never reported them)."""

    target: str
    model: str
    since: float
    until: float
    samples: tuple[ModelSample, ...]
    config: StoredModelConfig | None
    config_changes: tuple[float, ...] = ()
    processes: tuple[StoredProcess, ...] = ()
    servers: tuple[StoredServer, ...] = ()
    host: HostFacts | None = None
    interval_s: float = DEFAULT_INTERVAL_S  # how often the target is scraped


@dataclass(frozen=True)
class Observation:
    """What the store shows of one model over a window, reduced to model inputs."""

    target: str
    model: str
    window_start: float
    window_end: float
    rates: ModelRates
    config: ModelConfig
    batcher: BatcherConfig
    batch_increase: tuple[BatchStat, ...]  # over the look-back, summed across reloads
    fit: ServiceTimeFit | None
    in_server: float  # L: mean number of requests inside the server
    population: int | None  # closed-loop clients, None for an open load
    think_ms: float  # Z: client-side time per request outside the server
    least_think_ms: float  # the least Z of the look-back's operating points
    request_batch: int  # samples per request
    dispersion: float  # index of dispersion of arrivals per scrape interval
    overhead_ms: float  # instance time per execution outside the measured compute
    cpu_fraction: float  # CPU share of an execution (KIND_CPU instances)
    cores_available: float | None
    server_p95_ms: float | None  # from Triton's request summary, when enabled
    pending_mean: float | None
    evidence: Evidence = field(default_factory=dict)


def observe_model(
    store: Store,
    target: str,
    model: str,
    *,
    settings: RecommendSettings = DEFAULT_SETTINGS,
    now: float | None = None,
) -> Observation | None:
    """The model's window ending at ``now``, or None when fewer than three samples or
    no requests were seen in it, or its newest sample is stale at ``now``."""
    now = time.time() if now is None else now
    return observation_from(
        read_history(store, target, model, settings=settings, now=now), settings
    )


def observe_windows(
    store: Store,
    target: str,
    model: str,
    *,
    settings: RecommendSettings = DEFAULT_SETTINGS,
    now: float | None = None,
) -> tuple[Observation, ...]:
    """The window ending at ``now`` (first), then the earlier windows of the same
    length ending ``window_offsets`` × ``window_s`` before it that the same config
    served: what the advice would have been computed from moments ago, for the
    uncertainty of a gain (``choice``). Empty when the window at ``now`` gives nothing."""
    now = time.time() if now is None else now
    history = read_history(store, target, model, settings=settings, now=now)
    lookback = lookback_of(history, settings)
    latest = observation_from(history, settings, lookback)
    if latest is None:
        return ()
    out = [latest]
    # Without a slope there is nothing to tune, so nothing to compare across windows.
    offsets = settings.window_offsets if latest.fit and latest.fit.slope_identified else ()
    for offset in offsets:
        earlier = observation_from(
            _history_until(history, now - offset * settings.window_s), settings, lookback
        )
        if earlier is not None and earlier.batcher == latest.batcher:
            out.append(earlier)
    return tuple(out)


def _history_until(history: ModelHistory, until: float) -> ModelHistory:
    """``history`` as it stood at ``until`` (the same stored config)."""
    return replace(
        history,
        until=until,
        samples=tuple(s for s in history.samples if s.collected_at <= until),
        processes=tuple(p for p in history.processes if p.collected_at <= until),
        servers=tuple(s for s in history.servers if s.collected_at <= until),
    )


def read_history(
    store: Store, target: str, model: str, *, settings: RecommendSettings, now: float
) -> ModelHistory:
    """Everything the recommender reads of ``model`` on ``target``: the look-back
    ``[now - lookback_s, now]``."""
    since = now - settings.lookback_s
    return ModelHistory(
        target=target,
        model=model,
        since=since,
        until=now,
        samples=tuple(store.model_samples(target=target, model=model, since=since, until=now)),
        config=store.latest_model_configs(target).get((target, model)),
        config_changes=tuple(
            c.collected_at for c in store.model_configs(target=target, model=model)
        )[1:],
        processes=tuple(
            store.process_samples(target=target, model=model, source="host", since=since, until=now)
        ),
        servers=tuple(store.server_samples(target=target, since=since, until=now)),
        host=store.host_facts(target),
        interval_s=scrape_interval_s(next((t for t in store.targets() if t.name == target), None)),
    )


# ------------------------------------------------------------------ the pure part


@dataclass(frozen=True)
class Lookback:
    """What an observation reads from the whole look-back rather than its window: the
    summed batch_stats increases (the cost curve's data) and the saturated stretches
    (closed-loop operating points, each with its end time). Computed once per
    history; the earlier windows of ``observe_windows`` share it (their cost curve is
    the look-back's, and they keep the stretches that ended by their own end)."""

    batches: tuple[BatchStat, ...]
    stretches: tuple[tuple[float, ModelRates], ...]


def lookback_of(history: ModelHistory, settings: RecommendSettings) -> Lookback:
    return Lookback(
        batches=window_batch_stats(history.samples),
        stretches=tuple(_saturated_stretches(history, settings)),
    )


def observation_from(
    history: ModelHistory, settings: RecommendSettings, lookback: Lookback | None = None
) -> Observation | None:
    """The model inputs of the window ending at ``history.until`` (now); None when
    fewer than three samples or no requests were seen in it, no config is known, or
    the newest sample is stale (``health.is_fresh`` at the target's scrape interval,
    the rule status and detection judge by).
    ``lookback`` defaults to ``history``'s own."""
    history_samples = history.samples
    if len(history_samples) < 3 or history.config is None:
        return None
    # Only from fresh data: a model whose newest sample is stale at ``until`` (now)
    # gets nothing, and the window ends at now, not at its last sample.
    if not is_fresh(history_samples[-1].collected_at, history.until, history.interval_s):
        return None
    stored = history.config
    end = history.until
    # The load must have been served by the current config, after it settled: a fresh
    # (re)load runs slower for its first seconds.
    changed = bool(history.config_changes)
    start = end - settings.window_s
    if changed:
        start = max(start, stored.collected_at + settings.settle_s)
    window = [s for s in history_samples if s.collected_at >= start]
    if len(window) < 3:
        return None
    config = stored.config
    batcher = effective_batcher(config)
    rates = window_rates(window, instance_count=batcher.instance_count)
    if rates is None or rates.requests_per_s <= 0:
        return None
    lookback = lookback or lookback_of(history, settings)
    batches = lookback.batches
    stretches = [r for ended, r in lookback.stretches if ended <= history.until]
    loop = _closed_loop(stretches, rates, batcher)
    exec_ms, overhead_ms = _overhead(window, rates, batcher, saturated=loop.saturated)
    cpu = _cpu_share(history, config, rates, batcher, window[0].collected_at, end)
    summary_ok = not changed or end - stored.collected_at >= SUMMARY_MAX_AGE_S
    return Observation(
        target=history.target,
        model=history.model,
        window_start=window[0].collected_at,
        window_end=end,
        rates=rates,
        config=config,
        batcher=batcher,
        batch_increase=batches,
        fit=fit_service_time(batches),
        in_server=rates.in_server,
        population=loop.population,
        think_ms=loop.think_ms,
        least_think_ms=loop.least_think_ms,
        request_batch=_request_batch(rates, batcher),
        dispersion=_dispersion(window),
        overhead_ms=overhead_ms,
        cpu_fraction=cpu.fraction,
        cores_available=cpu.cores,
        server_p95_ms=_server_p95_ms(window[-1]) if summary_ok else None,
        pending_mean=gauge_mean(s.metrics.pending_request_count for s in window),
        evidence={
            "saturated": loop.saturated,
            "exec_ms_window": exec_ms,
            "host_cpu_count": cpu.host_cpu_count,
            **cpu.evidence,
        },
    )


def _request_batch(rates: ModelRates, batcher: BatcherConfig) -> int:
    """Samples per request: without dynamic batching every execution is one request."""
    if not batcher.dynamic_batching and rates.avg_batch_size:
        return max(1, round(rates.avg_batch_size))
    if rates.requests_per_s > 0:
        return max(1, round(rates.inferences_per_s / rates.requests_per_s))
    return 1


def _dispersion(window: Sequence[ModelSample]) -> float:
    """Index of dispersion of the requests per scrape (1, Poisson, when too few)."""
    increases = [increase_from_rates(s.rates) for s in window[1:] if s.rates]
    if len(increases) < 3:
        return 1.0
    return arrival_stats(
        [i.counters["request_success"] for i in increases], [i.seconds for i in increases]
    ).dispersion


def _server_p95_ms(newest: ModelSample) -> float | None:
    """Triton's request-summary p95, when summaries are enabled. Its quantiles cover
    a sliding minute: the caller only asks a minute after a config change."""
    summary = newest.metrics.summary_quantiles_us.get(REQUEST_SUMMARY)
    if summary and 0.95 in summary:
        return summary[0.95] / 1000.0
    return None


# ------------------------------------------------------------------ the load


@dataclass(frozen=True)
class _ClosedLoop:
    """The look-back read as a closed loop of clients, when it is saturated."""

    saturated: bool
    population: int | None = None
    think_ms: float = 0.0
    least_think_ms: float = 0.0


def _chunks(samples: Sequence[ModelSample], seconds: float) -> list[list[ModelSample]]:
    out: list[list[ModelSample]] = []
    current: list[ModelSample] = []
    for s in samples:
        if current and s.collected_at - current[0].collected_at > seconds:
            out.append(current)
            current = [current[-1]]
        current.append(s)
    if len(current) >= 2:
        out.append(current)
    return out


def _population(points: Sequence[tuple[float, float]]) -> int:
    """Clients of a closed loop from (throughput λ, requests in server L) points.

    Each client is either in the server or in its own client time ``Z``, so
    ``L = N − Z·λ``: the busiest point bounds ``N`` from below (``⌈L⌉``, exact when
    ``Z·λ < 1`` there, as for clients that send again as soon as they are answered).
    Points at other throughputs do not pin ``N`` down further, because ``Z`` itself
    grows with load (clients and server share CPUs), which a fit of ``L`` on ``λ``
    would read as more clients; the bound is kept.
    """
    return max(1, math.ceil(max(in_server for _, in_server in points) - 0.05))


def _saturated_stretches(
    history: ModelHistory,
    settings: RecommendSettings,
) -> list[tuple[float, ModelRates]]:
    """Saturated stretches of the look-back, away from config changes (a reload
    stalls the clients): closed-loop operating points, with the time each ends."""
    changes = history.config_changes
    return [
        (c[-1].collected_at, r)
        for c in _chunks(history.samples, settings.window_s / 3)
        if not any(
            c[0].collected_at - settings.settle_s <= t <= c[-1].collected_at + _RELOAD_LEAD_S
            for t in changes
        )
        and (r := window_rates(c)) is not None
        and r.requests_per_s > 0
        and (r.queue_share or 0.0) >= 0.2
        and r.in_server >= 1.5
    ]


def _closed_loop(
    stretches: Sequence[ModelRates], rates: ModelRates, batcher: BatcherConfig
) -> _ClosedLoop:
    in_server = rates.in_server
    if not ((rates.queue_share or 0.0) >= 0.2 and in_server >= batcher.instance_count + 0.5):
        return _ClosedLoop(saturated=False)
    population = _population(
        [(r.requests_per_s, r.in_server) for r in stretches] + [(rates.requests_per_s, in_server)]
    )
    think_ms = max(population - in_server, 0.0) / rates.requests_per_s * 1000.0
    # The least client time is the one least inflated by queueing at the clients.
    least_think_ms = min(
        [max(population - r.in_server, 0.0) / r.requests_per_s * 1000.0 for r in stretches]
        + [think_ms]
    )
    return _ClosedLoop(
        saturated=True, population=population, think_ms=think_ms, least_think_ms=least_think_ms
    )


# ------------------------------------------------------------------ the instances


def _overhead(
    window: Sequence[ModelSample], rates: ModelRates, batcher: BatcherConfig, *, saturated: bool
) -> tuple[float | None, float]:
    """(mean measured execution time in ms or None, instance time per execution
    outside it in ms)."""
    exec_ms = mean_execution_ms(window_batch_stats(window))
    overhead_ms = 0.0
    if saturated and exec_ms is not None and rates.executions_per_s > 0:
        # Instances never idle while requests queue: the gap between executions is time
        # an instance spends outside the measured compute (IPC, scheduling).
        per_exec_ms = batcher.instance_count / rates.executions_per_s * 1000.0
        overhead_ms = min(max(per_exec_ms - exec_ms, 0.0), exec_ms)
    return exec_ms, overhead_ms


@dataclass(frozen=True)
class _CpuShare:
    fraction: float = 0.0  # CPU share of an execution
    cores: float | None = None  # cores left for the model; None: contention not modelled
    host_cpu_count: int | None = None
    evidence: Evidence = field(default_factory=dict)


def _cpu_share(
    history: ModelHistory,
    config: ModelConfig,
    rates: ModelRates,
    batcher: BatcherConfig,
    since: float,
    until: float,
) -> _CpuShare:
    """CPU share of an execution and the cores left for the model, for CPU instances,
    over ``[since, until]``.

    The cores are the Triton host's (``HostFacts.cpu_count``), less what the rest of
    the server uses. When the host's CPU count is unknown (no host facts stored for
    the target, e.g. a database written by an older collector), contention is not
    modelled rather than guessed: the CPU count of the machine running this analysis
    says nothing about the Triton host's, and a wrong count would invent or hide a
    bottleneck. The evidence says so."""
    host_cpu_count = history.host.cpu_count if history.host is not None else None
    if config.instance_kind not in ("KIND_CPU", "KIND_AUTO") or not rates.busy_share:
        return _CpuShare(host_cpu_count=host_cpu_count)
    ticks: dict[float, float] = {}
    for p in history.processes:
        if since <= p.collected_at <= until and p.sample.cpu_pct is not None:
            ticks[p.collected_at] = ticks.get(p.collected_at, 0.0) + p.sample.cpu_pct / 100.0
    model_cores = gauge_mean(ticks.values())
    if model_cores is None:
        return _CpuShare(host_cpu_count=host_cpu_count)
    busy_instances = rates.busy_share * batcher.instance_count
    fraction = min(model_cores / busy_instances, 1.0) if busy_instances > 0 else 0.0
    if host_cpu_count is None:
        return _CpuShare(
            fraction=fraction,
            evidence={"cpu_contention": "not modelled: the Triton host's CPU count is unknown"},
        )
    cores = float(host_cpu_count)
    server_share = gauge_mean(
        s.metrics.cpu_utilization for s in history.servers if since <= s.collected_at <= until
    )
    if server_share is not None:
        used_by_others = max(server_share * cores - model_cores, 0.0)
        cores = max(cores - used_by_others, 0.25)
    return _CpuShare(fraction=fraction, cores=cores, host_cpu_count=host_cpu_count)
