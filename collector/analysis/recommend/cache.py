"""The store as the recommender's cache, and the standing recommendation.

Every recommendation the CLI or the scheduler makes is stored. The latest one made
for the config that still runs (same ``current_config``, still ``open``) is the
*standing* recommendation. Its evidence keeps the model inputs it was computed from
(``INPUTS_KEY``: the fitted service-time line, the load, the config, the objective).
While today's inputs match those within ``reuse_tolerance``, the same search would
answer the same, so the standing recommendation is reused as it stands — re-dated,
with today's measured figures — and no simulation runs. Otherwise the search runs
again and the standing config only gives way to a challenger that beats it by more
than the uncertainty of the gain (``choice``).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

from collector.analysis.recommend.observe import Observation
from collector.analysis.recommend.search import observed_prediction
from collector.records import Recommendation
from collector.store import Store

__all__ = [
    "INPUTS_KEY",
    "model_inputs",
    "reuse_inputs",
    "reused",
    "standing_recommendation",
]

INPUTS_KEY = "inputs"
"""Evidence key of the JSON document of the model inputs a recommendation came from."""

Inputs = dict[str, float | int | str | None]

# Inputs that must be equal; the others are numbers compared within the tolerance.
_EXACT = ("config", "slo_p95_ms", "population", "request_batch", "load")


def standing_recommendation(store: Store, obs: Observation) -> Recommendation | None:
    """The latest stored recommendation for ``obs``'s model when it was made for the
    config now running and is still open; else None."""
    latest = store.latest_recommendation(obs.target, obs.model)
    if latest is None:
        return None
    rec = latest.recommendation
    if latest.status != "open" or rec.current_config != obs.batcher:
        return None
    return rec


def model_inputs(obs: Observation, slo_p95_ms: float | None) -> Inputs:
    """What the batcher model and the search are computed from (see ``observe``).
    Times are in ms; the service-time line is kept as its value at batch 1 and at
    ``max_batch_size`` (what the candidates span)."""
    fit = obs.fit
    top = max(obs.batcher.max_batch_size, 1)
    line_1 = line_top = None
    if fit is not None and fit.per_sample_ms is not None:
        line_1, line_top = fit.line_ms(1), fit.line_ms(top)
    return {
        "config": json.dumps(obs.batcher.__dict__, sort_keys=True, default=list),
        "slo_p95_ms": slo_p95_ms,
        "population": obs.population,
        "request_batch": obs.request_batch,
        "load": "closed" if obs.population is not None else "open",
        "request_ms": (obs.rates.request_us_per_request or 0.0) / 1000.0,
        "requests_per_s": obs.rates.requests_per_s,
        "think_ms": obs.think_ms,
        "least_think_ms": obs.least_think_ms,
        "overhead_ms": obs.overhead_ms,
        "service_ms_1": line_1,
        "service_ms_max": line_top,
        "cpu_fraction": obs.cpu_fraction,
        "cores_available": obs.cores_available,
        "dispersion": obs.dispersion if obs.population is None else None,
    }


def reuse_inputs(standing: Recommendation, inputs: Inputs, tolerance: float) -> bool:
    """Whether ``standing`` was computed from ``inputs`` within ``tolerance``.

    Rates, the dispersion and the cores compare relatively; times relative to the
    request cycle (request time plus client time, so a client time near zero does not
    count its jitter as a change); the CPU share absolutely."""
    doc = standing.evidence.get(INPUTS_KEY)
    if not isinstance(doc, str):
        return False
    try:
        before = json.loads(doc)
    except ValueError:
        return False
    if not isinstance(before, dict) or set(before) != set(inputs):
        return False
    if any(before[k] != inputs[k] for k in _EXACT):
        return False
    cycle = _number(inputs["request_ms"]) + _number(inputs["think_ms"])
    for key, now_value in inputs.items():
        if key in _EXACT:
            continue
        then = before[key]
        if (then is None) != (now_value is None):
            return False
        if then is None or now_value is None:
            continue
        a, b = _number(then), _number(now_value)
        if key.endswith("_ms"):
            scale = max(cycle, 1e-9)
        elif key == "cpu_fraction":
            scale = 1.0
        else:
            scale = max(abs(a), abs(b), 1e-9)
        if abs(a - b) > tolerance * scale:
            return False
    return True


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def reused(standing: Recommendation, obs: Observation, now: float) -> Recommendation:
    """``standing`` again at ``now``, with today's measured figures: a tune keeps its
    gain (the predicted QPS moves with the measured one), anything else claims none."""
    observed = observed_prediction(obs, standing.current)
    gain = standing.evidence.get("predicted_gain")
    if standing.kind == "tune" and isinstance(gain, (int, float)):
        predicted = replace(standing.predicted, qps=observed.qps * float(gain))
    else:
        predicted = replace(standing.predicted, qps=observed.qps)
    return replace(
        standing,
        created_at=now,
        current=observed,
        predicted=predicted,
        evidence={"computed_at": standing.created_at, **standing.evidence},
    )
