"""Rates from cumulative counters, across counter resets."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from collector.analysis.rates import (
    BATCH_FIGURES,
    CounterTrack,
    batch_size_increases,
    batch_stats_increase,
    bucket_rates,
    counter_increase,
    cumulative_increases,
    gauge_max,
    gauge_mean,
    increase_from_rates,
    is_reset,
    merge_over_series,
    merge_over_time,
    peak_rates,
    rates_between,
    rates_from_increase,
    sum_batch_stats,
    window_batch_stats,
    window_rates,
)
from collector.records import (
    MODEL_COUNTERS,
    BatchStat,
    Duration,
    ModelMetrics,
    ModelPeaks,
    ModelRates,
    ModelSample,
    ModelStats,
)


def sample(
    t: float,
    *,
    success: float,
    inferences: float,
    execs: float,
    queue_us: float,
    request_us: float,
    infer_us: float = 0.0,
    failures: dict[str, float] | None = None,
    batches: dict[int, tuple[int, int]] | None = None,
) -> ModelSample:
    stats = None
    if batches is not None:
        stats = ModelStats(
            model="m",
            version="1",
            inference_count=int(inferences),
            execution_count=int(execs),
            batch_stats=tuple(
                BatchStat(batch_size=size, compute_infer=Duration(count, ns))
                for size, (count, ns) in batches.items()
            ),
        )
    return ModelSample(
        target="t",
        collected_at=t,
        metrics=ModelMetrics(
            model="m",
            version="1",
            request_success=success,
            inference_count=inferences,
            exec_count=execs,
            queue_duration_us=queue_us,
            request_duration_us=request_us,
            compute_infer_duration_us=infer_us,
            request_failure_by_reason=failures or {},
        ),
        stats=stats,
    )


def test_rates_between_two_samples() -> None:
    a = sample(100.0, success=1000, inferences=1000, execs=250, queue_us=5000, request_us=20000)
    b = sample(
        110.0,
        success=3000,
        inferences=3000,
        execs=500,
        queue_us=45000,
        request_us=100000,
        infer_us=30000,
        failures={"REJECTED": 20},
    )
    r = rates_between(a, b)
    assert r.window_s == 10.0
    assert r.requests_per_s == 200.0
    assert r.inferences_per_s == 200.0
    assert r.executions_per_s == 25.0
    assert r.avg_batch_size == 8.0
    assert r.queue_us_per_request == 20.0
    assert r.request_us_per_request == 40.0
    assert r.queue_share == 0.5
    assert r.fail_per_s == 2.0 and r.fail_per_s_by_reason == {"REJECTED": 2.0}
    assert r.resets == 0


def test_reset_starts_a_new_segment_without_negative_or_spiking_rates() -> None:
    before = sample(
        0.0, success=90_000, inferences=90_000, execs=90_000, queue_us=9e6, request_us=9e7
    )
    # Triton restarted between the samples: 500 requests since the restart, at the
    # 100 requests/s the series was counted at before.
    after = sample(5.0, success=500, inferences=500, execs=500, queue_us=5e4, request_us=5e5)
    assert is_reset(before, after)
    r = rates_between(before, after, track=CounterTrack(per_s=(100.0, 100.0, 100.0)))
    assert r.requests_per_s == 100.0
    assert r.avg_batch_size == 1.0
    assert r.resets == 1
    assert min(r.requests_per_s, r.inferences_per_s, r.executions_per_s, r.fail_per_s) >= 0


def test_window_rates_sum_increases_across_a_reset() -> None:
    series = [
        sample(0.0, success=0, inferences=0, execs=0, queue_us=0, request_us=0),
        sample(1.0, success=100, inferences=400, execs=50, queue_us=1000, request_us=4000),
        sample(2.0, success=50, inferences=200, execs=25, queue_us=500, request_us=2000),  # reset
        sample(3.0, success=150, inferences=600, execs=75, queue_us=1500, request_us=6000),
    ]
    r = window_rates(series)
    assert r is not None
    assert r.window_s == 3.0
    assert r.requests_per_s == pytest.approx(250 / 3)
    assert r.avg_batch_size == 8.0
    assert r.queue_share == 0.25
    assert r.resets == 1
    assert window_rates(series[:1]) is None


def test_busy_share_from_batch_stats_over_instances() -> None:
    a = sample(
        0.0,
        success=0,
        inferences=0,
        execs=0,
        queue_us=0,
        request_us=0,
        batches={1: (10, 10_000_000)},
    )
    # 2 s later: 100 more batch-8 executions of 10 ms each = 1 s of compute on 2 instances.
    b = sample(
        2.0,
        success=800,
        inferences=800,
        execs=100,
        queue_us=0,
        request_us=1,
        batches={1: (10, 10_000_000), 8: (100, 1_000_000_000)},
    )
    r = rates_between(a, b, instance_count=2)
    assert r.busy_share == pytest.approx(0.25)
    assert rates_between(a, b).busy_share is None  # instance count unknown


def test_cumulative_increases_count_from_the_new_value_after_a_reset_or_a_drop() -> None:
    assert cumulative_increases([1.0, 5.0, 2.0], [3.0, 5.0, 7.5], reset=False) == [2.0, 0.0, 5.5]
    # A lone counter that went down started again: what it holds accrued since.
    assert cumulative_increases([1.0, 5.0], [3.0, 4.0], reset=False) == [2.0, 4.0]
    # Across a reset every counter counts from zero, grown or not.
    assert cumulative_increases([1.0, 5.0], [3.0, 4.0], reset=True) == [3.0, 4.0]
    assert cumulative_increases([], [], reset=False) == []


def test_batch_size_increases_of_plain_readings() -> None:
    assert BATCH_FIGURES[0] == "batch_size" and BATCH_FIGURES[3] == "compute_infer.count"
    before = {
        1: (1, 5, 100, 5, 1000, 5, 50),
        2: (2, 5, 100, 5, 1000, 5, 50),
        4: (4, 9, 900, 9, 9000, 9, 90),
    }
    now = [
        (1, 7, 160, 7, 1300, 7, 40),  # grew; output time went down: counts as 0
        (2, 5, 900, 5, 9000, 5, 90),  # no new execution: left out
        (4, 2, 20, 2, 200, 2, 2),  # reloaded: counts from zero
        (8, 3, 30, 3, 300, 3, 3),  # a new size
        (16, 0, 0, 0, 0, 0, 0),  # a new size that never executed
    ]
    assert [tuple(i) for i in batch_size_increases(before, now)] == [
        (1, 2, 60, 2, 300, 2, 0),
        (4, 2, 20, 2, 200, 2, 2),
        (8, 3, 30, 3, 300, 3, 3),
    ]
    assert batch_size_increases({}, []) == []


def test_batch_stats_increase_per_size_and_on_reset() -> None:
    prev = (
        BatchStat(1, compute_infer=Duration(5, 500)),
        BatchStat(4, compute_infer=Duration(2, 800)),
    )
    cur = (
        BatchStat(1, compute_infer=Duration(7, 700)),
        BatchStat(4, compute_infer=Duration(2, 800)),
        BatchStat(8, compute_infer=Duration(3, 3000)),
    )
    inc = batch_stats_increase(prev, cur)
    assert [(b.batch_size, b.exec_count, b.compute_infer.ns) for b in inc] == [
        (1, 2, 200),
        (8, 3, 3000),
    ]
    after_reset = batch_stats_increase(
        prev, (BatchStat(1, compute_infer=Duration(1, 100)),), reset=True
    )
    assert [(b.batch_size, b.exec_count) for b in after_reset] == [(1, 1)]


def test_window_batch_stats_sum_every_pair_and_count_a_restart_from_zero() -> None:
    counts = dict(success=0.0, inferences=0.0, execs=0.0, queue_us=0.0, request_us=0.0)
    series = [
        sample(0.0, **counts, batches={1: (10, 1000)}),
        sample(1.0, **{**counts, "success": 5.0}, batches={1: (12, 1200), 4: (1, 400)}),
        sample(2.0, **{**counts, "success": 9.0}, batches={1: (15, 1500), 4: (3, 1200)}),
        # Triton restarted: the metrics counters went down, so this reading is all new.
        sample(3.0, **{**counts, "success": 1.0}, batches={4: (2, 900)}),
    ]
    summed = window_batch_stats(series)
    assert [(b.batch_size, b.exec_count, b.compute_infer.ns) for b in summed] == [
        (1, 5, 500),
        (4, 5, 2100),
    ]
    since_two = window_batch_stats(series, since=2.0)
    assert [(b.batch_size, b.exec_count) for b in since_two] == [(1, 3), (4, 4)]
    assert window_batch_stats(series[:1]) == ()
    both = sum_batch_stats([summed, since_two])
    assert [(b.batch_size, b.exec_count, b.compute_infer.ns) for b in both] == [
        (1, 8, 800),
        (4, 9, 3800),
    ]


def test_idle_window_has_zero_rates_and_no_ratios() -> None:
    a = sample(0.0, success=10, inferences=10, execs=10, queue_us=10, request_us=10)
    b = sample(5.0, success=10, inferences=10, execs=10, queue_us=10, request_us=10)
    r = rates_between(a, b)
    assert r.requests_per_s == 0.0
    assert r.avg_batch_size is None and r.queue_share is None and r.queue_us_per_request is None


def test_model_reload_resets_only_the_statistics_counters() -> None:
    # A reload restarts the statistics API's counters; the metrics endpoint keeps counting.
    a = sample(
        0.0,
        success=10_000,
        inferences=10_000,
        execs=10_000,
        queue_us=1e6,
        request_us=1e7,
        batches={1: (10_000, 50_000_000_000)},
    )
    b = sample(
        1.0,
        success=10_100,
        inferences=10_100,
        execs=10_050,
        queue_us=1.01e6,
        request_us=1.01e7,
        batches={2: (50, 500_000_000)},
    )
    b = ModelSample(
        target=b.target,
        collected_at=b.collected_at,
        metrics=b.metrics,
        stats=ModelStats(
            model="m",
            version="1",
            inference_count=100,
            execution_count=50,
            batch_stats=b.stats.batch_stats,
        ),
    )
    r = rates_between(a, b, instance_count=1)
    assert r.requests_per_s == 100.0  # not 10 100: the metrics counters did not reset
    assert r.avg_batch_size == 2.0
    assert r.busy_share == pytest.approx(0.5)  # batch_stats since the reload only
    assert r.resets == 1


# --------------------------------------------------------------------------- merging


def busy_series() -> list[ModelSample]:
    """Five scrapes of one series with uneven windows and loads, a reset at t=6 and
    batch stats, so no plain average of the per-scrape rates equals the window's."""
    rows = [  # t, success, inferences, execs, queue_us, request_us, infer_us, batch-8 (n, ns)
        (0.0, 0, 0, 0, 0, 0, 0, (0, 0)),
        (1.0, 100, 400, 50, 1_000, 4_000, 2_000, (50, 400_000_000)),
        (4.0, 130, 520, 70, 1_600, 5_000, 2_600, (70, 560_000_000)),
        (6.0, 40, 80, 20, 4_000, 9_000, 900, (20, 300_000_000)),  # reset
        (10.0, 440, 3_280, 420, 44_000, 99_000, 40_900, (420, 6_300_000_000)),
    ]
    return [
        sample(
            t,
            success=s,
            inferences=i,
            execs=e,
            queue_us=q,
            request_us=r,
            infer_us=c,
            failures={"REJECTED": s / 10},
            batches={8: b},
        )
        for t, s, i, e, q, r, c, b in rows
    ]


def assert_rates_equal(a: ModelRates | None, b: ModelRates | None) -> None:
    assert a is not None and b is not None
    for f in fields(ModelRates):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            assert x == pytest.approx(y), f.name
        else:
            assert x == pytest.approx(y), f.name


def test_increase_from_rates_inverts_rates_from_increase() -> None:
    series = busy_series()
    inc = counter_increase(series[0], series[1])
    rates = rates_from_increase(inc, instance_count=2)
    back = increase_from_rates(rates)
    assert back.seconds == inc.seconds
    assert set(back.counters) == set(inc.counters) == set(MODEL_COUNTERS)
    for name in MODEL_COUNTERS:  # request_success, inference_count, queue_duration_us, ...
        assert back.counters[name] == pytest.approx(inc.counters[name]), name
    assert back.failure_by_reason == pytest.approx(inc.failure_by_reason)
    # Busy time comes back per instance: 0.4 s of batch compute on 2 instances.
    assert (back.busy_instance_s, back.busy_window_s) == (pytest.approx(0.2), 1.0)
    assert_rates_equal(rates_from_increase(back, instance_count=None), rates)


def test_merge_of_two_halves_is_the_rate_over_the_whole_window() -> None:
    series = busy_series()
    whole = window_rates(series, instance_count=2)
    halves = [
        window_rates(series[:3], instance_count=2),
        window_rates(series[2:], instance_count=2),
    ]
    assert all(h is not None for h in halves)
    assert_rates_equal(merge_over_time([h for h in halves if h is not None]), whole)
    per_scrape = [
        rates_between(a, b, instance_count=2) for a, b in zip(series, series[1:], strict=False)
    ]
    merged = merge_over_time(per_scrape)
    assert_rates_equal(merged, whole)
    assert merged is not None and merged.resets == 1 and merged.window_s == 10.0


def test_merge_over_time_of_idle_and_unmeasured_parts() -> None:
    idle = ModelRates(
        window_s=5.0, requests_per_s=0.0, inferences_per_s=0.0, executions_per_s=0.0, fail_per_s=0.0
    )
    busy = ModelRates(
        window_s=5.0,
        requests_per_s=10.0,
        inferences_per_s=40.0,
        executions_per_s=5.0,
        fail_per_s=0.0,
        avg_batch_size=8.0,
        queue_us_per_request=100.0,
        request_us_per_request=400.0,
        queue_share=0.25,
        busy_share=0.5,
    )
    merged = merge_over_time([idle, busy])
    assert merged is not None
    assert merged.requests_per_s == 5.0 and merged.window_s == 10.0
    # Per-request figures over the requests: the idle half has none.
    assert (merged.avg_batch_size, merged.queue_us_per_request, merged.queue_share) == (
        8.0,
        100.0,
        0.25,
    )
    # The busy share over the time it was measured only.
    assert merged.busy_share == 0.5
    assert merge_over_time([idle, idle]) == replace(idle, window_s=10.0)
    assert merged.compute_us_per_request is not None and idle.compute_us_per_request is None
    assert merge_over_time([]) is None


def test_merge_over_series_adds_per_second_rates() -> None:
    v1 = ModelRates(
        window_s=10.0,
        requests_per_s=30.0,
        inferences_per_s=30.0,
        executions_per_s=30.0,
        fail_per_s=1.0,
        fail_per_s_by_reason={"REJECTED": 1.0},
        avg_batch_size=1.0,
        queue_us_per_request=100.0,
        compute_input_us_per_request=10.0,
        compute_infer_us_per_request=800.0,
        compute_output_us_per_request=20.0,
        request_us_per_request=1_000.0,
        queue_share=0.1,
        busy_share=0.2,
        resets=1,
    )
    v2 = ModelRates(
        window_s=9.5,
        requests_per_s=10.0,
        inferences_per_s=40.0,
        executions_per_s=5.0,
        fail_per_s=0.5,
        fail_per_s_by_reason={"REJECTED": 0.25, "BACKEND": 0.25},
        avg_batch_size=8.0,
        queue_us_per_request=500.0,
        compute_input_us_per_request=30.0,
        compute_infer_us_per_request=1_400.0,
        compute_output_us_per_request=40.0,
        request_us_per_request=2_000.0,
        queue_share=0.25,
        busy_share=0.6,
    )
    both = merge_over_series([v1, v2])
    assert both is not None
    assert both.window_s == 10.0  # the longest
    assert (both.requests_per_s, both.inferences_per_s, both.executions_per_s) == (
        pytest.approx(40.0),
        pytest.approx(70.0),
        pytest.approx(35.0),
    )
    assert both.fail_per_s == pytest.approx(1.5)
    assert both.fail_per_s_by_reason == pytest.approx({"REJECTED": 1.25, "BACKEND": 0.25})
    # Per request: weighted by requests (30 and 10 per second); batch size by executions.
    assert both.queue_us_per_request == pytest.approx((30 * 100 + 10 * 500) / 40)
    assert both.request_us_per_request == pytest.approx((30 * 1_000 + 10 * 2_000) / 40)
    assert both.avg_batch_size == pytest.approx(70 / 35)
    assert both.compute_us_per_request == pytest.approx((30 * 830 + 10 * 1_470) / 40)
    assert both.queue_share == pytest.approx((30 * 100 + 10 * 500) / (30 * 1_000 + 10 * 2_000))
    assert both.busy_share == pytest.approx(0.4)  # each version has its own instances
    assert both.resets == 1
    assert_rates_equal(merge_over_series([v1]), v1)
    assert merge_over_series([]) is None


def test_peak_rates_are_per_field_maxima() -> None:
    series = busy_series()
    per_scrape = [
        rates_between(a, b, instance_count=1) for a, b in zip(series, series[1:], strict=False)
    ]
    peaks = peak_rates(per_scrape)
    assert peaks is not None
    for f in fields(ModelPeaks):
        values = [getattr(r, f.name) for r in per_scrape if getattr(r, f.name) is not None]
        assert getattr(peaks, f.name) == max(values), f.name
    assert peak_rates([]) is None
    idle = ModelRates(
        window_s=1.0, requests_per_s=0.0, inferences_per_s=0.0, executions_per_s=0.0, fail_per_s=0.0
    )
    assert peak_rates([idle]) == ModelPeaks(requests_per_s=0.0)


def test_bucket_rates_merge_the_stored_rates_of_each_bucket() -> None:
    raw = busy_series()
    stored = [raw[0]] + [
        replace(b, rates=rates_between(a, b, instance_count=1))
        for a, b in zip(raw, raw[1:], strict=False)
    ]
    buckets = bucket_rates(stored, since=0.0, until=10.0, bucket_s=5.5)
    # Bucket 0 holds the scrapes at 1 and 4 (the one at 0 has no rates), bucket 1 those
    # at 6 and 10 (the reset is inside it): each is the rate over its scrapes' windows.
    assert [t for t, _ in buckets] == [4.0, 10.0]
    assert_rates_equal(buckets[0][1], window_rates(raw[:3], instance_count=1))
    assert_rates_equal(buckets[1][1], window_rates(raw[2:], instance_count=1))
    assert bucket_rates(stored, since=0.0, until=5.0, bucket_s=5.5)[0][0] == 4.0
    assert len(bucket_rates(stored, since=0.0, until=5.0, bucket_s=5.5)) == 1
    assert bucket_rates(stored[:1], since=0.0, until=10.0, bucket_s=5.0) == []
    with pytest.raises(ValueError, match="bucket_s"):
        bucket_rates(stored, since=0.0, until=1.0, bucket_s=0.0)


def test_gauges_skip_missing_readings() -> None:
    assert gauge_mean([1.0, None, 3.0]) == 2.0
    assert gauge_max([1.0, None, 3.0]) == 3.0
    assert gauge_mean([None]) is None and gauge_max([]) is None
