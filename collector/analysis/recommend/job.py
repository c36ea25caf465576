"""The recommender run against the store: one model (``recommend_model``), or every
model as a scheduler analysis (``recommender_job``); recommendations to and from
their JSON document."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import TypeAdapter

from collector.analysis.recommend.cache import (
    INPUTS_KEY,
    model_inputs,
    reuse_inputs,
    reused,
    standing_recommendation,
)
from collector.analysis.recommend.observe import observe_windows
from collector.analysis.recommend.search import recommend_from_observation
from collector.analysis.recommend.settings import DEFAULT_SETTINGS, RecommendSettings
from collector.records import Recommendation
from collector.store import Store

# The one converter between a Recommendation and its JSON document (the store keeps
# its nested parts with the same library).
_RECOMMENDATION_JSON: TypeAdapter[Recommendation] = TypeAdapter(Recommendation)


def recommend_model(
    store: Store,
    target: str,
    model: str,
    *,
    slo_p95_ms: float | None = None,
    window_s: float = DEFAULT_SETTINGS.window_s,
    now: float | None = None,
    settings: RecommendSettings | None = None,
) -> Recommendation | None:
    """Observe ``model`` over the ``window_s`` seconds up to ``now`` and recommend;
    None when the store holds too little traffic for it, or nothing fresh (see
    ``observe``).

    The recommendation stored last for the running config is the *standing* one: it
    is reused as it stands while the inputs it was computed from still hold within
    ``reuse_tolerance`` (the store is the recommender's cache: no simulation then),
    and otherwise a challenger must beat it by more than the uncertainty of its gain
    (``choice``)."""
    settings = replace(settings or RecommendSettings(), window_s=window_s)
    now = time.time() if now is None else now
    windows = observe_windows(store, target, model, settings=settings, now=now)
    if not windows:
        return None
    obs = windows[0]
    standing = standing_recommendation(store, obs)
    inputs = model_inputs(obs, slo_p95_ms)
    if standing is not None and reuse_inputs(standing, inputs, settings.reuse_tolerance):
        return reused(standing, obs, now)
    rec = recommend_from_observation(
        obs,
        slo_p95_ms=slo_p95_ms,
        settings=settings,
        now=now,
        standing=standing.proposed_config if standing is not None else None,
        earlier=windows[1:],
    )
    return replace(rec, evidence={**rec.evidence, INPUTS_KEY: json.dumps(inputs, sort_keys=True)})


def store_recommendation(store: Store, rec: Recommendation) -> int:
    """Keep ``rec`` in the store (status ``"open"``); returns its id."""
    return store.add_recommendation(rec)


def recommender_job(
    slo_p95_ms: Mapping[str, float] | None = None, *, window_s: float = DEFAULT_SETTINGS.window_s
) -> Callable[[Store, float], list[int]]:
    """The recommender as a scheduler analysis (``CollectorService(analyses=[...])``):
    a recommendation per model with enough traffic in the last ``window_s``, stored."""
    objectives = dict(slo_p95_ms or {})

    def run_recommender_job(store: Store, now: float) -> list[int]:
        stored = []
        for target in store.targets():
            if target.kind != "triton":
                continue
            for _, model in sorted(store.latest_model_configs(target.name)):
                rec = recommend_model(
                    store,
                    target.name,
                    model,
                    slo_p95_ms=objectives.get(model),
                    window_s=window_s,
                    now=now,
                )
                if rec is not None:
                    stored.append(store_recommendation(store, rec))
        return stored

    return run_recommender_job


def recommendation_to_dict(rec: Recommendation) -> dict[str, Any]:
    """JSON-ready form; ``recommendation_from_dict`` reads it back."""
    doc: dict[str, Any] = _RECOMMENDATION_JSON.dump_python(rec, mode="json")
    return doc


def recommendation_from_dict(doc: Mapping[str, Any]) -> Recommendation:
    return _RECOMMENDATION_JSON.validate_python(doc)
