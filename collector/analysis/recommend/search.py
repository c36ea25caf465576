"""The recommendation for one observation: leave alone what Triton batches elsewhere,
probe when only batch size 1 was seen, else search candidate configs through the
batcher model and keep the best that meets the objective (see the package
docstring)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace

from collector.analysis.configs import (
    config_changes,
    config_with,
    has_own_batcher_choice,
    render_pbtxt,
)
from collector.analysis.fit import ServiceTimeFit
from collector.analysis.recommend.model import BatcherModel, batcher_model
from collector.analysis.recommend.observe import Evidence, Observation
from collector.analysis.recommend.settings import DEFAULT_SETTINGS, RecommendSettings
from collector.records import BatcherConfig, Prediction, Recommendation

Scored = tuple[BatcherConfig, Prediction]


def recommend_from_observation(
    obs: Observation,
    *,
    slo_p95_ms: float | None = None,
    settings: RecommendSettings = DEFAULT_SETTINGS,
    now: float | None = None,
) -> Recommendation:
    """The best config for the observed load (see the package docstring)."""
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
        },
    )
    if not has_own_batcher_choice(obs.config):
        return _left_alone(draft)
    if obs.fit is None or obs.fit.per_sample_ms is None:
        return _single_size(draft, settings)
    return _tuned(draft, obs.fit, settings)


@dataclass(frozen=True)
class _Draft:
    """What every recommendation about one observation shares."""

    obs: Observation
    slo_p95_ms: float | None
    now: float
    evidence: Evidence

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
    observed = _observed(obs, None)
    what = (
        "an ensemble: its steps' models batch for it, so tune those"
        if obs.config.platform == "ensemble"
        else "sequence-batched: the sequence batcher owns batching"
    )
    return draft.finish("no_change", obs.batcher, observed, observed, f"this model is {what}", 1.0)


def _single_size(draft: _Draft, settings: RecommendSettings) -> Recommendation:
    """Only batch size 1 was seen: how the cost grows with the batch is unknown. A
    model whose requests overlap but run one at a time gets the probe (dynamic
    batching with no delay), predicted for the worst case: no gain."""
    obs, cur = draft.obs, draft.obs.batcher
    probe = replace(cur, dynamic_batching=True, preferred_batch_sizes=(), max_queue_delay_us=0)
    # Pessimistic bound: a batch of b costs b single executions (no gain).
    bound = (
        batcher_model(obs, settings, per_sample_ms=obs.fit.intercept_ms)
        if obs.fit is not None
        else None
    )
    observed = _observed(obs, bound.predict(cur) if bound is not None else None)
    concurrent = obs.in_server >= 1.5 or (obs.pending_mean or 0.0) >= 1.0
    if not cur.dynamic_batching and concurrent and cur.max_batch_size > 1:
        predicted = bound.predict(probe) if bound is not None else observed
        reason = (
            f"{obs.in_server:.1f} requests are in the server at once on average but "
            f"run one at a time, and only batch size 1 has been seen, so how the "
            f"model's cost grows with batch size is not known yet. Dynamic batching "
            f"with no delay only groups requests that are already waiting (no added "
            f"wait); apply it to learn the cost curve, then ask again for the tuned "
            f"config. The prediction assumes the worst case, no gain."
        )
        return draft.finish(
            "probe", probe, observed, predicted, reason, _confidence(obs, probe, "probe")
        )
    reason = (
        "requests do not overlap, so batching has nothing to group"
        if not concurrent
        else "only batch size 1 has been seen; keep observing"
    )
    return draft.finish("no_change", cur, observed, observed, reason, 0.3)


def _tuned(draft: _Draft, fit: ServiceTimeFit, settings: RecommendSettings) -> Recommendation:
    """Search the candidates through the batcher model fitted to the observation."""
    obs, cur, slo = draft.obs, draft.obs.batcher, draft.slo_p95_ms
    model = batcher_model(obs, settings)
    assert model is not None  # the slope is identified here
    current_sim = model.predict(cur)
    observed = _observed(obs, current_sim)
    limit = slo if slo is not None else _p95(current_sim) * settings.latency_margin
    results, candidates = _search(model, obs, settings, limit)
    meeting = [(c, p) for c, p in results if _p95(p) <= limit]
    evidence: Evidence = {
        **draft.evidence,
        "p95_limit_ms": round(limit, 3),
        "current_predicted_qps": round(current_sim.qps, 1),
        "current_predicted_p95_ms": round(_p95(current_sim), 3),
        "service_scale": round(model.scale, 3),
        "candidates": candidates,
    }
    if not meeting:
        best_c, best_p = min(results, key=lambda cp: _p95(cp[1]))
    else:
        best_c, best_p = _choose(meeting, cur, settings)
    cur_p = next(p for c, p in results if c == cur)
    gain = best_p.qps / cur_p.qps if cur_p.qps > 0 else math.inf
    better_latency = _p95(best_p) < _p95(cur_p) * (1 - settings.min_gain)
    if best_c == cur or (gain < 1 + settings.min_gain and not better_latency):
        return draft.finish(
            "no_change",
            cur,
            observed,
            cur_p,
            _kept_reason(cur, cur_p, fit, settings),
            _confidence(obs, cur, "no_change"),
            evidence,
        )
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
    if not meeting:
        reason = (
            f"no candidate meets the objective ({objective}); {_describe(best_c)} comes "
            f"closest with p95 {_p95(best_p):.1f} ms. " + cost
        )
    else:
        load_text = (
            f"{obs.population} concurrent clients"
            if obs.population is not None
            else f"{obs.rates.requests_per_s:.0f} requests/s"
        )
        reason = (
            f"{cost}. At the observed load ({load_text}) {_describe(best_c)} is "
            f"predicted to serve {best_p.qps:.0f} QPS ({gain:.2f}× the current "
            f"{cur_p.qps:.0f}) at p95 {_p95(best_p):.1f} ms (now {_p95(cur_p):.1f} ms), "
            f"within the objective ({objective})."
        )
    return draft.finish(
        "tune", best_c, observed, best_p, reason, _confidence(obs, best_c, "tune"), evidence
    )


def _search(
    model: BatcherModel, obs: Observation, settings: RecommendSettings, limit: float
) -> tuple[list[Scored], int]:
    """Every candidate screened with short runs; the finalists (and the current
    config) predicted with full runs. Returns the finalists' predictions and the
    number of candidates screened."""
    screened = [
        (candidate, model.predict(candidate, requests=settings.screen_requests))
        for candidate in _candidates(obs, settings)
    ]
    # The finalists get longer runs; near-ties go to the simpler, cheaper config.
    screened.sort(key=lambda cp: -cp[1].qps if _p95(cp[1]) <= limit * 1.05 else _p95(cp[1]))
    finalists = [c for c, _ in screened[: settings.finalists]]
    if obs.batcher not in finalists:
        finalists.append(obs.batcher)
    return [(c, model.predict(c)) for c in finalists], len(screened)


def _p95(prediction: Prediction) -> float:
    """A simulated p95; infinite when no request completed (it meets no objective)."""
    return prediction.p95_ms if prediction.p95_ms is not None else math.inf


def _kept_reason(
    cur: BatcherConfig, cur_p: Prediction, fit: ServiceTimeFit, settings: RecommendSettings
) -> str:
    reason = (
        f"the current config ({_describe(cur)}) is already the best the batcher "
        f"model found for this load: {cur_p.qps:.0f} QPS at p95 "
        f"{_p95(cur_p):.1f} ms; no candidate beat it by {settings.min_gain:.0%}"
    )
    if fit.per_sample_ms is not None and fit.intercept_ms < fit.per_sample_ms:
        reason += (
            f" (an execution costs {fit.intercept_ms:.2f} ms plus "
            f"{fit.per_sample_ms:.2f} ms per sample, so batching saves little)"
        )
    return reason


def _choose(meeting: list[Scored], cur: BatcherConfig, settings: RecommendSettings) -> Scored:
    """The most throughput; near-ties go to lower p95, then the simpler change. Every
    extra instance costs device memory, so a higher count must earn
    ``instance_gain`` more throughput than the best config with fewer instances."""

    def best_of(options: list[Scored]) -> Scored:
        top = max(p.qps for _, p in options)
        near = [(c, p) for c, p in options if p.qps >= top * 0.99]
        return min(
            near,
            key=lambda cp: (_p95(cp[1]), len(config_changes(cur, cp[0])), cp[0].max_queue_delay_us),
        )

    by_count: dict[int, Scored] = {}
    for n in sorted({c.instance_count for c, _ in meeting}):
        by_count[n] = best_of([(c, p) for c, p in meeting if c.instance_count == n])
    counts = sorted(by_count)
    chosen = by_count[counts[0]]
    for n in counts[1:]:
        if by_count[n][1].qps >= chosen[1].qps * (1 + settings.instance_gain):
            chosen = by_count[n]
    return chosen


def _feasible(config: BatcherConfig, obs: Observation) -> bool:
    if config.dynamic_batching and config.max_batch_size < obs.request_batch:
        return False
    return all(p <= config.max_batch_size for p in config.preferred_batch_sizes)


def _candidates(obs: Observation, settings: RecommendSettings) -> list[BatcherConfig]:
    cur = obs.batcher
    counts = sorted(
        {
            cur.instance_count,
            min(cur.instance_count + 1, settings.max_instances),
            max(cur.instance_count - 1, 1),
        }
    )
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


def _observed(obs: Observation, current_sim: Prediction | None) -> Prediction:
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
