"""The scheduler simulation against queueing closed forms and Triton's batcher rules."""

from __future__ import annotations

import time

import pytest

from collector.analysis.batcher_sim import (
    ClosedLoad,
    OpenLoad,
    ServiceModel,
    SimResult,
    simulate,
)
from collector.analysis.fit import fit_service_time
from collector.records import BatcherConfig, BatchStat, Duration


def const(ms: float) -> ServiceModel:
    return ServiceModel(mean_ms=lambda b: ms)


def linear(intercept: float = 2.0, slope: float = 0.5, **kw: float) -> ServiceModel:
    return ServiceModel(mean_ms=lambda b: intercept + slope * b, **kw)


OFF = BatcherConfig(max_batch_size=8)


def batching(max_batch_size: int = 16, **kw: object) -> BatcherConfig:
    return BatcherConfig(max_batch_size=max_batch_size, dynamic_batching=True, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- closed forms


def test_md1_mean_wait() -> None:
    # M/D/1: W = ρ / (2μ(1 − ρ)). S = 1 ms, ρ = 0.6 -> 0.75 ms. Over 20 seeds the
    # estimate at 100k requests is unbiased with a spread of about 1.5 %.
    r = simulate(OFF, const(1.0), OpenLoad(600.0), requests=100_000, seed=3)
    assert r.mean_queue_ms == pytest.approx(0.6 / (2 * 1.0 * 0.4), rel=0.05)
    assert r.mean_latency_ms == pytest.approx(r.mean_queue_ms + 1.0)
    assert r.throughput_per_s == pytest.approx(600.0, rel=0.02)
    assert r.busy_share == pytest.approx(0.6, rel=0.02)
    assert r.batch_size_counts.keys() == {1}
    assert r.rejected_per_s == 0.0


def test_mm1_mean_latency() -> None:
    # M/M/1: T = 1 / (μ − λ). μ = 1/ms, λ = 0.5/ms -> 2 ms.
    r = simulate(
        OFF, ServiceModel(lambda b: 1.0, cv=1.0), OpenLoad(500.0), requests=100_000, seed=4
    )
    assert r.mean_latency_ms == pytest.approx(2.0, rel=0.04)
    # The sojourn time of M/M/1 is exponential with mean 2 ms: p50 = 2 ln 2.
    assert r.p50_ms == pytest.approx(2.0 * 0.6931, rel=0.05)


@pytest.mark.parametrize("clients", [1, 2, 3, 4, 6])
def test_closed_loop_one_instance(clients: int) -> None:
    s, z = 10.0, 20.0
    r = simulate(OFF, const(s), ClosedLoad(clients, think_ms=z), requests=6000)
    expected = min(clients / (s + z), 1.0 / s) * 1000.0
    assert r.throughput_per_s == pytest.approx(expected, rel=0.005)


@pytest.mark.parametrize(("clients", "instances"), [(3, 2), (6, 2), (9, 3), (12, 3), (8, 4)])
def test_closed_loop_several_instances(clients: int, instances: int) -> None:
    s, z = 10.0, 20.0
    config = BatcherConfig(max_batch_size=8, instance_count=instances)
    r = simulate(config, const(s), ClosedLoad(clients, think_ms=z), requests=6000)
    expected = min(clients / (s + z), instances / s) * 1000.0
    assert r.throughput_per_s == pytest.approx(expected, rel=0.005)


def test_batching_at_saturation_takes_every_waiting_request() -> None:
    # Closed loop, Z = 0, N clients, one instance, delay 0, max batch >= N: every
    # batch holds all N requests, so throughput is N / t(N).
    n = 8
    r = simulate(batching(16), linear(), ClosedLoad(n), requests=8000)
    t_n = 2.0 + 0.5 * n
    assert r.batch_size_counts.keys() == {n}
    assert r.avg_batch_size == n
    assert r.throughput_per_s == pytest.approx(n / t_n * 1000.0, rel=0.002)
    assert r.p50_ms == pytest.approx(t_n)
    assert r.busy_share == pytest.approx(1.0, abs=1e-3)


def test_batching_caps_at_max_batch_size_and_counts_samples() -> None:
    # 8 clients of 2 samples each, max batch 8: batches of 4 requests (8 samples).
    r = simulate(batching(8), linear(), ClosedLoad(8, request_batch=2), requests=8000)
    assert r.batch_size_counts.keys() == {8}
    assert r.throughput_per_s == pytest.approx(4 / (2.0 + 0.5 * 8) * 1000.0, rel=0.002)


def test_batching_off_executes_each_request_alone() -> None:
    r = simulate(OFF, linear(), ClosedLoad(8, request_batch=2), requests=4000)
    assert r.batch_size_counts.keys() == {2}
    assert r.throughput_per_s == pytest.approx(1 / (2.0 + 0.5 * 2) * 1000.0, rel=0.002)


def test_delay_longer_than_needed_raises_p50_by_about_the_delay() -> None:
    # 20 requests/s against a 2.5 ms execution: a request is almost always alone, so
    # with a 5 ms delay it waits the whole delay.
    load = OpenLoad(20.0)
    base = simulate(batching(8), linear(), load, requests=4000)
    delayed = simulate(batching(8, max_queue_delay_us=5000), linear(), load, requests=4000)
    assert base.p50_ms == pytest.approx(2.5, abs=0.01)
    assert delayed.p50_ms - base.p50_ms == pytest.approx(5.0, abs=0.3)
    assert delayed.avg_batch_size > base.avg_batch_size


def test_delay_lets_batches_grow_under_moderate_load() -> None:
    # Two instances at 600/s are mostly idle with no delay (batches of ~1.2); a 4 ms
    # delay gathers ~3.4 per batch and halves the busy share.
    load = OpenLoad(600.0)
    svc = linear(cv=0.1)
    base = simulate(batching(16, instance_count=2), svc, load)
    delayed = simulate(batching(16, instance_count=2, max_queue_delay_us=4000), svc, load)
    assert base.avg_batch_size < 1.5
    assert delayed.avg_batch_size > base.avg_batch_size + 1.5
    assert delayed.busy_share < 0.6 * base.busy_share


def test_preferred_sizes_are_hit_at_saturation() -> None:
    # The queue always holds more than 8: the largest preferred size goes every time,
    # below max_batch_size.
    config = batching(16, preferred_batch_sizes=(4, 8))
    r = simulate(config, linear(), ClosedLoad(32), requests=8000)
    assert r.batch_size_counts.keys() == {8}
    r = simulate(config, linear(), OpenLoad(3000.0), requests=8000)
    assert r.batch_size_counts.keys() == {8}
    # Request sizes that cannot add up to a preferred size: the largest batch that
    # fits in the largest preferred size (3 requests of 2 = 6 <= 7).
    odd = batching(16, preferred_batch_sizes=(7,))
    r = simulate(odd, linear(), ClosedLoad(32, request_batch=2), requests=8000)
    assert r.batch_size_counts.keys() == {6}


def test_exceeded_delay_sends_beyond_the_preferred_size() -> None:
    # Triton's GetDynamicBatch honours a preferred size only while the oldest request
    # is within the delay; past it the whole pending batch (up to max_batch_size)
    # goes. At saturation requests wait longer than 100 µs, so batches are 16.
    config = batching(16, preferred_batch_sizes=(4, 8), max_queue_delay_us=100)
    r = simulate(config, linear(), ClosedLoad(32), requests=8000)
    assert r.batch_size_counts.keys() >= {16}
    assert r.batch_size_counts[16] > 0.99 * sum(r.batch_size_counts.values())


def test_preferred_size_formed_before_the_delay_is_sent_at_once() -> None:
    # Six clients, preferred 4, max 8, a long delay: 4 go at once (preferred), the
    # remaining 2 wait for the delay and then go together with whatever is there.
    config = batching(8, preferred_batch_sizes=(4,), max_queue_delay_us=50_000)
    r = simulate(config, const(1.0), ClosedLoad(6), requests=6000)
    assert 4 in r.batch_size_counts
    assert r.p50_ms < 2.0  # the preferred batches never wait for the delay


def test_queue_timeout_rejects() -> None:
    # Capacity at batch 4 is 4 / 4 ms = 1000/s; 2000/s are offered.
    svc = linear()
    overload = OpenLoad(2000.0)
    unbounded = simulate(batching(4), svc, overload, requests=10_000)
    timed = simulate(batching(4, default_timeout_us=20_000), svc, overload, requests=10_000)
    assert unbounded.rejected_per_s == 0.0
    assert unbounded.p99_ms > 500.0  # the queue grows for the whole run
    assert timed.rejected_per_s == pytest.approx(1000.0, rel=0.05)
    assert timed.throughput_per_s == pytest.approx(1000.0, rel=0.03)
    assert timed.p99_ms <= 20.0 + 4.0 + 1e-9  # the timeout plus one execution
    assert timed.completed < 9000  # the rest were rejected


def test_queue_timeout_delay_keeps_requests() -> None:
    config = batching(4, default_timeout_us=20_000, timeout_action="DELAY")
    r = simulate(config, linear(), OpenLoad(2000.0), requests=10_000)
    assert r.rejected_per_s == 0.0
    assert r.completed == 9000
    assert r.p99_ms > 500.0


def test_max_queue_size_rejects() -> None:
    config = batching(4, max_queue_size=8)
    r = simulate(config, linear(), OpenLoad(2000.0), requests=10_000)
    assert r.rejected_per_s == pytest.approx(1000.0, rel=0.05)
    assert r.throughput_per_s == pytest.approx(1000.0, rel=0.03)
    # At most 8 queued ahead -> at most 2 batches of wait, plus the one running.
    assert r.p99_ms <= 3 * 4.0 + 4.0 + 1e-9


def test_closed_clients_retry_after_rejection() -> None:
    full = simulate(batching(2, max_queue_size=2), const(4.0), ClosedLoad(10), requests=4000)
    assert full.rejected_per_s > 0
    assert full.throughput_per_s == pytest.approx(2 / 4.0 * 1000.0, rel=0.02)
    timed = simulate(
        batching(1, default_timeout_us=30_000), const(10.0), ClosedLoad(10), requests=4000
    )
    assert timed.rejected_per_s > 0
    assert timed.p99_ms <= 40.0 + 1e-9
    assert timed.throughput_per_s == pytest.approx(100.0, rel=0.02)


def test_more_instances_raise_capacity() -> None:
    load = ClosedLoad(16)
    by_count = [
        simulate(
            BatcherConfig(max_batch_size=8, instance_count=c), const(10.0), load, requests=4000
        ).throughput_per_s
        for c in (1, 2, 4)
    ]
    assert by_count == pytest.approx([100.0, 200.0, 400.0], rel=0.01)
    batched = [
        simulate(
            batching(8, instance_count=c), linear(), OpenLoad(5000.0), requests=10_000
        ).throughput_per_s
        for c in (1, 2)
    ]
    assert batched[1] > 1.5 * batched[0]


def test_cpu_contention_stretches_service() -> None:
    config = BatcherConfig(max_batch_size=8, instance_count=4)
    load = ClosedLoad(4)
    free = simulate(config, const(10.0), load, requests=4000)
    assert free.throughput_per_s == pytest.approx(400.0, rel=0.01)
    # Four CPU-bound executions on two cores: each takes twice as long.
    tight = simulate(
        config, ServiceModel(lambda b: 10.0, cpu_fraction=1.0, cores=2.0), load, requests=4000
    )
    assert tight.throughput_per_s == pytest.approx(200.0, rel=0.01)
    # Half CPU on one core: demand 2 -> the CPU half doubles -> 1.5 × 10 ms.
    half = simulate(
        config, ServiceModel(lambda b: 10.0, cpu_fraction=0.5, cores=1.0), load, requests=4000
    )
    assert half.throughput_per_s == pytest.approx(400.0 / 1.5, rel=0.01)
    # Demand within the cores: no stretch.
    fits = simulate(
        config, ServiceModel(lambda b: 10.0, cpu_fraction=0.5, cores=2.0), load, requests=4000
    )
    assert fits.throughput_per_s == pytest.approx(400.0, rel=0.01)


def test_overhead_occupies_the_instance_but_not_the_latency() -> None:
    # One client, 10 ms execution, 5 ms overhead: the next request waits 5 ms.
    r = simulate(OFF, ServiceModel(lambda b: 10.0, overhead_ms=5.0), ClosedLoad(1), requests=2000)
    assert r.throughput_per_s == pytest.approx(1000.0 / 15.0, rel=0.005)
    assert r.mean_queue_ms == pytest.approx(5.0)
    assert r.busy_share == pytest.approx(10.0 / 15.0, rel=0.01)


def test_bursty_arrivals_wait_longer() -> None:
    svc = const(1.0)
    poisson = simulate(OFF, svc, OpenLoad(500.0), requests=40_000)
    bursty = simulate(OFF, svc, OpenLoad(500.0, dispersion=4.0), requests=40_000)
    even = simulate(OFF, svc, OpenLoad(500.0, dispersion=0.0), requests=40_000)
    assert even.mean_queue_ms == 0.0
    assert bursty.mean_queue_ms > 2.5 * poisson.mean_queue_ms


def test_runs_on_a_fitted_service_model() -> None:
    # batch_stats of a model observed with batching off and on -> fit -> simulate.
    stats = [
        BatchStat(batch_size=b, compute_infer=Duration(n, round(n * (2.0 + 0.5 * b) * 1e6)))
        for b, n in ((1, 900), (4, 300), (8, 120))
    ]
    fit = fit_service_time(stats)
    assert fit is not None
    service = ServiceModel(mean_ms=fit.mean_ms, cv=fit.residual_cv)
    r = simulate(batching(16), service, ClosedLoad(8), requests=8000)
    assert r.avg_batch_size == pytest.approx(8.0, abs=0.3)
    assert r.throughput_per_s == pytest.approx(8 / 6.0 * 1000.0, rel=0.03)


# --------------------------------------------------------------------------- contract


def test_deterministic_for_a_seed() -> None:
    svc = linear(cv=0.3)
    config = batching(16, max_queue_delay_us=1000, instance_count=2)
    a = simulate(config, svc, OpenLoad(2000.0), requests=5000, seed=7)
    b = simulate(config, svc, OpenLoad(2000.0), requests=5000, seed=7)
    c = simulate(config, svc, OpenLoad(2000.0), requests=5000, seed=8)
    assert a == b
    assert a != c


def test_result_fields_are_consistent() -> None:
    r = simulate(
        batching(16, max_queue_delay_us=1000), linear(cv=0.2), OpenLoad(1000.0), requests=5000
    )
    assert isinstance(r, SimResult)
    assert r.completed == 4500
    assert r.p50_ms <= r.p95_ms <= r.p99_ms
    assert r.mean_queue_ms < r.mean_latency_ms
    assert 0.0 < r.busy_share < 1.0
    assert sum(r.batch_size_counts.values()) > 0
    assert all(1 <= size <= 16 for size in r.batch_size_counts)
    total = sum(s * n for s, n in r.batch_size_counts.items())
    assert r.avg_batch_size == pytest.approx(total / sum(r.batch_size_counts.values()))


def test_fast_enough_for_the_recommender() -> None:
    # The recommender runs ~100 candidates per model. Measured on the 2-core dev box
    # (best of 7, six configs: batching off/on, open/closed, timeouts, contention):
    # 20 000 requests take 15-40 ms, up to ~110 ms while the box was busy.
    config = batching(16, max_queue_delay_us=2000, instance_count=2)
    svc = linear(cv=0.2)
    simulate(config, svc, OpenLoad(2000.0))  # warm caches and imports
    t0 = time.perf_counter()
    simulate(config, svc, OpenLoad(2000.0))
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5  # generous for a loaded CI runner; the target is < 0.2 s


@pytest.mark.parametrize(
    ("config", "service", "load", "match"),
    [
        (batching(4), const(1.0), OpenLoad(100.0, request_batch=8), "exceeds max_batch_size"),
        (
            BatcherConfig(max_batch_size=0, dynamic_batching=True),
            const(1.0),
            OpenLoad(100.0),
            "max_batch_size >= 1",
        ),
        (
            BatcherConfig(max_batch_size=0),
            const(1.0),
            OpenLoad(100.0, request_batch=2),
            "request_batch 1",
        ),
        (OFF, const(1.0), OpenLoad(0.0), "rate_per_s"),
        (OFF, const(1.0), OpenLoad(-5.0), "rate_per_s"),
        (OFF, const(1.0), OpenLoad(100.0, dispersion=-1.0), "dispersion"),
        (OFF, const(1.0), ClosedLoad(0), "clients"),
        (OFF, const(1.0), ClosedLoad(2, think_ms=-1.0), "think_ms"),
        (batching(8, preferred_batch_sizes=(16,)), const(1.0), OpenLoad(100.0), "preferred"),
        (batching(8, timeout_action="DROP"), const(1.0), OpenLoad(100.0), "timeout_action"),
        (
            BatcherConfig(max_batch_size=8, instance_count=0),
            const(1.0),
            OpenLoad(100.0),
            "instance_count",
        ),
        (OFF, ServiceModel(lambda b: 1.0, cv=-0.1), OpenLoad(100.0), "cv"),
        (OFF, ServiceModel(lambda b: 1.0, cpu_fraction=2.0), OpenLoad(100.0), "cpu_fraction"),
        (OFF, ServiceModel(lambda b: 1.0, cores=0.0), OpenLoad(100.0), "cores"),
        (OFF, ServiceModel(lambda b: -1.0), OpenLoad(100.0), "mean_ms"),
        (OFF, ServiceModel(lambda b: 0.0), OpenLoad(100.0), "overhead_ms"),
    ],
)
def test_invalid_inputs_raise(
    config: BatcherConfig, service: ServiceModel, load: OpenLoad | ClosedLoad, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        simulate(config, service, load, requests=100)


def test_invalid_run_parameters_raise() -> None:
    with pytest.raises(ValueError, match="requests"):
        simulate(OFF, const(1.0), OpenLoad(100.0), requests=1)
    with pytest.raises(ValueError, match="warmup_fraction"):
        simulate(OFF, const(1.0), OpenLoad(100.0), warmup_fraction=1.0)


# --------------------------------------------------------------------------- client station


def test_one_client_cycle_is_the_sum_of_its_parts() -> None:
    # One client, deterministic: each cycle is service + station + delay, no waiting.
    load = ClosedLoad(1, think_ms=1.5, client_ms=0.5)
    r = simulate(OFF, const(3.0), load, requests=2000)
    assert r.throughput_per_s == pytest.approx(1000.0 / 5.0, rel=0.01)
    assert r.p95_ms == pytest.approx(3.0)
    assert r.client_p95_ms == pytest.approx(5.0)
    assert r.client_p50_ms == pytest.approx(5.0)


def test_shared_station_bounds_throughput() -> None:
    # The server is nearly free; the clients' station serves one response per 0.5 ms.
    load = ClosedLoad(32, client_ms=0.5)
    r = simulate(batching(32), const(0.01), load, requests=20000)
    assert r.throughput_per_s == pytest.approx(2000.0, rel=0.02)


def test_staggered_returns_split_batches_without_a_delay() -> None:
    # 8 clients, 2 instances, 8 ms per execution: when all responses return together
    # the batches stay whole; when they trickle back 0.5 ms apart, a free instance
    # takes the first one alone, and a 4 ms delay gathers them again.
    svc = linear(8.0, 0.3)
    together = simulate(
        batching(32, instance_count=2), svc, ClosedLoad(8, think_ms=1.0), requests=8000
    )
    trickle = simulate(
        batching(32, instance_count=2),
        svc,
        ClosedLoad(8, think_ms=0.5, client_ms=0.5),
        requests=8000,
    )
    waited = simulate(
        batching(32, instance_count=2, max_queue_delay_us=4000),
        svc,
        ClosedLoad(8, think_ms=0.5, client_ms=0.5),
        requests=8000,
    )
    assert trickle.avg_batch_size < together.avg_batch_size * 0.7
    assert waited.avg_batch_size > trickle.avg_batch_size * 1.3
    # Batches of one hold an instance for 8 ms each: waiting for the group is faster.
    assert waited.client_p95_ms < trickle.client_p95_ms
    assert waited.throughput_per_s >= trickle.throughput_per_s


def test_think_spread_widens_the_client_side_tail() -> None:
    steady = simulate(OFF, const(2.0), ClosedLoad(1, think_ms=4.0), requests=4000)
    spread = simulate(OFF, const(2.0), ClosedLoad(1, think_ms=4.0, think_cv=0.5), requests=4000)
    assert steady.client_p95_ms == pytest.approx(6.0)
    assert spread.client_p95_ms > 7.0
    # The mean cycle is unchanged by the spread.
    assert spread.throughput_per_s == pytest.approx(steady.throughput_per_s, rel=0.03)


def test_with_straggling_clients_a_longer_delay_fills_batches() -> None:
    """8 clients, two instances, preferred batch 4 of a fixed-cost model: clockwork
    clients fill the batch within 1 ms, so 1 ms and 5 ms delays tie; once each
    client's own time varies, the 1 ms delay often runs out first."""
    service = linear(intercept=8.0, slope=0.3)

    def run(delay_us: int, cv: float):  # type: ignore[no-untyped-def]
        config = batching(
            max_batch_size=32,
            preferred_batch_sizes=(4,),
            max_queue_delay_us=delay_us,
            instance_count=2,
        )
        return simulate(
            config, service, ClosedLoad(8, think_ms=2.0, think_cv=cv), requests=8000, seed=3
        )

    assert run(1000, 0.0).throughput_per_s == pytest.approx(
        run(5000, 0.0).throughput_per_s, rel=0.01
    )
    short, long = run(1000, 0.3), run(5000, 0.3)
    assert long.avg_batch_size > short.avg_batch_size * 1.05
    assert long.throughput_per_s > short.throughput_per_s * 1.03


@pytest.mark.parametrize("field_name,value", [("client_ms", -1.0), ("think_cv", float("nan"))])
def test_client_station_inputs_are_validated(field_name: str, value: float) -> None:
    with pytest.raises(ValueError, match=field_name):
        simulate(OFF, const(1.0), ClosedLoad(2, **{field_name: value}))  # type: ignore[arg-type]
