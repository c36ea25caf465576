"""What the batcher simulation (:mod:`collector.analysis.batcher_sim`) takes and
returns: the service model, the two kinds of load, the result; and the checks that
turn inputs Triton would refuse, or that make no sense, into ``ValueError``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from collector.records import BatcherConfig

__all__ = ["ClosedLoad", "Load", "OpenLoad", "ServiceModel", "SimResult", "require", "validate"]


@dataclass(frozen=True)
class ServiceModel:
    """How long an instance takes to execute a batch.

    ``mean_ms(b)``: mean execution time of a batch of ``b`` samples (ms, ≥ 0).
    ``cv``: coefficient of variation of single executions; times are drawn from a
    gamma distribution with that CV around the mean (``cv=1`` is exponential,
    ``cv=0`` deterministic).

    ``cpu_fraction`` and ``cores`` model CPU contention between instances: each
    execution spends ``cpu_fraction`` of its time on one CPU core. When ``n``
    instances are executing and ``n × cpu_fraction > cores``, the CPU part of an
    execution is stretched by ``n × cpu_fraction / cores``. Approximation: ``n`` is
    read once, when the execution starts (counting itself), and the stretch is then
    fixed — in steady state at saturation this matches processor sharing; around
    load changes it lags by one execution.

    ``overhead_ms``: time an instance stays occupied after each execution before it
    can take the next batch (the response has already left; it is not in latency).
    """

    mean_ms: Callable[[int], float]
    cv: float = 0.0
    cpu_fraction: float = 0.0
    cores: float | None = None
    overhead_ms: float = 0.0


@dataclass(frozen=True)
class OpenLoad:
    """Requests arriving independently of responses at ``rate_per_s``.

    ``dispersion`` 1 gives Poisson arrivals. Otherwise inter-arrival times are gamma
    with squared CV = ``dispersion`` (a renewal process whose index of dispersion of
    counts tends to ``dispersion`` over long windows): > 1 bursty, < 1 more regular,
    0 evenly spaced. Each request carries ``request_batch`` samples.
    """

    rate_per_s: float
    dispersion: float = 1.0
    request_batch: int = 1


@dataclass(frozen=True)
class ClosedLoad:
    """``clients`` clients, each sending its next request ``think_ms`` after the
    response to its previous one (perf_analyzer's ``--concurrency-range`` with think
    time). All clients send their first request at time 0. A client whose request is
    rejected on arrival (full queue) retries after ``think_ms`` plus the mean
    execution time of one request — a stand-in for the error round trip that keeps a
    zero-think client from spinning; one rejected by a queue timeout retries
    ``think_ms`` after the timeout.

    Real clients do not answer a batch's responses all at once. ``client_ms`` is the
    time each response spends in a station the clients share and serve one at a time
    (an asyncio event loop, a sender thread, a proxy): the responses of one batch leave
    it ``client_ms`` apart, so the next requests arrive staggered rather than together
    — which decides whether a free instance grabs a batch of one. ``think_cv`` spreads
    each think time (gamma, that coefficient of variation around ``think_ms``). Both
    0: every client of a batch sends again at the same instant."""

    clients: int
    think_ms: float = 0.0
    request_batch: int = 1
    client_ms: float = 0.0
    think_cv: float = 0.0


Load = OpenLoad | ClosedLoad


@dataclass(frozen=True)
class SimResult:
    """What one simulation measured after warm-up.

    The measurement window runs from the arrival of the first measured request (the
    first ``warmup_fraction`` of arrivals are warm-up) to the last arrival.
    ``throughput_per_s``: requests completed in the window per second (inferences
    per second = this × ``request_batch``). Latencies (ms) are over measured requests
    that completed, run to completion after the last arrival; NaN when none did.
    ``avg_batch_size`` and ``batch_size_counts`` (executed size in samples →
    executions) cover batches started in the window; ``busy_share`` is execution
    time in the window per instance (overhead not included, as Triton's
    batch_stats do not include it), averaged over instances. ``rejected_per_s``:
    measured requests rejected, per second of window. ``completed``: measured
    requests that completed. ``client_p50_ms``/``client_p95_ms``: closed loads only
    (equal to the server figures for open loads): per request, server latency plus the
    client's time until it sent its next request (station wait, ``client_ms`` and its
    own think time) — what a load generator that times send-to-send measures.
    ``mean_client_ms``: the mean of that client part alone (0 for open loads).
    """

    throughput_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_latency_ms: float
    mean_queue_ms: float
    avg_batch_size: float
    busy_share: float
    rejected_per_s: float
    batch_size_counts: dict[int, int]
    completed: int
    client_p50_ms: float = math.nan
    client_p95_ms: float = math.nan
    mean_client_ms: float = 0.0


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def validate(
    config: BatcherConfig, service: ServiceModel, load: Load, requests: int, warmup_fraction: float
) -> int:
    """Check every input; returns the request size ``k``."""
    k = _check_load(load)
    _check_config(config, k)
    _check_service(service)
    require(
        isinstance(requests, int) and requests >= 2,
        f"requests must be an int >= 2, got {requests!r}",
    )
    require(
        0.0 <= warmup_fraction < 1.0, f"warmup_fraction must be in [0, 1), got {warmup_fraction}"
    )
    return k


def _non_negative(name: str, value: float) -> None:
    require(math.isfinite(value) and value >= 0, f"{name} must be finite and >= 0, got {value}")


def _check_load(load: Load) -> int:
    require(
        isinstance(load, OpenLoad | ClosedLoad),
        f"load must be OpenLoad or ClosedLoad, got {type(load).__name__}",
    )
    k = load.request_batch
    require(isinstance(k, int) and k >= 1, f"request_batch must be an int >= 1, got {k!r}")
    if isinstance(load, OpenLoad):
        require(
            math.isfinite(load.rate_per_s) and load.rate_per_s > 0,
            f"rate_per_s must be finite and > 0, got {load.rate_per_s}",
        )
        _non_negative("dispersion", load.dispersion)
    else:
        require(
            isinstance(load.clients, int) and load.clients >= 1,
            f"clients must be an int >= 1, got {load.clients!r}",
        )
        _non_negative("think_ms", load.think_ms)
        _non_negative("client_ms", load.client_ms)
        _non_negative("think_cv", load.think_cv)
    return k


def _check_config(config: BatcherConfig, k: int) -> None:
    require(config.instance_count >= 1, f"instance_count must be >= 1, got {config.instance_count}")
    require(config.max_batch_size >= 0, f"max_batch_size must be >= 0, got {config.max_batch_size}")
    if config.max_batch_size == 0 and not config.dynamic_batching:
        require(k == 1, f"a model with max_batch_size 0 takes request_batch 1, got {k}")
        return
    require(
        config.max_batch_size >= 1 or not config.dynamic_batching,
        "dynamic batching needs max_batch_size >= 1 (0 means the model does not batch)",
    )
    require(
        k <= config.max_batch_size,
        f"request_batch {k} exceeds max_batch_size {config.max_batch_size}",
    )
    if not config.dynamic_batching:
        return
    # The queue policy and preferred sizes live in dynamic_batching: checked with it.
    for size in config.preferred_batch_sizes:
        require(
            1 <= size <= config.max_batch_size,
            f"preferred batch size {size} is outside 1..max_batch_size ({config.max_batch_size})",
        )
    require(
        config.max_queue_delay_us >= 0,
        f"max_queue_delay_us must be >= 0, got {config.max_queue_delay_us}",
    )
    require(config.max_queue_size >= 0, f"max_queue_size must be >= 0, got {config.max_queue_size}")
    require(
        config.default_timeout_us >= 0,
        f"default_timeout_us must be >= 0, got {config.default_timeout_us}",
    )
    require(
        config.timeout_action in ("REJECT", "DELAY"),
        f"timeout_action must be REJECT or DELAY, got {config.timeout_action!r}",
    )


def _check_service(service: ServiceModel) -> None:
    _non_negative("cv", service.cv)
    require(
        0.0 <= service.cpu_fraction <= 1.0,
        f"cpu_fraction must be in [0, 1], got {service.cpu_fraction}",
    )
    require(
        service.cores is None or (math.isfinite(service.cores) and service.cores > 0),
        f"cores must be > 0 or None, got {service.cores}",
    )
    _non_negative("overhead_ms", service.overhead_ms)
