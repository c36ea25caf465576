"""Batching recommendations from live traffic: observe, fit, simulate, search.

1. **Observe** a window of one model from the store: rates, the effective config, the
   batch_stats increases (the service time per executed batch size), the CPU its
   instances used, and Triton's server-side p95 when summaries are enabled.
2. **Fit** the service time per batch size (``fit.fit_service_time``). With only batch
   size 1 observed the slope is unknown; then the recommendation is a *probe*:
   ``dynamic_batching`` with no delay, which only groups requests already waiting, so
   it adds no waiting of its own, and it produces the batch sizes the next fit needs.
3. **Model the load**. When the server holds several requests at once and queues them
   (a saturated closed loop: clients wait for answers), the load is a population of
   ``N`` clients (Little's law: the mean number of requests in the server, ``L = Σ
   request time / window``, rounded up at the busiest point of the look-back) whose
   own time per request is ``Z = (N − L) / λ``. Clients answer the responses of one
   batch through a shared serial station (an event loop, a sender thread), so the next
   requests return staggered; how much of ``Z`` is serial cannot be seen while one
   instance is saturated, so the model is calibrated for several serial shares
   (``client_serial_shares``) and every prediction is their mean. Each client's own
   time varies (``client_think_cv``): with clockwork clients every delay long enough
   to fill a preferred batch looks the same, and the shortest would win a tie that
   real traffic breaks in favour of waiting. Otherwise the load is open: arrivals at
   the observed rate with the observed burstiness.
4. **Search** candidate configs (delay × preferred sizes × instance count) through the
   discrete-event model of Triton's batcher (``batcher_sim.simulate``) and keep the one
   with the most throughput whose p95 meets the objective: ``slo_p95_ms`` when given,
   else at most 10 % above the current config's p95. "No change" wins when nothing
   beats the current config by a margin.

Predictions are for the observed load, as a client would see them: for closed loops
the simulated client-side latency of each request (server time plus its own client
time), so the p95 carries the stagger too.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from collector.analysis.batcher_sim import ClosedLoad, OpenLoad, ServiceModel, SimResult, simulate
from collector.analysis.configs import (
    config_changes,
    config_with,
    has_own_batcher_choice,
    render_pbtxt,
)
from collector.analysis.fit import ServiceTimeFit, arrival_stats, fit_service_time
from collector.analysis.rates import batch_stats_increase, stats_reset, window_rates
from collector.records import (
    BatcherConfig,
    BatchStat,
    ConfigChange,
    Duration,
    ModelConfig,
    ModelRates,
    ModelSample,
    Prediction,
    Recommendation,
)
from collector.sources.triton import REQUEST_SUMMARY
from collector.store import Store

__all__ = [
    "BatcherModel",
    "Observation",
    "batcher_model",
    "recommendation_from_dict",
    "recommendation_to_dict",
    "RecommendSettings",
    "observe_model",
    "recommend_from_observation",
    "recommend_model",
    "recommender_job",
    "store_recommendation",
]

SUMMARY_MAX_AGE_S = 60.0  # prometheus-cpp's default sliding window for summaries
_RELOAD_LEAD_S = 2.0  # a reload starts this long, at most, before its config is seen


@dataclass(frozen=True)
class RecommendSettings:
    """Knobs of the search. Defaults are meant to be left alone."""

    window_s: float = 30.0  # the load the prediction is for
    lookback_s: float = 900.0  # batch_stats and population are taken over this much history
    settle_s: float = 5.0  # ignore this long after a config change
    delays_us: tuple[int, ...] = (0, 100, 250, 500, 1000, 2000, 5000, 10000)
    max_instances: int = 4
    latency_margin: float = 1.10  # without an SLO: p95 may rise at most 10 %
    min_gain: float = 0.03  # a change must beat the current config by this much
    instance_gain: float = 0.10  # each extra instance must add this much throughput
    screen_requests: int = 4000  # requests per simulation while screening candidates
    final_requests: int = 20000  # requests per simulation for the finalists
    finalists: int = 8
    seed: int = 1
    # Responses of one batch reach their clients together, but clients rarely answer
    # them at once: they share an event loop, a sender thread or a proxy that handles
    # one request at a time, so the next requests come back staggered — which decides
    # whether a free instance takes a batch of one. While one instance is saturated
    # the server cannot see that stagger, so a share of the least client time per
    # request is taken as spent in such a shared, serial station (the rest is delay).
    # Closed loops lock into different batching patterns as that share moves, so every
    # prediction is the mean over these shares: a config that only shines for one
    # exact stagger is not trusted.
    client_serial_shares: tuple[float, ...] = (0.1, 0.2, 0.4)
    # batch_stats hold sums, so the spread of single executions is unseen; the fit's
    # own floor (5 %) is for its standard errors. Simulated executions vary at least
    # this much: scheduling, the GIL, clocks and co-tenants move real ones by 10-20 %,
    # and the p95 a client sees is made of that spread.
    service_cv_floor: float = 0.15
    # Spread of each client's own time between a response and its next request
    # (coefficient of variation): real clients are not clocks, so a batch waiting for
    # its preferred size may see the delay run out first.
    client_think_cv: float = 0.3


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
    evidence: dict[str, float | int | str | bool | None] = field(default_factory=dict)


# ------------------------------------------------------------------ observing


def _summed_increase(samples: Sequence[ModelSample]) -> tuple[BatchStat, ...]:
    totals: dict[int, list[int]] = {}
    for prev, cur in zip(samples, samples[1:], strict=False):
        if cur.stats is None:
            continue
        reset = stats_reset(prev, cur) or prev.stats is None
        for b in batch_stats_increase(prev.stats.batch_stats if prev.stats else None,
                                      cur.stats.batch_stats, reset=reset):
            t = totals.setdefault(b.batch_size, [0, 0, 0, 0])
            t[0] += b.exec_count
            t[1] += b.compute_input.ns
            t[2] += b.compute_infer.ns
            t[3] += b.compute_output.ns
    return tuple(
        BatchStat(batch_size=size, compute_input=Duration(t[0], t[1]),
                  compute_infer=Duration(t[0], t[2]), compute_output=Duration(t[0], t[3]))
        for size, t in sorted(totals.items()))


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


def observe_model(store: Store, target: str, model: str, *,
                  settings: RecommendSettings = RecommendSettings(),
                  now: float | None = None) -> Observation | None:
    """The model's latest window (ending at its newest sample before ``now``), or None
    when fewer than three samples or no requests were seen in it."""
    now = time.time() if now is None else now
    history = store.model_samples(target=target, model=model,
                                  since=now - settings.lookback_s, until=now)
    if len(history) < 3:
        return None
    end = history[-1].collected_at
    stored = store.latest_model_configs(target).get((target, model))
    if stored is None:
        return None
    # The load must have been served by the current config, after it settled: a fresh
    # (re)load runs slower for its first seconds.
    changes = [c.collected_at for c in store.model_configs(target=target, model=model)][1:]
    changed = bool(changes)
    start = end - settings.window_s
    if changed:
        start = max(start, stored.collected_at + settings.settle_s)
    window = [s for s in history if s.collected_at >= start]
    if len(window) < 3:
        return None
    config = stored.config
    batcher = BatcherConfig.from_model_config(config)
    rates = window_rates(window, instance_count=batcher.instance_count)
    if rates is None or rates.requests_per_s <= 0:
        return None

    batches = _summed_increase(history)
    fit = fit_service_time(batches)

    in_server = rates.in_server
    request_batch = 1
    if not batcher.dynamic_batching and rates.avg_batch_size:
        request_batch = max(1, round(rates.avg_batch_size))
    elif rates.requests_per_s > 0:
        request_batch = max(1, round(rates.inferences_per_s / rates.requests_per_s))

    # Saturated stretches of the look-back, away from config changes (a reload stalls
    # the clients): closed-loop operating points.
    stretches = [r for c in _chunks(history, settings.window_s / 3)
                 if not any(c[0].collected_at - settings.settle_s <= t
                            <= c[-1].collected_at + _RELOAD_LEAD_S for t in changes)
                 and (r := window_rates(c)) is not None and r.requests_per_s > 0
                 and (r.queue_share or 0.0) >= 0.2 and r.in_server >= 1.5]
    saturated = (rates.queue_share or 0.0) >= 0.2 and in_server >= batcher.instance_count + 0.5
    population = None
    think_ms = least_think_ms = 0.0
    if saturated:
        population = _population([(r.requests_per_s, r.in_server) for r in stretches]
                                 + [(rates.requests_per_s, in_server)])
        think_ms = max(population - in_server, 0.0) / rates.requests_per_s * 1000.0
        # The least client time is the one least inflated by queueing at the clients.
        least_think_ms = min([max(population - r.in_server, 0.0) / r.requests_per_s * 1000.0
                              for r in stretches] + [think_ms])

    counts = [s.rates.requests_per_s * s.rates.window_s for s in window[1:] if s.rates]
    intervals = [s.rates.window_s for s in window[1:] if s.rates]
    dispersion = arrival_stats(counts, intervals).dispersion if len(counts) >= 3 else 1.0

    exec_ms = None
    window_batches = _summed_increase(window)
    executions = sum(b.exec_count for b in window_batches)
    if executions:
        exec_ms = sum(b.compute_ns for b in window_batches) / executions / 1e6
    overhead_ms = 0.0
    if saturated and exec_ms is not None and rates.executions_per_s > 0:
        # Instances never idle while requests queue: the gap between executions is time
        # an instance spends outside the measured compute (IPC, scheduling).
        per_exec_ms = batcher.instance_count / rates.executions_per_s * 1000.0
        overhead_ms = min(max(per_exec_ms - exec_ms, 0.0), exec_ms)

    cpu_fraction, cores = _cpu_share(store, target, model, config, rates, batcher,
                                     window[0].collected_at, end)
    p95 = None
    summary = window[-1].metrics.summary_quantiles_us.get(REQUEST_SUMMARY)
    # Triton's summary quantiles cover a sliding minute that may still hold requests
    # served under the previous config; only trust them a minute after a change.
    if summary and 0.95 in summary and (not changed
                                        or end - stored.collected_at >= SUMMARY_MAX_AGE_S):
        p95 = summary[0.95] / 1000.0
    pending = [s.metrics.pending_request_count for s in window
               if s.metrics.pending_request_count is not None]
    return Observation(
        target=target, model=model, window_start=window[0].collected_at, window_end=end,
        rates=rates, config=config, batcher=batcher, batch_increase=batches, fit=fit,
        in_server=in_server, population=population, think_ms=think_ms,
        least_think_ms=least_think_ms, request_batch=request_batch,
        dispersion=dispersion, overhead_ms=overhead_ms,
        cpu_fraction=cpu_fraction, cores_available=cores, server_p95_ms=p95,
        pending_mean=sum(pending) / len(pending) if pending else None,
        evidence={"saturated": saturated, "exec_ms_window": exec_ms})


def _cpu_share(store: Store, target: str, model: str, config: ModelConfig, rates: ModelRates,
               batcher: BatcherConfig, since: float, until: float,
               ) -> tuple[float, float | None]:
    """CPU share of an execution and the cores left for the model, for CPU instances."""
    if config.instance_kind not in ("KIND_CPU", "KIND_AUTO") or not rates.busy_share:
        return 0.0, None
    procs = store.process_samples(target=target, since=since, until=until, source="host")
    ticks: dict[float, float] = {}
    for p in procs:
        if p.sample.model == model and p.sample.cpu_pct is not None:
            ticks[p.collected_at] = ticks.get(p.collected_at, 0.0) + p.sample.cpu_pct / 100.0
    if not ticks:
        return 0.0, None
    model_cores = sum(ticks.values()) / len(ticks)
    busy_instances = rates.busy_share * batcher.instance_count
    fraction = min(model_cores / busy_instances, 1.0) if busy_instances > 0 else 0.0
    cores = float(os.cpu_count() or 1)
    servers = [s.metrics.cpu_utilization for s in
               store.server_samples(target=target, since=since, until=until)
               if s.metrics.cpu_utilization is not None]
    if servers:
        used_by_others = max(sum(servers) / len(servers) * cores - model_cores, 0.0)
        cores = max(cores - used_by_others, 0.25)
    return fraction, cores


# ------------------------------------------------------------------ predicting


def _service(obs: Observation, settings: RecommendSettings, *,
             per_sample_ms: float | None = None, scale: float = 1.0) -> ServiceModel:
    fit = obs.fit
    assert fit is not None

    def mean_ms(batch: int) -> float:
        return fit.mean_ms(batch, per_sample_ms=per_sample_ms) * scale

    return ServiceModel(mean_ms=mean_ms, cv=max(fit.residual_cv, settings.service_cv_floor),
                        cpu_fraction=obs.cpu_fraction,
                        cores=obs.cores_available, overhead_ms=obs.overhead_ms * scale)


def _calibrated_scale(obs: Observation, load: OpenLoad | ClosedLoad,
                      settings: RecommendSettings, *, per_sample_ms: float | None = None,
                      ) -> float:
    """The factor on service time that makes the model reproduce the observed mean
    request time under the current config.

    What the fit cannot see (input copies, Python-backend IPC, CPU shared with other
    processes) makes real executions take longer than ``batch_stats`` says; one scalar,
    fitted at the operating point, carries that over to every candidate. Bisection on
    log(scale) within [1/4, 4].
    """
    target_ms = (obs.rates.request_us_per_request or 0.0) / 1000.0
    if target_ms <= 0:
        return 1.0
    lo, hi = math.log(0.25), math.log(4.0)
    for _ in range(8):
        mid = (lo + hi) / 2
        result = _run(obs.batcher, _service(obs, settings, per_sample_ms=per_sample_ms,
                                            scale=math.exp(mid)),
                      load, settings.screen_requests, settings.seed)
        if result.mean_latency_ms < target_ms:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _calibrated(obs: Observation, settings: RecommendSettings, *, serial_share: float,
                per_sample_ms: float | None = None) -> tuple[float, OpenLoad | ClosedLoad]:
    """Service-time scale and load that reproduce the current operating point.

    For a closed loop, ``serial_share`` of the least client time is the clients'
    serial station; the plain delay is then set so that the simulated client time
    (station wait included, which depends on the batches formed) matches the observed
    ``Z``, and the scale is fitted again. Two rounds settle both.
    """
    load = _load(obs, serial_share, think_cv=settings.client_think_cv)
    scale = _calibrated_scale(obs, load, settings, per_sample_ms=per_sample_ms)
    if not isinstance(load, ClosedLoad) or load.client_ms <= 0:
        return scale, load
    for _ in range(2):
        service = _service(obs, settings, per_sample_ms=per_sample_ms, scale=scale)
        result = _run(obs.batcher, service, load, settings.screen_requests, settings.seed)
        delay = max(load.think_ms + obs.think_ms - result.mean_client_ms, 0.0)
        load = replace(load, think_ms=delay)
        scale = _calibrated_scale(obs, load, settings, per_sample_ms=per_sample_ms)
    return scale, load


def _load(obs: Observation, serial_share: float = 0.0, *,
          think_cv: float = 0.0) -> OpenLoad | ClosedLoad:
    if obs.population is not None:
        serial = serial_share * obs.least_think_ms
        # A request waits (b − 1)/2 turns at the station on average: the start value
        # of the delay, which _calibrated then corrects.
        turns = 1.0 + max((obs.rates.avg_batch_size or 1.0) / obs.request_batch - 1.0,
                          0.0) / 2.0
        return ClosedLoad(clients=obs.population,
                          think_ms=max(obs.think_ms - serial * turns, 0.0),
                          client_ms=serial, request_batch=obs.request_batch,
                          think_cv=think_cv)
    return OpenLoad(rate_per_s=obs.rates.requests_per_s, dispersion=max(obs.dispersion, 1.0),
                    request_batch=obs.request_batch)


def _as_prediction(result: SimResult) -> Prediction:
    # Closed loads: the simulated client-side latency (server time plus each request's
    # own client time); open loads: the server's.
    return Prediction(qps=result.throughput_per_s, p95_ms=result.client_p95_ms,
                      p50_ms=result.client_p50_ms, avg_batch_size=result.avg_batch_size,
                      busy_share=result.busy_share)


@dataclass(frozen=True)
class BatcherVariant:
    """One calibrated reading of the observation (one client serial share)."""

    serial_share: float
    service: ServiceModel
    load: OpenLoad | ClosedLoad
    scale: float  # service time calibrated at the operating point (see _calibrated_scale)


@dataclass(frozen=True)
class BatcherModel:
    """The batcher model fitted to one observation: predicts any config at the
    observed load (what the recommender searches, and what a what-if view asks).
    A prediction is the mean over the variants (see ``client_serial_shares``)."""

    observation: Observation
    variants: tuple[BatcherVariant, ...]
    settings: RecommendSettings

    @property
    def scale(self) -> float:
        return sum(v.scale for v in self.variants) / len(self.variants)

    def simulate(self, config: BatcherConfig, *,
                 requests: int | None = None) -> list[SimResult]:
        return [_run(config, v.service, v.load, requests or self.settings.final_requests,
                     self.settings.seed) for v in self.variants]

    def predict(self, config: BatcherConfig, *, requests: int | None = None) -> Prediction:
        """Client-side QPS and latency of ``config`` at the observed load."""
        return _mean_prediction([_as_prediction(r)
                                 for r in self.simulate(config, requests=requests)])


def batcher_model(obs: Observation, settings: RecommendSettings = RecommendSettings(), *,
                  per_sample_ms: float | None = None) -> BatcherModel | None:
    """The model for ``obs``; None until two batch sizes were seen (the slope of the
    service time is unknown before) unless ``per_sample_ms`` supplies one."""
    if obs.fit is None or (obs.fit.per_sample_ms is None and per_sample_ms is None):
        return None
    shares = settings.client_serial_shares if obs.population is not None else (0.0,)
    variants = []
    for share in shares:
        scale, load = _calibrated(obs, settings, serial_share=share,
                                  per_sample_ms=per_sample_ms)
        variants.append(BatcherVariant(
            serial_share=share, load=load, scale=scale,
            service=_service(obs, settings, per_sample_ms=per_sample_ms, scale=scale)))
    return BatcherModel(observation=obs, variants=tuple(variants), settings=settings)


def _mean_prediction(predictions: Sequence[Prediction]) -> Prediction:
    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None and math.isfinite(v)]
        return sum(known) / len(known) if known else None

    return Prediction(
        qps=mean([p.qps for p in predictions]) or 0.0,
        p95_ms=mean([p.p95_ms for p in predictions]),
        p50_ms=mean([p.p50_ms for p in predictions]),
        avg_batch_size=mean([p.avg_batch_size for p in predictions]),
        busy_share=mean([p.busy_share for p in predictions]))


def _feasible(config: BatcherConfig, obs: Observation) -> bool:
    if config.dynamic_batching and config.max_batch_size < obs.request_batch:
        return False
    return all(p <= config.max_batch_size for p in config.preferred_batch_sizes)


def _candidates(obs: Observation, settings: RecommendSettings) -> list[BatcherConfig]:
    cur = obs.batcher
    counts = sorted({cur.instance_count, min(cur.instance_count + 1, settings.max_instances),
                     max(cur.instance_count - 1, 1)})
    out = [replace(cur, instance_count=n) for n in counts]
    if cur.max_batch_size <= 1:
        return out
    sizes = [p for p in (2, 4, 8, 16, 32, 64, 128) if p <= cur.max_batch_size]
    preferred: list[tuple[int, ...]] = [()]
    preferred += [(p,) for p in sizes if p >= 4]
    preferred += [(p // 2, p) for p in sizes if p >= 8]
    for n in counts:
        for delay in settings.delays_us:
            for pref in preferred:
                out.append(replace(cur, dynamic_batching=True, preferred_batch_sizes=pref,
                                   max_queue_delay_us=delay, instance_count=n))
    return [c for c in dict.fromkeys(out) if _feasible(c, obs)]


def _run(config: BatcherConfig, service: ServiceModel, load: OpenLoad | ClosedLoad,
         requests: int, seed: int) -> SimResult:
    return simulate(config, service, load, requests=requests, seed=seed)


def _confidence(obs: Observation, proposed: BatcherConfig, kind: str) -> float:
    if kind == "probe" or obs.fit is None:
        return 0.3
    fit = obs.fit
    largest = max(proposed.preferred_batch_sizes or (proposed.max_batch_size,))
    uncertainty = fit.relative_uncertainty(min(largest, proposed.max_batch_size))
    confidence = 0.95 - min(uncertainty, 0.6)
    if largest > fit.max_observed_batch:  # extrapolating the service-time line
        confidence -= 0.15
    if proposed.instance_count != obs.batcher.instance_count:
        confidence -= 0.1  # instance scaling is modelled, not observed
    if fit.executions < 200:
        confidence -= 0.2
    return round(min(max(confidence, 0.05), 0.95), 2)


def _observed(obs: Observation, current_sim: Prediction | None) -> Prediction:
    p95 = (obs.server_p95_ms + obs.think_ms if obs.server_p95_ms is not None
           else current_sim.p95_ms if current_sim else None)
    return Prediction(qps=obs.rates.requests_per_s, p95_ms=p95,
                      avg_batch_size=obs.rates.avg_batch_size, busy_share=obs.rates.busy_share)


def _describe(config: BatcherConfig) -> str:
    if not config.dynamic_batching:
        return f"no dynamic batching, {config.instance_count} instance(s)"
    pref = f"preferred {list(config.preferred_batch_sizes)}" if config.preferred_batch_sizes \
        else "no preferred sizes"
    return (f"dynamic batching ({pref}, delay {config.max_queue_delay_us} µs), "
            f"{config.instance_count} instance(s)")


def _finish(obs: Observation, kind: str, proposed: BatcherConfig, current: Prediction,
            predicted: Prediction, reason: str, slo: float | None, confidence: float,
            evidence: dict[str, float | int | str | bool | None], now: float) -> Recommendation:
    doc = config_with(obs.config.raw_json, proposed)
    return Recommendation(
        target=obs.target, model=obs.model, created_at=now, kind=kind,
        changes=config_changes(obs.batcher, proposed), current_config=obs.batcher,
        proposed_config=proposed, current=current, predicted=predicted,
        confidence=confidence, reason=reason, slo_p95_ms=slo,
        config_pbtxt=render_pbtxt(proposed, instance_kind=obs.config.instance_kind),
        config_json=json.dumps(doc, sort_keys=True), evidence={**obs.evidence, **evidence})


def _choose(meeting: list[tuple[BatcherConfig, Prediction]], cur: BatcherConfig,
            settings: RecommendSettings) -> tuple[BatcherConfig, Prediction]:
    """The most throughput; near-ties go to lower p95, then the simpler change. Every
    extra instance costs device memory, so a higher count must earn
    ``instance_gain`` more throughput than the best config with fewer instances."""
    def best_of(options: list[tuple[BatcherConfig, Prediction]]
                ) -> tuple[BatcherConfig, Prediction]:
        top = max(p.qps for _, p in options)
        near = [(c, p) for c, p in options if p.qps >= top * 0.99]
        return min(near, key=lambda cp: (cp[1].p95_ms, len(config_changes(cur, cp[0])),
                                         cp[0].max_queue_delay_us))

    by_count: dict[int, tuple[BatcherConfig, Prediction]] = {}
    for n in sorted({c.instance_count for c, _ in meeting}):
        by_count[n] = best_of([(c, p) for c, p in meeting if c.instance_count == n])
    counts = sorted(by_count)
    chosen = by_count[counts[0]]
    for n in counts[1:]:
        if by_count[n][1].qps >= chosen[1].qps * (1 + settings.instance_gain):
            chosen = by_count[n]
    return chosen


def recommend_from_observation(obs: Observation, *, slo_p95_ms: float | None = None,
                               settings: RecommendSettings = RecommendSettings(),
                               now: float | None = None) -> Recommendation:
    """The best config for the observed load (see the module docstring)."""
    now = time.time() if now is None else now
    cur = obs.batcher
    base_evidence: dict[str, float | int | str | bool | None] = {
        "in_server": round(obs.in_server, 2), "population": obs.population,
        "think_ms": round(obs.think_ms, 3), "least_think_ms": round(obs.least_think_ms, 3),
        "overhead_ms": round(obs.overhead_ms, 3),
        "cpu_fraction": round(obs.cpu_fraction, 3), "cores_available": obs.cores_available,
        "window_s": round(obs.window_end - obs.window_start, 1),
    }
    concurrent = obs.in_server >= 1.5 or (obs.pending_mean or 0.0) >= 1.0
    single_size = obs.fit is None or obs.fit.per_sample_ms is None

    if not has_own_batcher_choice(obs.config):
        # Triton refuses dynamic_batching here: an ensemble's steps, or the sequence
        # batcher, decide how requests are grouped.
        observed = _observed(obs, None)
        what = ("an ensemble: its steps' models batch for it, so tune those"
                if obs.config.platform == "ensemble"
                else "sequence-batched: the sequence batcher owns batching")
        return _finish(obs, "no_change", cur, observed, observed, f"this model is {what}",
                       slo_p95_ms, 1.0, base_evidence, now)

    if single_size:
        current_sim = None
        pessimistic = None
        if obs.fit is not None:
            # Pessimistic bound: a batch of b costs b single executions (no gain).
            bound = batcher_model(obs, settings, per_sample_ms=obs.fit.intercept_ms)
            assert bound is not None
            current_sim = bound.predict(cur)
            pessimistic = replace(cur, dynamic_batching=True, preferred_batch_sizes=(),
                                  max_queue_delay_us=0)
            pessimistic_p = bound.predict(pessimistic)
        observed = _observed(obs, current_sim)
        if not cur.dynamic_batching and concurrent and cur.max_batch_size > 1:
            proposed = replace(cur, dynamic_batching=True, preferred_batch_sizes=(),
                               max_queue_delay_us=0)
            predicted = pessimistic_p if pessimistic is not None else observed
            reason = (f"{obs.in_server:.1f} requests are in the server at once on average but "
                      f"run one at a time, and only batch size 1 has been seen, so how the "
                      f"model's cost grows with batch size is not known yet. Dynamic batching "
                      f"with no delay only groups requests that are already waiting (no added "
                      f"wait); apply it to learn the cost curve, then ask again for the tuned "
                      f"config. The prediction assumes the worst case, no gain.")
            return _finish(obs, "probe", proposed, observed, predicted, reason, slo_p95_ms,
                           _confidence(obs, proposed, "probe"), base_evidence, now)
        reason = ("requests do not overlap, so batching has nothing to group" if not concurrent
                  else "only batch size 1 has been seen; keep observing")
        return _finish(obs, "no_change", cur, observed, observed, reason, slo_p95_ms, 0.3,
                       base_evidence, now)

    model = batcher_model(obs, settings)
    assert model is not None  # the slope is identified here
    scale = model.scale
    current_sim = model.predict(cur)
    observed = _observed(obs, current_sim)
    limit = slo_p95_ms if slo_p95_ms is not None else current_sim.p95_ms * settings.latency_margin

    screened: list[tuple[BatcherConfig, Prediction]] = []
    for candidate in _candidates(obs, settings):
        screened.append((candidate,
                         model.predict(candidate, requests=settings.screen_requests)))
    # The finalists get longer runs; near-ties go to the simpler, cheaper config.
    screened.sort(key=lambda cp: -cp[1].qps if cp[1].p95_ms <= limit * 1.05 else cp[1].p95_ms)
    finalists = [c for c, _ in screened[:settings.finalists]]
    if cur not in finalists:
        finalists.append(cur)
    results = [(c, model.predict(c)) for c in finalists]
    meeting = [(c, p) for c, p in results if p.p95_ms <= limit]
    evidence = {**base_evidence, "p95_limit_ms": round(limit, 3),
                "current_predicted_qps": round(current_sim.qps, 1),
                "current_predicted_p95_ms": round(current_sim.p95_ms, 3),
                "service_scale": round(scale, 3),
                "candidates": len(screened)}
    if not meeting:
        best_c, best_p = min(results, key=lambda cp: cp[1].p95_ms)
    else:
        best_c, best_p = _choose(meeting, cur, settings)
    cur_p = next(p for c, p in results if c == cur)
    gain = best_p.qps / cur_p.qps if cur_p.qps > 0 else math.inf
    better_latency = best_p.p95_ms < cur_p.p95_ms * (1 - settings.min_gain)
    if best_c == cur or (gain < 1 + settings.min_gain and not better_latency):
        reason = (f"the current config ({_describe(cur)}) is already the best the batcher "
                  f"model found for this load: {cur_p.qps:.0f} QPS at p95 "
                  f"{cur_p.p95_ms:.1f} ms; no candidate beat it by {settings.min_gain:.0%}")
        if obs.fit.per_sample_ms is not None and obs.fit.intercept_ms < obs.fit.per_sample_ms:
            reason += (f" (an execution costs {obs.fit.intercept_ms:.2f} ms plus "
                       f"{obs.fit.per_sample_ms:.2f} ms per sample, so batching saves little)")
        return _finish(obs, "no_change", cur, observed, cur_p, reason, slo_p95_ms,
                       _confidence(obs, cur, "no_change"), evidence, now)

    fit = obs.fit
    cost = (f"an execution costs {fit.intercept_ms:.2f} ms fixed plus "
            f"{fit.per_sample_ms:.2f} ms per sample (fitted from "
            f"{fit.executions} executions at {len(fit.points)} batch sizes)")
    objective = (f"p95 ≤ {slo_p95_ms:g} ms" if slo_p95_ms is not None
                 else f"p95 no more than {settings.latency_margin - 1:.0%} above the current")
    load_text = (f"{obs.population} concurrent clients" if obs.population is not None
                 else f"{obs.rates.requests_per_s:.0f} requests/s")
    reason = (f"{cost}. At the observed load ({load_text}) {_describe(best_c)} is predicted to "
              f"serve {best_p.qps:.0f} QPS ({gain:.2f}× the current {cur_p.qps:.0f}) at p95 "
              f"{best_p.p95_ms:.1f} ms (now {cur_p.p95_ms:.1f} ms), within the objective "
              f"({objective}).")
    if not meeting:
        reason = (f"no candidate meets the objective ({objective}); {_describe(best_c)} comes "
                  f"closest with p95 {best_p.p95_ms:.1f} ms. " + cost)
    return _finish(obs, "tune", best_c, observed, best_p, reason, slo_p95_ms,
                   _confidence(obs, best_c, "tune"), evidence, now)


def recommend_model(store: Store, target: str, model: str, *, slo_p95_ms: float | None = None,
                    window_s: float = 30.0, now: float | None = None,
                    settings: RecommendSettings | None = None) -> Recommendation | None:
    """Observe ``model`` over the last ``window_s`` seconds and recommend; None when the
    store holds too little traffic for it."""
    settings = replace(settings or RecommendSettings(), window_s=window_s)
    obs = observe_model(store, target, model, settings=settings, now=now)
    if obs is None:
        return None
    return recommend_from_observation(obs, slo_p95_ms=slo_p95_ms, settings=settings, now=now)


def store_recommendation(store: Store, rec: Recommendation) -> int:
    """Keep ``rec`` in the store (readable back with ``recommendation_from_dict``);
    returns its id."""
    return store.add_recommendation(
        target=rec.target, model=rec.model, change=recommendation_to_dict(rec),
        predicted={"qps": rec.predicted.qps, "p95_ms": rec.predicted.p95_ms},
        confidence=rec.confidence, config_fragment=rec.config_pbtxt, status=rec.kind,
        created_at=rec.created_at)


def recommender_job(slo_p95_ms: Mapping[str, float] | None = None, *,
                    window_s: float = 30.0) -> Callable[[Store, float], list[int]]:
    """The recommender as a scheduler analysis (``CollectorService(analyses=[...])``):
    a recommendation per model with enough traffic in the last ``window_s``, stored."""
    objectives = dict(slo_p95_ms or {})

    def run_recommender_job(store: Store, now: float) -> list[int]:
        stored = []
        for target in store.targets():
            if target.kind != "triton":
                continue
            for (_, model) in sorted(store.latest_model_configs(target.name)):
                rec = recommend_model(store, target.name, model,
                                      slo_p95_ms=objectives.get(model), window_s=window_s,
                                      now=now)
                if rec is not None:
                    stored.append(store_recommendation(store, rec))
        return stored

    return run_recommender_job


def recommendation_to_dict(rec: Recommendation) -> dict[str, object]:
    """JSON-ready form; ``recommendation_from_dict`` reads it back."""
    return asdict(rec)


def recommendation_from_dict(doc: dict[str, Any]) -> Recommendation:
    def batcher(d: dict[str, Any]) -> BatcherConfig:
        return BatcherConfig(**{**d, "preferred_batch_sizes": tuple(d["preferred_batch_sizes"])})

    return Recommendation(**{
        **doc,
        "changes": tuple(ConfigChange(**c) for c in doc["changes"]),
        "current_config": batcher(doc["current_config"]),
        "proposed_config": batcher(doc["proposed_config"]),
        "current": Prediction(**doc["current"]),
        "predicted": Prediction(**doc["predicted"]),
    })
