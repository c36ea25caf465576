"""Rates from cumulative counters, across counter resets."""

from __future__ import annotations

import pytest

from collector.analysis.rates import batch_stats_increase, is_reset, rates_between, window_rates
from collector.records import BatchStat, Duration, ModelMetrics, ModelSample, ModelStats


def sample(t: float, *, success: float, inferences: float, execs: float, queue_us: float,
           request_us: float, infer_us: float = 0.0, failures: dict[str, float] | None = None,
           batches: dict[int, tuple[int, int]] | None = None) -> ModelSample:
    stats = None
    if batches is not None:
        stats = ModelStats(
            model="m", version="1", inference_count=int(inferences), execution_count=int(execs),
            batch_stats=tuple(BatchStat(batch_size=size, compute_infer=Duration(count, ns))
                              for size, (count, ns) in batches.items()))
    return ModelSample(
        target="t", collected_at=t,
        metrics=ModelMetrics(model="m", version="1", request_success=success,
                             inference_count=inferences, exec_count=execs,
                             queue_duration_us=queue_us, request_duration_us=request_us,
                             compute_infer_duration_us=infer_us,
                             request_failure_by_reason=failures or {}),
        stats=stats)


def test_rates_between_two_samples() -> None:
    a = sample(100.0, success=1000, inferences=1000, execs=250, queue_us=5000, request_us=20000)
    b = sample(110.0, success=3000, inferences=3000, execs=500, queue_us=45000,
               request_us=100000, infer_us=30000, failures={"REJECTED": 20})
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
    before = sample(0.0, success=90_000, inferences=90_000, execs=90_000, queue_us=9e6,
                    request_us=9e7)
    # Triton restarted between the samples: 500 requests since the restart.
    after = sample(5.0, success=500, inferences=500, execs=500, queue_us=5e4, request_us=5e5)
    assert is_reset(before, after)
    r = rates_between(before, after)
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
    a = sample(0.0, success=0, inferences=0, execs=0, queue_us=0, request_us=0,
               batches={1: (10, 10_000_000)})
    # 2 s later: 100 more batch-8 executions of 10 ms each = 1 s of compute on 2 instances.
    b = sample(2.0, success=800, inferences=800, execs=100, queue_us=0, request_us=1,
               batches={1: (10, 10_000_000), 8: (100, 1_000_000_000)})
    r = rates_between(a, b, instance_count=2)
    assert r.busy_share == pytest.approx(0.25)
    assert rates_between(a, b).busy_share is None  # instance count unknown


def test_batch_stats_increase_per_size_and_on_reset() -> None:
    prev = (BatchStat(1, compute_infer=Duration(5, 500)),
            BatchStat(4, compute_infer=Duration(2, 800)))
    cur = (BatchStat(1, compute_infer=Duration(7, 700)),
           BatchStat(4, compute_infer=Duration(2, 800)),
           BatchStat(8, compute_infer=Duration(3, 3000)))
    inc = batch_stats_increase(prev, cur)
    assert [(b.batch_size, b.exec_count, b.compute_infer.ns) for b in inc] == [(1, 2, 200),
                                                                             (8, 3, 3000)]
    after_reset = batch_stats_increase(prev, (BatchStat(1, compute_infer=Duration(1, 100)),),
                                       reset=True)
    assert [(b.batch_size, b.exec_count) for b in after_reset] == [(1, 1)]


def test_idle_window_has_zero_rates_and_no_ratios() -> None:
    a = sample(0.0, success=10, inferences=10, execs=10, queue_us=10, request_us=10)
    b = sample(5.0, success=10, inferences=10, execs=10, queue_us=10, request_us=10)
    r = rates_between(a, b)
    assert r.requests_per_s == 0.0
    assert r.avg_batch_size is None and r.queue_share is None and r.queue_us_per_request is None


def test_model_reload_resets_only_the_statistics_counters() -> None:
    # A reload restarts the statistics API's counters; the metrics endpoint keeps counting.
    a = sample(0.0, success=10_000, inferences=10_000, execs=10_000, queue_us=1e6, request_us=1e7,
               batches={1: (10_000, 50_000_000_000)})
    b = sample(1.0, success=10_100, inferences=10_100, execs=10_050, queue_us=1.01e6,
               request_us=1.01e7, batches={2: (50, 500_000_000)})
    b = ModelSample(target=b.target, collected_at=b.collected_at, metrics=b.metrics,
                    stats=ModelStats(model="m", version="1", inference_count=100,
                                     execution_count=50, batch_stats=b.stats.batch_stats))
    r = rates_between(a, b, instance_count=1)
    assert r.requests_per_s == 100.0  # not 10 100: the metrics counters did not reset
    assert r.avg_batch_size == 2.0
    assert r.busy_share == pytest.approx(0.5)  # batch_stats since the reload only
    assert r.resets == 1
