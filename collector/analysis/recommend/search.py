"""The recommendation for one observation: leave alone what Triton batches elsewhere,
probe when only batch size 1 was seen, else search candidate configs through the
batcher model and keep the best that meets the objective (see the package
docstring)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from collector.analysis.configs import (
    config_changes,
    config_with,
    has_own_batcher_choice,
    render_pbtxt,
)
from collector.analysis.fit import ServiceTimeFit
from collector.analysis.recommend.choice import (
    GAIN_Z,
    Estimate,
    gain_uncertainty,
    log_gain,
    meets,
    prefer,
    simplicity,
)
from collector.analysis.recommend.figures import gain_figures
from collector.analysis.recommend.model import BatcherModel, batcher_model, mean_prediction
from collector.analysis.recommend.observe import Evidence, Observation
from collector.analysis.recommend.settings import DEFAULT_SETTINGS, RecommendSettings
from collector.records import BatcherConfig, Prediction, Recommendation


def recommend_from_observation(
    obs: Observation,
    *,
    slo_p95_ms: float | None = None,
    settings: RecommendSettings = DEFAULT_SETTINGS,
    now: float | None = None,
    standing: BatcherConfig | None = None,
    earlier: Sequence[Observation] = (),
) -> Recommendation:
    """The best config for the observed load (see the package docstring); ties go to
    ``standing`` (the recommendation already stored for the running config), then to
    the running config, then to the simpler one (``choice``). ``earlier`` are windows of the same
    config before ``obs``'s (``observe_windows``), for the uncertainty of a gain."""
    draft = _Draft(
        obs,
        slo_p95_ms,
        time.time() if now is None else now,
        {
            "in_server": round(obs.in_server, 2),
            "population": obs.population,
            "think_ms": round(obs.think_ms, 3),
            "least_think_ms": round(obs.least_think_ms, 3),
            "overhead_ms": round(obs.overhead_ms, 3),
            "cpu_fraction": round(obs.cpu_fraction, 3),
            "cores_available": obs.cores_available,
            "window_s": round(obs.window_end - obs.window_start, 1),
            "earlier_windows": len(earlier),
        },
        tuple(earlier),
    )
    if not has_own_batcher_choice(obs.config):
        return _left_alone(draft)
    if obs.fit is None or obs.fit.per_sample_ms is None:
        return _single_size(draft, settings)
    return _tuned(draft, obs.fit, settings, standing)


@dataclass(frozen=True)
class _Draft:
    """What every recommendation about one observation shares."""

    obs: Observation
    slo_p95_ms: float | None
    now: float
    evidence: Evidence
    earlier: tuple[Observation, ...] = ()  # earlier windows of the same config

    def finish(
        self,
        kind: str,
        proposed: BatcherConfig,
        current: Prediction,
        predicted: Prediction,
        reason: str,
        confidence: float,
        evidence: Evidence | None = None,
    ) -> Recommendation:
        obs = self.obs
        doc = config_with(obs.config.raw_json, proposed)
        return Recommendation(
            target=obs.target,
            model=obs.model,
            created_at=self.now,
            kind=kind,
            changes=config_changes(obs.batcher, proposed),
            current_config=obs.batcher,
            proposed_config=proposed,
            current=current,
            predicted=predicted,
            confidence=confidence,
            reason=reason,
            slo_p95_ms=self.slo_p95_ms,
            config_pbtxt=render_pbtxt(proposed, instance_kind=obs.config.instance_kind),
            config_json=json.dumps(doc, sort_keys=True),
            evidence={**obs.evidence, **(evidence or self.evidence)},
        )


def _left_alone(draft: _Draft) -> Recommendation:
    """Triton refuses dynamic_batching here: an ensemble's steps, or the sequence
    batcher, decide how requests are grouped."""
    obs = draft.obs
    observed = observed_prediction(obs, None)
    what = (
        "an ensemble: its steps' models batch for it, so tune those"
        if obs.config.platform == "ensemble"
        else "sequence-batched: the sequence batcher owns batching"
    )
    return draft.finish("no_change", obs.batcher, observed, observed, f"this model is {what}", 1.0)


_PROBE_REASON = (
    "enable dynamic batching to measure; no gain predicted until measured. "
    "{in_server:.1f} requests are in the server at once on average but run one at a "
    "time, and only batch size 1 has been seen, so how the model's cost grows with "
    "batch size is unknown. Dynamic batching with no delay only groups requests that "
    "are already waiting (it adds no wait of its own); Triton fills in "
    "preferred_batch_size [{max_batch}] itself, which with no delay changes nothing. "
    "Apply it, let it run, then ask again for a tuned config."
)


def _single_size(draft: _Draft, settings: RecommendSettings) -> Recommendation:
    """Only batch size 1 was seen: how the cost grows with the batch is unknown. A
    model whose requests overlap but run one at a time gets the probe (dynamic
    batching with no delay), which claims no gain: its predicted figures are today's."""
    obs, cur = draft.obs, draft.obs.batcher
    probe = replace(cur, dynamic_batching=True, preferred_batch_sizes=(), max_queue_delay_us=0)
    observed = observed_prediction(obs, None)
    concurrent = obs.in_server >= 1.5 or (obs.pending_mean or 0.0) >= 1.0
    if not cur.dynamic_batching and concurrent and cur.max_batch_size > 1:
        reason = _PROBE_REASON.format(in_server=obs.in_server, max_batch=cur.max_batch_size)
        return draft.finish(
            "probe", probe, observed, observed, reason, _confidence(obs, probe, "probe")
        )
    reason = (
        "requests do not overlap, so batching has nothing to group"
        if not concurrent
        else "only batch size 1 has been seen; keep observing"
    )
    return draft.finish("no_change", cur, observed, observed, reason, 0.3)


def _tuned(
    draft: _Draft,
    fit: ServiceTimeFit,
    settings: RecommendSettings,
    standing: BatcherConfig | None,
) -> Recommendation:
    """Search the candidates through the batcher model fitted to the observation and
    choose by the comparison rule of ``choice``."""
    obs, cur, slo = draft.obs, draft.obs.batcher, draft.slo_p95_ms
    model = batcher_model(obs, settings, earlier=draft.earlier)
    assert model is not None  # the slope is identified here
    found = search(model, obs, settings, standing=standing, slo_p95_ms=slo)
    cur_e, best = found.current, found.chosen
    observed = observed_prediction(obs, cur_e.prediction)
    uncertainty = gain_uncertainty(best, cur_e, fit)
    evidence: Evidence = {
        **draft.evidence,
        "p95_limit_ms": round(found.limit_ms, 3),
        "current_predicted_qps": round(cur_e.qps, 1),
        "current_predicted_p95_ms": round(cur_e.p95_ms, 3),
        "service_scale": round(model.scale, 3),
        "candidates": found.screened,
        "simulations": found.simulations,
        "standing": _describe(standing) if standing is not None else None,
        "predicted_gain": best.qps / cur_e.qps if cur_e.qps > 0 else None,
        "gain_uncertainty": round(math.expm1(GAIN_Z * uncertainty), 4)
        if math.isfinite(uncertainty)
        else None,
        **_over_standing(found, standing, fit),
    }
    if best.config == cur:
        kept = replace(cur_e.prediction, qps=observed.qps)
        reason = _kept_reason(cur, cur_e, fit, found, settings)
        return draft.finish(
            "no_change", cur, observed, kept, reason, _confidence(obs, cur, "no_change"), evidence
        )
    gain = best.qps / cur_e.qps if cur_e.qps > 0 else 1.0
    # The model's ratio carried onto the measured figure: one current figure (the
    # observed QPS), one gain (see ``figures``).
    predicted = replace(best.prediction, qps=observed.qps * gain)
    reason = _tune_reason(draft, fit, settings, found, predicted, observed)
    return draft.finish(
        "tune",
        best.config,
        observed,
        predicted,
        reason,
        _confidence(obs, best.config, "tune"),
        evidence,
    )


def _over_standing(
    found: SearchResult, standing: BatcherConfig | None, fit: ServiceTimeFit
) -> Evidence:
    """The chosen config's predicted gain over the standing advice, and its
    uncertainty (both as ratios − 1), when there is standing advice to compare with."""
    held = next((e for e in found.finals if e.config == standing), None)
    if held is None or held.config == found.chosen.config:
        return {}
    spread = gain_uncertainty(found.chosen, held, fit)
    return {
        "gain_over_standing": round(math.expm1(log_gain(found.chosen, held)), 4),
        "gain_over_standing_uncertainty": round(math.expm1(GAIN_Z * spread), 4)
        if math.isfinite(spread)
        else None,
    }


def _tune_reason(
    draft: _Draft,
    fit: ServiceTimeFit,
    settings: RecommendSettings,
    found: SearchResult,
    predicted: Prediction,
    observed: Prediction,
) -> str:
    obs, slo, best = draft.obs, draft.slo_p95_ms, found.chosen
    objective = (
        f"p95 ≤ {slo:g} ms"
        if slo is not None
        else f"p95 no more than {settings.latency_margin - 1:.0%} above the current"
    )
    cost = (
        f"an execution costs {fit.intercept_ms:.2f} ms fixed plus "
        f"{fit.per_sample_ms:.2f} ms per sample (fitted from "
        f"{fit.executions} executions at {len(fit.points)} batch sizes)"
    )
    if not found.meets_objective:
        return (
            f"no candidate meets the objective ({objective}); {_describe(best.config)} comes "
            f"closest with p95 {best.p95_ms:.1f} ms. " + cost
        )
    load_text = (
        f"{obs.population} concurrent clients"
        if obs.population is not None
        else f"{obs.rates.requests_per_s:.0f} requests/s"
    )
    gain = gain_figures(observed.qps, predicted.qps).gain or 1.0
    spread = gain_uncertainty(best, found.current, fit)
    margin = f" (±{math.expm1(GAIN_Z * spread):.0%})" if math.isfinite(spread) else ""
    return (
        f"{cost}. At the observed load ({load_text}) {_describe(best.config)} is "
        f"predicted to serve {gain:.2f}×{margin} today's QPS at p95 {best.p95_ms:.1f} ms "
        f"(now {found.current.p95_ms:.1f} ms), within the objective ({objective})."
    )


@dataclass(frozen=True)
class SearchResult:
    """What the search found: the chosen config and the running one, each with its
    paired runs, and what it cost."""

    chosen: Estimate
    current: Estimate
    finals: tuple[Estimate, ...]
    limit_ms: float
    meets_objective: bool
    screened: int
    simulations: int


def search(
    model: BatcherModel,
    obs: Observation,
    settings: RecommendSettings,
    *,
    standing: BatcherConfig | None = None,
    slo_p95_ms: float | None = None,
) -> SearchResult:
    """Coarse to fine: screen, refine around the best, then paired runs of the
    finalists, the running config and ``standing`` on every variant and seed; the
    choice follows ``choice`` (deterministic for the same inputs: fixed seeds)."""
    cur = obs.batcher
    current = _estimate(model, cur, settings)
    limit = slo_p95_ms if slo_p95_ms is not None else current.p95_ms * settings.latency_margin
    screen = _Screen(model, settings)
    coarse = _candidates(obs, settings, coarse=True)
    ranked = screen.rank([c for c in coarse if c.instance_count == cur.instance_count], limit)
    refined = _refinements(ranked[: settings.refine], obs, settings)
    ranked = screen.rank(list(dict.fromkeys(ranked + refined)), limit)
    finalists = [c for c in dict.fromkeys(ranked[: settings.finalists]) if c != cur]
    if standing is not None and standing not in (cur, *finalists) and _feasible(standing, obs):
        finalists.append(standing)
    finals = (current, *(_estimate(model, c, settings) for c in finalists))
    # The standing advice first: the stored recommendation, else the running config.
    order = ([standing] if standing is not None else []) + [cur]
    meeting = [e for e in finals if meets(e, limit, standing=e.config in order)]
    if meeting:
        top = _most_throughput(meeting, settings)
        options = [e for e in meeting if e.config.instance_count <= top.config.instance_count]
        chosen = prefer(
            top, options, model.observation.fit, standing=order, min_gain=settings.min_gain
        )
    else:
        chosen = min(finals, key=lambda e: e.p95_ms)
    return SearchResult(
        chosen=chosen,
        current=current,
        finals=finals,
        limit_ms=limit,
        meets_objective=bool(meeting),
        screened=screen.count,
        simulations=screen.count + len(finals) * (len(current.runs) + len(current.window_runs)),
    )


class _Screen:
    """Short runs of the middle variant, each config once."""

    def __init__(self, model: BatcherModel, settings: RecommendSettings) -> None:
        self.model, self.settings = model, settings
        self.seen: dict[BatcherConfig, Prediction] = {}
        self.variant = (model.middle(),)

    @property
    def count(self) -> int:
        return len(self.seen)

    def __call__(self, config: BatcherConfig) -> Prediction:
        if config not in self.seen:
            (self.seen[config],) = self.model.runs(
                config,
                requests=self.settings.screen_requests,
                seeds=(self.settings.seed,),
                variants=self.variant,
            )
        return self.seen[config]

    def rank(self, configs: list[BatcherConfig], limit: float) -> list[BatcherConfig]:
        """Best first: those near the objective by QPS, the rest by p95; near-ties to
        the simpler config."""

        def key(c: BatcherConfig) -> tuple[int, float, tuple[int, int, int, bool]]:
            p = self(c)
            meets = _p95(p) <= limit * 1.05
            return (0 if meets else 1, -round(p.qps, 0) if meets else _p95(p), simplicity(c))

        return sorted(configs, key=key)


def _estimate(model: BatcherModel, config: BatcherConfig, settings: RecommendSettings) -> Estimate:
    runs = model.runs(config, requests=settings.final_requests, seeds=settings.final_seeds)
    windows = model.window_runs(config, requests=settings.final_requests, seeds=(settings.seed,))
    return Estimate(config=config, prediction=mean_prediction(runs), runs=runs, window_runs=windows)


def _refinements(
    best: list[BatcherConfig], obs: Observation, settings: RecommendSettings
) -> list[BatcherConfig]:
    """Around each of ``best``: the delays next to its own in ``delays_us``, and one
    instance more and one fewer."""
    out: list[BatcherConfig] = []
    delays = sorted(set(settings.delays_us) | set(settings.coarse_delays_us))
    counts = _instance_counts(obs.batcher, settings)
    for c in best:
        if c.dynamic_batching and c.max_queue_delay_us in delays:
            i = delays.index(c.max_queue_delay_us)
            out += [replace(c, max_queue_delay_us=d) for d in delays[max(i - 1, 0) : i + 2]]
        out += [replace(c, instance_count=n) for n in counts]
    return [c for c in dict.fromkeys(out) if _feasible(c, obs)]


def _p95(prediction: Prediction) -> float:
    """A simulated p95; infinite when no request completed (it meets no objective)."""
    return prediction.p95_ms if prediction.p95_ms is not None else math.inf


def _kept_reason(
    cur: BatcherConfig,
    cur_e: Estimate,
    fit: ServiceTimeFit,
    found: SearchResult,
    settings: RecommendSettings,
) -> str:
    reason = (
        f"the current config ({_describe(cur)}) is kept: {cur_e.qps:.0f} QPS at p95 "
        f"{cur_e.p95_ms:.1f} ms predicted, and no candidate beat it by more than the "
        f"uncertainty of its predicted gain (and at least {settings.min_gain:.0%})"
    )
    if fit.per_sample_ms is not None and fit.intercept_ms < fit.per_sample_ms:
        reason += (
            f" (an execution costs {fit.intercept_ms:.2f} ms plus "
            f"{fit.per_sample_ms:.2f} ms per sample, so batching saves little)"
        )
    return reason


def _most_throughput(meeting: list[Estimate], settings: RecommendSettings) -> Estimate:
    """The most throughput. Every extra instance costs device memory, so a higher
    count must earn ``instance_gain`` more throughput than the best config with fewer
    instances."""
    by_count: dict[int, Estimate] = {}
    for e in sorted(meeting, key=lambda e: (-e.qps, simplicity(e.config))):
        by_count.setdefault(e.config.instance_count, e)
    counts = sorted(by_count)
    chosen = by_count[counts[0]]
    for n in counts[1:]:
        if by_count[n].qps >= chosen.qps * (1 + settings.instance_gain):
            chosen = by_count[n]
    return chosen


def _feasible(config: BatcherConfig, obs: Observation) -> bool:
    if config.dynamic_batching and config.max_batch_size < obs.request_batch:
        return False
    return all(p <= config.max_batch_size for p in config.preferred_batch_sizes)


def _instance_counts(cur: BatcherConfig, settings: RecommendSettings) -> list[int]:
    return sorted(
        {
            cur.instance_count,
            min(cur.instance_count + 1, settings.max_instances),
            max(cur.instance_count - 1, 1),
        }
    )


def _candidates(
    obs: Observation, settings: RecommendSettings, *, coarse: bool = False
) -> list[BatcherConfig]:
    """Every config the search may propose (``coarse``: only ``coarse_delays_us``).
    Preferred sizes a closed loop can never fill (more samples than its clients send
    at once) are left out: Triton would wait for them in vain, so they only add the
    delay."""
    cur = obs.batcher
    counts = _instance_counts(cur, settings)
    out = [replace(cur, instance_count=n) for n in counts]
    if cur.max_batch_size <= 1:
        return out
    reach = obs.population * obs.request_batch if obs.population is not None else cur.max_batch_size
    sizes = [p for p in (2, 4, 8, 16, 32, 64, 128) if p <= min(cur.max_batch_size, reach)]
    preferred: list[tuple[int, ...]] = [()]
    preferred += [(p,) for p in sizes if p >= 4]
    preferred += [(p // 2, p) for p in sizes if p >= 8]
    delays = settings.coarse_delays_us if coarse else settings.delays_us
    for n in counts:
        for delay in delays:
            for pref in preferred:
                out.append(
                    replace(
                        cur,
                        dynamic_batching=True,
                        preferred_batch_sizes=pref,
                        max_queue_delay_us=delay,
                        instance_count=n,
                    )
                )
    return [c for c in dict.fromkeys(out) if _feasible(c, obs)]


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


def observed_prediction(obs: Observation, current_sim: Prediction | None) -> Prediction:
    """The measured figures of ``obs``: its QPS, and Triton's p95 plus the client time
    when summaries are enabled (else ``current_sim``'s p95)."""
    p95 = (
        obs.server_p95_ms + obs.think_ms
        if obs.server_p95_ms is not None
        else current_sim.p95_ms
        if current_sim
        else None
    )
    return Prediction(
        qps=obs.rates.requests_per_s,
        p95_ms=p95,
        avg_batch_size=obs.rates.avg_batch_size,
        busy_share=obs.rates.busy_share,
    )


def _describe(config: BatcherConfig) -> str:
    if not config.dynamic_batching:
        return f"no dynamic batching, {config.instance_count} instance(s)"
    pref = (
        f"preferred {list(config.preferred_batch_sizes)}"
        if config.preferred_batch_sizes
        else "no preferred sizes"
    )
    return (
        f"dynamic batching ({pref}, delay {config.max_queue_delay_us} µs), "
        f"{config.instance_count} instance(s)"
    )
