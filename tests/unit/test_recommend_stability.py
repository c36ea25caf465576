"""Advice that holds still: the same inputs give the same advice, a challenger within
the uncertainty of its gain does not replace the standing advice (one beyond it does),
ties go to the simpler config, nothing is advised from stale samples, and the probe
says what it does and claims no gain. Also: Triton's auto-filled preferred size is
not taken for the operator's, and the probe's own batcher is not flagged."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from collector.analysis.detect import DetectorSettings, detectors, read_window
from collector.analysis.recommend import recommend_model
from collector.records import BatcherConfig, ModelConfig, Prediction
from collector.store import Store
from tests.unit.test_recommend import T0, config, fill

if TYPE_CHECKING:
    from collector.analysis.recommend.choice import Estimate

# What is new with this behaviour (the comparison rule, the figures, the reading of
# Triton's own fields) is imported inside the tests that use it, so that each test
# fails on its own assertion, not the module on an import, where it is missing.

FIXED_COST = {
    "qps": 900,
    "request_ms": 15.0,
    "queue_share": 0.4,
    "batch_mix": {4: 0.1, 8: 0.3, 12: 0.3, 16: 0.3},
    "cost_ms": lambda b: 8.0 + 0.3 * b,
}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def tuned_store(path: Path) -> Store:
    s = Store(f"sqlite:///{path}")
    fill(s, cfg=config(batching=True), seconds=60, **FIXED_COST)  # type: ignore[arg-type]
    return s


def test_same_inputs_give_the_same_advice(tmp_path: Path) -> None:
    one, two = tuned_store(tmp_path / "a.db"), tuned_store(tmp_path / "b.db")
    try:
        first = recommend_model(one, "t", "m", now=T0 + 61)
        second = recommend_model(two, "t", "m", now=T0 + 61)
        again = recommend_model(one, "t", "m", now=T0 + 61)
    finally:
        one.close()
        two.close()
    assert first is not None and first.kind == "tune"
    assert first == second == again


def test_advice_holds_on_calls_fifteen_seconds_apart(store: Store) -> None:
    """A steady load, asked every 15 s as the CLI would (each answer stored): the
    same advice every time, and after the first it is reused, not searched again."""
    fill(store, cfg=config(batching=True), seconds=120, **FIXED_COST)  # type: ignore[arg-type]
    seen = []
    for i in range(5):
        rec = recommend_model(store, "t", "m", now=T0 + 60 + 15 * i)
        assert rec is not None
        store.add_recommendation(rec)
        seen.append(rec)
    assert {r.proposed_config for r in seen} == {seen[0].proposed_config}
    assert all("computed_at" in r.evidence for r in seen[1:])
    from collector.analysis.recommend import recommendation_figures

    gains = {recommendation_figures(r).gain for r in seen}
    assert len(gains) == 1


def finals_of(store: Store, now: float) -> tuple[object, list[Estimate]]:
    from collector.analysis.recommend import batcher_model, observe_windows
    from collector.analysis.recommend.search import search
    from collector.analysis.recommend.settings import RecommendSettings

    settings = RecommendSettings()
    windows = observe_windows(store, "t", "m", settings=settings, now=now)
    model = batcher_model(windows[0], settings, earlier=windows[1:])
    assert model is not None
    found = search(model, windows[0], settings)
    return found, list(found.finals)


def standing_advice(rec: object, proposed: BatcherConfig) -> object:
    """``rec`` as if it had proposed ``proposed`` (computed from other inputs, so it
    is not simply reused)."""
    from collector.analysis.configs import config_changes

    return replace(
        rec,  # type: ignore[type-var]
        proposed_config=proposed,
        changes=config_changes(rec.current_config, proposed),  # type: ignore[attr-defined]
        evidence={},
    )


def test_a_challenger_within_the_uncertainty_does_not_replace_the_standing_advice(
    store: Store,
) -> None:
    from collector.analysis.recommend.choice import beats

    fill(store, cfg=config(batching=True), seconds=60, **FIXED_COST)  # type: ignore[arg-type]
    now = T0 + 61
    fresh = recommend_model(store, "t", "m", now=now)
    assert fresh is not None and fresh.kind == "tune"
    found, finals = finals_of(store, now)
    best = found.chosen  # type: ignore[attr-defined]
    tied = [
        e
        for e in finals
        if e.config not in (best.config, fresh.current_config)
        and e.config.instance_count == best.config.instance_count
        and e.p95_ms <= found.limit_ms  # type: ignore[attr-defined]
        and not beats(best, e, store_fit(store, now), min_gain=0.03)
    ]
    assert tied, "the search found no config within the uncertainty of its best"
    standing = tied[0].config
    assert fresh.proposed_config != standing  # on its own it would propose another
    store.add_recommendation(standing_advice(fresh, standing))  # type: ignore[arg-type]
    held = recommend_model(store, "t", "m", now=now)
    assert held is not None and held.proposed_config == standing


def store_fit(store: Store, now: float):  # type: ignore[no-untyped-def]
    from collector.analysis.recommend import observe_windows

    windows = observe_windows(store, "t", "m", now=now)
    return windows[0].fit


def test_a_challenger_beyond_the_uncertainty_replaces_the_standing_advice(
    store: Store,
) -> None:
    fill(store, cfg=config(batching=True), seconds=60, **FIXED_COST)  # type: ignore[arg-type]
    now = T0 + 61
    fresh = recommend_model(store, "t", "m", now=now)
    assert fresh is not None and fresh.kind == "tune"
    # Waiting 10 ms for batches of 32 that 16-odd clients never fill: clearly worse.
    poor = replace(fresh.current_config, preferred_batch_sizes=(32,), max_queue_delay_us=10000)
    store.add_recommendation(standing_advice(fresh, poor))  # type: ignore[arg-type]
    again = recommend_model(store, "t", "m", now=now)
    assert again is not None and again.proposed_config == fresh.proposed_config


def estimate(config: BatcherConfig, qps: list[float], p95: float = 20.0) -> Estimate:
    from collector.analysis.recommend.choice import Estimate

    runs = tuple(Prediction(qps=q, p95_ms=p95, avg_batch_size=8.0) for q in qps)
    mean = Prediction(qps=sum(qps) / len(qps), p95_ms=p95, avg_batch_size=8.0)
    return Estimate(config=config, prediction=mean, runs=runs)


def test_ties_go_to_the_standing_then_the_simpler_config() -> None:
    from collector.analysis.fit import fit_service_time
    from collector.analysis.recommend.choice import beats, prefer
    from collector.records import BatchStat, Duration

    fit = fit_service_time(
        [
            BatchStat(b, compute_infer=Duration(5000, int(5000e6 * (8 + 0.3 * b))))
            for b in (4, 8, 16)
        ]
    )
    base = BatcherConfig(max_batch_size=32, dynamic_batching=True)
    fancy = replace(base, preferred_batch_sizes=(8, 16), max_queue_delay_us=2000)
    plain = replace(base, max_queue_delay_us=500)
    simplest = base
    # fancy leads by 0.5 %: a near tie, which goes to the simplest, or to the standing.
    a = estimate(fancy, [1005, 1055, 955, 1005])
    b = estimate(plain, [1000, 1050, 950, 1000])
    c = estimate(simplest, [1000, 1040, 960, 1000])
    assert not beats(a, c, fit, min_gain=0.03)
    assert prefer(a, [a, b, c], fit, standing=[], min_gain=0.03).config == simplest
    assert prefer(a, [a, b, c], fit, standing=[plain], min_gain=0.03).config == plain
    # A 3 % lead within the uncertainty: fresh, the better config; against standing
    # advice, not enough to change it.
    e = estimate(fancy, [1030, 1110, 950, 1030])
    assert not beats(e, b, fit, min_gain=0.03)
    assert prefer(e, [e, b, c], fit, standing=[], min_gain=0.03).config == fancy
    assert prefer(e, [e, b, c], fit, standing=[plain], min_gain=0.03).config == plain
    # A clear lead is no tie.
    d = estimate(fancy, [1300, 1310, 1290, 1300])
    assert beats(d, c, fit, min_gain=0.03)
    assert prefer(d, [d, b, c], fit, standing=[plain], min_gain=0.03).config == fancy


def test_stale_samples_give_no_recommendation(store: Store) -> None:
    fill(store, cfg=config(batching=True), seconds=30, **FIXED_COST)  # type: ignore[arg-type]
    assert recommend_model(store, "t", "m", now=T0 + 31) is not None
    # The newest sample is a minute old: the server may be gone.
    assert recommend_model(store, "t", "m", now=T0 + 90) is None


def test_the_probe_says_what_it_does_and_claims_no_gain(store: Store) -> None:
    fill(
        store,
        cfg=config(batching=False),
        qps=100,
        request_ms=150,
        queue_share=0.93,
        batch_mix={1: 1.0},
        cost_ms=lambda b: 10.0,
    )
    rec = recommend_model(store, "t", "m", now=T0 + 31)
    assert rec is not None and rec.kind == "probe"
    assert rec.reason.startswith(
        "enable dynamic batching to measure; no gain predicted until measured"
    )
    assert rec.predicted.qps == rec.current.qps
    from collector.analysis.recommend import recommendation_figures

    figures = recommendation_figures(rec)
    assert figures.gain is None and figures.current_qps == rec.current.qps
    assert "no gain claimed" in figures.text()


def autofilled(preferred: tuple[int, ...], delay_us: int = 0) -> ModelConfig:
    doc = {
        "name": "m",
        "max_batch_size": 32,
        "dynamic_batching": {
            "preferred_batch_size": list(preferred),
            "max_queue_delay_microseconds": delay_us,
        },
    }
    return ModelConfig(
        model="m",
        max_batch_size=32,
        dynamic_batching=True,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=delay_us,
        raw_json=json.dumps(doc),
    )


def test_triton_s_own_preferred_size_is_not_the_operator_s() -> None:
    from collector.analysis.configs import (
        effective_batcher,
        operator_preferred_sizes,
        preferred_sizes_origin,
    )

    filled = autofilled((32,))
    assert preferred_sizes_origin(filled) == "auto"
    assert operator_preferred_sizes(filled) == ()
    assert effective_batcher(filled).preferred_batch_sizes == ()
    asked = replace(effective_batcher(filled), preferred_batch_sizes=(32,))
    assert preferred_sizes_origin(filled, asked) == "operator"
    assert preferred_sizes_origin(autofilled((8, 16))) == "operator"
    assert preferred_sizes_origin(autofilled(())) == "none"


def test_the_probe_s_batcher_is_not_flagged_below_preferred(tmp_path: Path) -> None:
    """Dynamic batching with no delay, Triton's [32] filled in, eight clients: batches
    of about 4 are the load, not a missed aim. With the operator's own preferred
    [16] the same batches are flagged."""
    settings = DetectorSettings(window_s=30.0, min_samples=3)
    subjects = {}
    for name, preferred in (("probe", (32,)), ("chosen", (16,))):
        store = Store(f"sqlite:///{tmp_path}/{name}.db")
        try:
            fill(
                store,
                cfg=autofilled(preferred),
                qps=800,
                request_ms=10.0,
                queue_share=0.4,
                batch_mix={4: 1.0},
                cost_ms=lambda b: 3.0 + 0.2 * b,
            )
            window = read_window(store, settings, now=T0 + 31)
            subjects[name] = detectors.batch_below_preferred(window, settings)
        finally:
            store.close()
    assert subjects["probe"] == []
    [chosen] = subjects["chosen"]
    assert math.isclose(chosen.evidence["reference_batch_size"], 16)


def test_a_standing_config_keeps_an_objective_its_p95_wavers_around() -> None:
    from collector.analysis.recommend.choice import Estimate, meets

    config = BatcherConfig(max_batch_size=32, dynamic_batching=True)
    runs = tuple(Prediction(qps=900.0, p95_ms=p) for p in (29.0, 31.5, 30.5, 29.5))
    wavering = Estimate(config=config, prediction=Prediction(qps=900.0, p95_ms=30.4), runs=runs)
    assert not meets(wavering, 30.0)
    assert meets(wavering, 30.0, standing=True)
    # ... but not one clearly above it.
    assert not meets(wavering, 25.0, standing=True)
