"""Synthetic scrapes shaped like a collector's own: statistics every few scrapes, the
failure reasons Triton lists, input and output times. A store seeded so holds the
records a running collector would have written, with the same rates."""

from __future__ import annotations

import pytest

from collector.analysis.rates import window_rates
from collector.store import Store
from collector.synthetic import Load, model_config, steady_load

REASONS = ("BACKEND", "CANCELED", "REJECTED", "OTHER")


def _load(**shape: object) -> Load:
    return Load(
        config=model_config("m", batching=True),
        qps=40.0,
        request_ms=10.0,
        queue_share=0.3,
        batch_mix={2: 0.5, 4: 0.5},
        cost_ms=lambda b: 4.0 + 0.5 * b,
        **shape,  # type: ignore[arg-type]
    )


def test_statistics_every_fifth_scrape_keep_the_rates(store: Store) -> None:
    steady_load(store, [_load()], target="every", start=1000.0, seconds=60)
    steady_load(store, [_load()], target="fifth", start=1000.0, seconds=60, stats_every=5)
    every = store.model_samples(target="every")
    fifth = store.model_samples(target="fifth")
    assert [s.stats is not None for s in fifth] == [i % 5 == 0 for i in range(61)]
    assert all(s.stats is not None for s in every)
    # The busy share comes from the statistics pairs, five scrapes apart.
    last, reference = fifth[-1].rates, every[-1].rates
    assert last is not None and reference is not None
    assert last.busy_share is not None and last.busy_share == pytest.approx(reference.busy_share)
    both = [window_rates(samples, instance_count=1) for samples in (every, fifth)]
    assert both[0] is not None and both[1] is not None
    assert both[1].requests_per_s == pytest.approx(both[0].requests_per_s)
    assert both[1].avg_batch_size == pytest.approx(3.0)


def test_failure_reasons_and_io_times_are_recorded(store: Store) -> None:
    steady_load(
        store, [_load(failure_reasons=REASONS, io_ms=0.1)], target="t", start=0.0, seconds=10
    )
    last = store.model_samples(target="t")[-1]
    assert last.metrics.request_failure_by_reason == dict.fromkeys(REASONS, 0.0)
    assert last.stats is not None
    assert {b.batch_size for b in last.stats.batch_stats} == {2, 4}
    for b in last.stats.batch_stats:
        assert b.compute_input.count == b.compute_infer.count == b.compute_output.count > 0
        assert b.compute_input.ns == pytest.approx(b.compute_input.count * 100_000, abs=1)
    rates = last.rates
    assert rates is not None and rates.fail_per_s == 0.0
    assert set(rates.fail_per_s_by_reason) == set(REASONS)
    assert rates.compute_input_us_per_request == pytest.approx(100.0)
    # The request time still splits into queue and compute as the load says.
    assert rates.request_us_per_request == pytest.approx(10_000.0)
    assert rates.queue_us_per_request == pytest.approx(3_000.0)


def test_stats_every_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="stats_every"):
        steady_load(store, [_load()], target="t", start=0.0, seconds=5, stats_every=0)
