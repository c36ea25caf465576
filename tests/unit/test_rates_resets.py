"""Counters that go down: a restart to zero counts what accrued since, a move to another
long-running server's counters (part-way down, or back up to the first one's) is a new
baseline that adds nothing, so no stored rate spikes or goes negative; the lean window
path (``detect.increases``) judges every pair as the full one does."""

from __future__ import annotations

from collections.abc import Sequence

from collector.analysis.detect.increases import series_increase
from collector.analysis.rates import (
    CounterTrack,
    PairKind,
    counter_increase,
    rates_between,
    sample_pair_kind,
    window_rates,
)
from collector.records import MODEL_COUNTERS, ModelMetrics, ModelRates, ModelSample
from collector.store.windows import CounterReading

RATE = 86.0  # requests per second: the true load in these series


def sample(t: float, requests: float) -> ModelSample:
    """A sample whose counters all follow its request count (2 inferences, 1 execution,
    1 ms of request time and 0.2 ms of queue per request)."""
    return ModelSample(
        target="t",
        collected_at=t,
        metrics=ModelMetrics(
            model="m",
            version="1",
            request_success=requests,
            inference_count=2 * requests,
            exec_count=requests,
            queue_duration_us=200 * requests,
            request_duration_us=1000 * requests,
            compute_infer_duration_us=500 * requests,
            request_failure_by_reason={"REJECTED": 0.0},
        ),
    )


def per_scrape_rates(samples: Sequence[ModelSample]) -> list[ModelRates]:
    """The rates the collector stores at each scrape: one track over the series."""
    track = CounterTrack()
    return [rates_between(p, c, track=track) for p, c in zip(samples, samples[1:], strict=False)]


def assert_no_spike(rates: Sequence[ModelRates], *, at_most: float) -> None:
    for r in rates:
        for figure in (r.requests_per_s, r.inferences_per_s, r.executions_per_s, r.fail_per_s):
            assert figure >= 0.0
        assert r.requests_per_s <= at_most, r


def test_a_restart_to_zero_under_load_counts_what_accrued_since() -> None:
    series = [sample(float(t), 50_000 + RATE * t) for t in range(5)]
    # Triton restarted 0.6 s before the next scrape: 52 requests since.
    series.append(sample(5.0, 52.0))
    series.append(sample(6.0, 52.0 + RATE))
    rates = per_scrape_rates(series)
    assert rates[4].resets == 1
    assert rates[4].requests_per_s == 52.0
    assert rates[4].inferences_per_s == 104.0
    assert rates[5].requests_per_s == RATE
    assert_no_spike(rates, at_most=RATE)


def test_a_part_way_drop_is_a_new_baseline_without_a_spike() -> None:
    # 108785 -> 54363: another long-running server behind the same address.
    series = [sample(float(t), 108_785 - RATE * (4 - t)) for t in range(5)]
    series += [sample(5.0 + t, 54_363 + RATE * t) for t in range(4)]
    rates = per_scrape_rates(series)
    assert rates[4].requests_per_s == 0.0 and rates[4].resets == 1
    assert rates[4].queue_us_per_request is None
    assert [r.requests_per_s for r in rates[5:]] == [RATE] * 3
    assert_no_spike(rates, at_most=RATE)


def test_flipping_between_two_servers_spikes_in_neither_direction() -> None:
    a, b = 108_785.0, 54_363.0
    series = []
    for t in range(40):
        # The address flips every scrape for a while, then every third scrape.
        on_a = t % 2 == 0 if t < 20 else (t // 3) % 2 == 0
        series.append(sample(float(t), (a if on_a else b) + RATE * t))
    rates = per_scrape_rates(series)
    assert_no_spike(rates, at_most=RATE)
    counted = [r for r in rates if r.requests_per_s > 0]
    # Every pair on one server is counted at the true rate.
    assert len(counted) >= 10
    assert all(r.requests_per_s == RATE for r in counted)
    # The window over the whole series adds the same as the per-scrape rates.
    whole = window_rates(series)
    assert whole is not None
    assert whole.requests_per_s * whole.window_s == sum(r.requests_per_s for r in rates)


def test_an_idle_model_that_restarts_and_takes_a_burst_counts_it() -> None:
    series = [sample(float(t), 7_000.0) for t in range(5)]  # idle: nothing counted
    series.append(sample(5.0, 80.0))  # restarted, then a burst of 80 requests
    rates = per_scrape_rates(series)
    assert rates[4].requests_per_s == 80.0 and rates[4].resets == 1
    # A drop to more than the floor while idle is another server's history.
    track = CounterTrack(per_s=(0.0, 0.0, 0.0))
    assert counter_increase(series[0], sample(1.0, 5_000.0), track).counters == dict.fromkeys(
        MODEL_COUNTERS, 0.0
    )


def test_the_lean_window_judges_every_pair_as_the_full_one() -> None:
    a, b = 108_785.0, 54_363.0
    series = []
    for t in range(30):
        on_a = (t // 2) % 2 == 0 if t < 15 else t < 25
        requests = (a if on_a else b) + RATE * t
        if t == 27:
            requests = 30.0  # and a restart
        if t > 27:
            requests = 30.0 + RATE * (t - 27)
        series.append(sample(float(t), requests))
    readings = [
        CounterReading(
            collected_at=s.collected_at,
            counters=tuple(float(getattr(s.metrics, name)) for name in MODEL_COUNTERS),
            failure_by_reason=s.metrics.request_failure_by_reason,
            pending_request_count=None,
            stats_counts=None,
            batch_stats_doc=None,
        )
        for s in series
    ]
    full = window_rates(series)
    lean = series_increase(readings).increase
    assert full is not None
    assert lean.counters["request_success"] == full.requests_per_s * full.window_s
    assert lean.resets == full.resets >= 5
    kinds: set[PairKind] = set()
    track = CounterTrack()

    for p, c in zip(series, series[1:], strict=False):
        kinds.add(sample_pair_kind(track, p, c))
    assert kinds == {PairKind.COUNTED, PairKind.RESTART, PairKind.BREAK}


def test_a_move_up_to_a_server_that_counted_longer_is_a_break_but_a_surge_counts() -> None:
    series = [sample(float(t), 54_363 + RATE * t) for t in range(4)]
    series += [sample(4.0 + t, 108_785 + RATE * t) for t in range(3)]
    rates = per_scrape_rates(series)
    assert [r.requests_per_s for r in rates] == [RATE] * 3 + [0.0] + [RATE] * 2
    # A real surge, from 86 to 2000 requests/s (23x): every pair counted (the first
    # spans the 2 s from t=3 to t=5, half of it at the surge's rate).
    surge = [sample(float(t), 1_000 + RATE * t) for t in range(4)]
    surge += [sample(4.0 + t, surge[-1].metrics.request_success + 2_000 * t) for t in range(1, 4)]
    assert [r.requests_per_s for r in per_scrape_rates(surge)] == [RATE] * 3 + [1_000.0] + [
        2_000.0
    ] * 2
    # Past SURGE_FACTOR times the rate (86 to 20000 requests/s) only its first pair is
    # left out, as a move would be.
    jump = [sample(float(t), 1_000 + RATE * t) for t in range(4)]
    jump += [sample(4.0 + t, jump[-1].metrics.request_success + 20_000 * t) for t in range(1, 4)]
    assert [r.requests_per_s for r in per_scrape_rates(jump)] == [RATE] * 3 + [0.0] + [20_000.0] * 2
