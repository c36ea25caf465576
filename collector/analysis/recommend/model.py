"""The batcher model fitted to one observation: the fitted service time, scaled so the
discrete-event model (``batcher_sim.simulate``) reproduces today's operating point,
under the observed load (open, or a closed loop of clients calibrated for several
serial shares of their own time). It predicts any config at the observed load: what
the recommender searches and what the what-if view asks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from collector.analysis.batcher_sim import ClosedLoad, OpenLoad, ServiceModel, SimResult, simulate
from collector.analysis.recommend.observe import Observation
from collector.analysis.recommend.settings import DEFAULT_SETTINGS, RecommendSettings
from collector.records import BatcherConfig, Prediction


def _service(
    obs: Observation,
    settings: RecommendSettings,
    *,
    per_sample_ms: float | None = None,
    scale: float = 1.0,
) -> ServiceModel:
    fit = obs.fit
    assert fit is not None

    def mean_ms(batch: int) -> float:
        return fit.mean_ms(batch, per_sample_ms=per_sample_ms) * scale

    return ServiceModel(
        mean_ms=mean_ms,
        cv=max(fit.residual_cv, settings.service_cv_floor),
        cpu_fraction=obs.cpu_fraction,
        cores=obs.cores_available,
        overhead_ms=obs.overhead_ms * scale,
    )


def _calibrated_scale(
    obs: Observation,
    load: OpenLoad | ClosedLoad,
    settings: RecommendSettings,
    *,
    per_sample_ms: float | None = None,
    start: float = 1.0,
) -> float:
    """The factor on service time that makes the model reproduce the observed mean
    request time under the current config.

    What the fit cannot see (input copies, Python-backend IPC, CPU shared with other
    processes) makes real executions take longer than ``batch_stats`` says; one scalar,
    fitted at the operating point, carries that over to every candidate. Secant steps
    on ``log(simulated / observed mean)`` against ``log(scale)`` from ``start``, within
    [1/4, 4], until the two agree within ``calibration_tolerance`` (the simulation is
    deterministic for its seed, so the steps converge like on a smooth curve).
    """
    target_ms = (obs.rates.request_us_per_request or 0.0) / 1000.0
    if target_ms <= 0:
        return 1.0
    lo, hi = math.log(0.25), math.log(4.0)
    x = min(max(math.log(start), lo), hi)
    previous: tuple[float, float] | None = None
    for _ in range(settings.calibration_steps):
        result = _run(
            obs.batcher,
            _service(obs, settings, per_sample_ms=per_sample_ms, scale=math.exp(x)),
            load,
            settings.screen_requests,
            settings.seed,
        )
        mean = result.mean_latency_ms
        if not (mean > 0 and math.isfinite(mean)):
            break
        f = math.log(mean / target_ms)
        if abs(f) <= settings.calibration_tolerance:
            break
        # Request time grows at least in proportion to service time: slope 1 until two
        # points give a better one.
        slope = 1.0
        if previous is not None and previous[0] != x:
            slope = min(max((f - previous[1]) / (x - previous[0]), 0.5), 4.0)
        previous = (x, f)
        x = min(max(x - f / slope, lo), hi)
    return math.exp(x)


def _calibrated(
    obs: Observation,
    settings: RecommendSettings,
    *,
    serial_share: float,
    per_sample_ms: float | None = None,
    start: float = 1.0,
) -> tuple[float, OpenLoad | ClosedLoad]:
    """Service-time scale and load that reproduce the current operating point.

    For a closed loop, ``serial_share`` of the least client time is the clients'
    serial station; the plain delay is then set so that the simulated client time
    (station wait included, which depends on the batches formed) matches the observed
    ``Z``, and the scale is fitted again. Two rounds settle both.
    """
    load = _load(obs, serial_share, think_cv=settings.client_think_cv)
    scale = _calibrated_scale(obs, load, settings, per_sample_ms=per_sample_ms, start=start)
    if not isinstance(load, ClosedLoad) or load.client_ms <= 0:
        return scale, load
    for _ in range(2):
        service = _service(obs, settings, per_sample_ms=per_sample_ms, scale=scale)
        result = _run(obs.batcher, service, load, settings.screen_requests, settings.seed)
        delay = max(load.think_ms + obs.think_ms - result.mean_client_ms, 0.0)
        load = replace(load, think_ms=delay)
        scale = _calibrated_scale(obs, load, settings, per_sample_ms=per_sample_ms, start=scale)
    return scale, load


def _load(
    obs: Observation, serial_share: float = 0.0, *, think_cv: float = 0.0
) -> OpenLoad | ClosedLoad:
    if obs.population is not None:
        serial = serial_share * obs.least_think_ms
        # A request waits (b − 1)/2 turns at the station on average: the start value
        # of the delay, which _calibrated then corrects.
        turns = 1.0 + max((obs.rates.avg_batch_size or 1.0) / obs.request_batch - 1.0, 0.0) / 2.0
        return ClosedLoad(
            clients=obs.population,
            think_ms=max(obs.think_ms - serial * turns, 0.0),
            client_ms=serial,
            request_batch=obs.request_batch,
            think_cv=think_cv,
        )
    return OpenLoad(
        rate_per_s=obs.rates.requests_per_s,
        dispersion=max(obs.dispersion, 1.0),
        request_batch=obs.request_batch,
    )


def _as_prediction(result: SimResult) -> Prediction:
    # Closed loads: the simulated client-side latency (server time plus each request's
    # own client time); open loads: the server's.
    return Prediction(
        qps=result.throughput_per_s,
        p95_ms=result.client_p95_ms,
        p50_ms=result.client_p50_ms,
        avg_batch_size=result.avg_batch_size,
        busy_share=result.busy_share,
    )


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
    # Calibrated on earlier windows of the same config (one serial share each): not
    # part of a prediction, only of the spread of a gain (``choice``).
    window_variants: tuple[BatcherVariant, ...] = ()

    @property
    def scale(self) -> float:
        return sum(v.scale for v in self.variants) / len(self.variants)

    def simulate(self, config: BatcherConfig, *, requests: int | None = None) -> list[SimResult]:
        return [
            _run(
                config,
                v.service,
                v.load,
                requests or self.settings.final_requests,
                self.settings.seed,
            )
            for v in self.variants
        ]

    def predict(self, config: BatcherConfig, *, requests: int | None = None) -> Prediction:
        """Client-side QPS and latency of ``config`` at the observed load."""
        return mean_prediction(
            [_as_prediction(r) for r in self.simulate(config, requests=requests)]
        )

    def runs(
        self,
        config: BatcherConfig,
        *,
        requests: int,
        seeds: Sequence[int],
        variants: Sequence[BatcherVariant] | None = None,
    ) -> tuple[Prediction, ...]:
        """One prediction per (variant, seed), in that order: paired runs, comparable
        run by run between configs (see ``choice``)."""
        return tuple(
            _as_prediction(_run(config, v.service, v.load, requests, seed))
            for v in (self.variants if variants is None else variants)
            for seed in seeds
        )

    def window_runs(
        self, config: BatcherConfig, *, requests: int, seeds: Sequence[int]
    ) -> tuple[Prediction, ...]:
        """``runs`` on the window variants."""
        return self.runs(config, requests=requests, seeds=seeds, variants=self.window_variants)

    def middle(self) -> BatcherVariant:
        """The variant in the middle of the calibrated serial shares (for screening)."""
        return self.variants[len(self.variants) // 2]


def batcher_model(
    obs: Observation,
    settings: RecommendSettings = DEFAULT_SETTINGS,
    *,
    per_sample_ms: float | None = None,
    earlier: Sequence[Observation] = (),
) -> BatcherModel | None:
    """The model for ``obs``; None until two batch sizes were seen (the slope of the
    service time is unknown before) unless ``per_sample_ms`` supplies one. Each of
    ``earlier`` (windows of the same config) adds a window variant."""
    if obs.fit is None or (obs.fit.per_sample_ms is None and per_sample_ms is None):
        return None
    shares = settings.client_serial_shares if obs.population is not None else (0.0,)
    variants: list[BatcherVariant] = []
    for share in shares:
        # Each share starts from the last one's scale: neighbouring shares calibrate alike.
        start = variants[-1].scale if variants else 1.0
        scale, load = _calibrated(
            obs, settings, serial_share=share, per_sample_ms=per_sample_ms, start=start
        )
        variants.append(
            BatcherVariant(
                serial_share=share,
                load=load,
                scale=scale,
                service=_service(obs, settings, per_sample_ms=per_sample_ms, scale=scale),
            )
        )
    middle = variants[len(variants) // 2]
    windows = tuple(
        _variant(other, settings, middle.serial_share, middle.scale)
        for other in earlier
        if other.fit is not None and other.fit.per_sample_ms is not None
    )
    return BatcherModel(
        observation=obs, variants=tuple(variants), settings=settings, window_variants=windows
    )


def _variant(
    obs: Observation, settings: RecommendSettings, share: float, start: float
) -> BatcherVariant:
    scale, load = _calibrated(obs, settings, serial_share=share, start=start)
    return BatcherVariant(
        serial_share=share, load=load, scale=scale, service=_service(obs, settings, scale=scale)
    )


def mean_prediction(predictions: Sequence[Prediction]) -> Prediction:
    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None and math.isfinite(v)]
        return sum(known) / len(known) if known else None

    return Prediction(
        qps=mean([p.qps for p in predictions]) or 0.0,
        p95_ms=mean([p.p95_ms for p in predictions]),
        p50_ms=mean([p.p50_ms for p in predictions]),
        avg_batch_size=mean([p.avg_batch_size for p in predictions]),
        busy_share=mean([p.busy_share for p in predictions]),
    )


def _run(
    config: BatcherConfig,
    service: ServiceModel,
    load: OpenLoad | ClosedLoad,
    requests: int,
    seed: int,
) -> SimResult:
    return simulate(config, service, load, requests=requests, seed=seed)
