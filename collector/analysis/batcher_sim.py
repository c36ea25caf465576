"""A discrete-event simulation of Triton's scheduler for one model.

Given a batcher config, a service model (mean execution time per batch size, e.g.
from :mod:`collector.analysis.fit`) and a load, :func:`simulate` predicts throughput,
latency percentiles, batch sizes and instance busy share — so the recommender can
compare candidate configs at the observed load without touching the server.

Scheduler semantics (Triton's dynamic batcher, ``dynamic_batch_scheduler.cc``):

* Requests join one FIFO queue. A request of ``k`` samples (``request_batch``) is
  atomic: it takes ``k`` slots of a batch.
* Dynamic batching **off**: each request executes alone when an instance is free.
* Dynamic batching **on**: when an instance is free, the batcher scans the queue in
  order, up to ``max_batch_size`` samples. The preferred sizes default to
  ``{max_batch_size}`` (as Triton's config normalisation does).

  - If the scan reaches a preferred size, the largest one reached is sent at once.
  - If the queue holds more than the largest preferred size but no preferred size
    can be formed exactly (request sizes that do not add up), the largest batch that
    fits in the largest preferred size is sent at once.
  - Otherwise, once the *oldest* queued request has waited ``max_queue_delay_us``,
    the largest batch ≤ ``max_batch_size`` is sent — then also beyond the largest
    preferred size, as Triton does when the delay is exceeded. With a delay of 0
    whatever is there is sent immediately.
  - Batches form only when an instance is free, so requests that arrive while all
    instances are busy join the next batch (what Triton's growing, not yet running
    payload achieves).

* Queue policy (it lives in ``dynamic_batching`` in Triton, so it applies only with
  batching on): a request arriving while ``max_queue_size`` requests are queued is
  rejected; with ``default_timeout_us`` > 0 a request still queued after the timeout
  is rejected (``REJECT``) or moved behind every request that has not timed out
  (``DELAY``). Rejected requests count in ``rejected_per_s``, not in latency.

All events at one instant are applied before the batcher decides, so a closed-loop
client that resubmits at the moment its response leaves joins the next batch.

Time is in milliseconds throughout. Latency is server-side: queue wait plus
execution (the think time of closed-loop clients is not in it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from collector.records import BatcherConfig

__all__ = [
    "ClosedLoad",
    "Load",
    "OpenLoad",
    "ServiceModel",
    "SimResult",
    "simulate",
]


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


# Event kinds; at one instant the order does not matter (the batcher decides after).
_FREE = 0  # an instance becomes free (payload: instance id)
_RESPOND = 1  # closed load: the clients of a batch send again (payload: batch index)
_RETRY = 2  # closed load: one client sends again (payload: client)
_WAKE = 3  # the batcher re-examines the queue (delay expired, timeout, start)
_EXEC_END = 4  # an execution ends before the instance's overhead (contention only)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _validate(config: BatcherConfig, service: ServiceModel, load: Load, requests: int,
              warmup_fraction: float) -> int:
    """Check every input; returns the request size ``k``."""
    _require(isinstance(load, OpenLoad | ClosedLoad),
             f"load must be OpenLoad or ClosedLoad, got {type(load).__name__}")
    k = load.request_batch
    _require(isinstance(k, int) and k >= 1, f"request_batch must be an int >= 1, got {k!r}")
    if isinstance(load, OpenLoad):
        _require(math.isfinite(load.rate_per_s) and load.rate_per_s > 0,
                 f"rate_per_s must be finite and > 0, got {load.rate_per_s}")
        _require(math.isfinite(load.dispersion) and load.dispersion >= 0,
                 f"dispersion must be finite and >= 0, got {load.dispersion}")
    else:
        _require(isinstance(load.clients, int) and load.clients >= 1,
                 f"clients must be an int >= 1, got {load.clients!r}")
        _require(math.isfinite(load.think_ms) and load.think_ms >= 0,
                 f"think_ms must be finite and >= 0, got {load.think_ms}")
        _require(math.isfinite(load.client_ms) and load.client_ms >= 0,
                 f"client_ms must be finite and >= 0, got {load.client_ms}")
        _require(math.isfinite(load.think_cv) and load.think_cv >= 0,
                 f"think_cv must be finite and >= 0, got {load.think_cv}")
    _require(config.instance_count >= 1,
             f"instance_count must be >= 1, got {config.instance_count}")
    _require(config.max_batch_size >= 0,
             f"max_batch_size must be >= 0, got {config.max_batch_size}")
    if config.dynamic_batching:
        _require(config.max_batch_size >= 1,
                 "dynamic batching needs max_batch_size >= 1 (0 means the model "
                 "does not batch)")
        _require(k <= config.max_batch_size,
                 f"request_batch {k} exceeds max_batch_size {config.max_batch_size}")
        for size in config.preferred_batch_sizes:
            _require(1 <= size <= config.max_batch_size,
                     f"preferred batch size {size} is outside 1..max_batch_size "
                     f"({config.max_batch_size})")
        _require(config.max_queue_delay_us >= 0,
                 f"max_queue_delay_us must be >= 0, got {config.max_queue_delay_us}")
        _require(config.max_queue_size >= 0,
                 f"max_queue_size must be >= 0, got {config.max_queue_size}")
        _require(config.default_timeout_us >= 0,
                 f"default_timeout_us must be >= 0, got {config.default_timeout_us}")
        _require(config.timeout_action in ("REJECT", "DELAY"),
                 f"timeout_action must be REJECT or DELAY, got {config.timeout_action!r}")
    elif config.max_batch_size == 0:
        _require(k == 1, f"a model with max_batch_size 0 takes request_batch 1, got {k}")
    else:
        _require(k <= config.max_batch_size,
                 f"request_batch {k} exceeds max_batch_size {config.max_batch_size}")
    _require(math.isfinite(service.cv) and service.cv >= 0,
             f"cv must be finite and >= 0, got {service.cv}")
    _require(0.0 <= service.cpu_fraction <= 1.0,
             f"cpu_fraction must be in [0, 1], got {service.cpu_fraction}")
    _require(service.cores is None or (math.isfinite(service.cores) and service.cores > 0),
             f"cores must be > 0 or None, got {service.cores}")
    _require(math.isfinite(service.overhead_ms) and service.overhead_ms >= 0,
             f"overhead_ms must be finite and >= 0, got {service.overhead_ms}")
    _require(isinstance(requests, int) and requests >= 2,
             f"requests must be an int >= 2, got {requests!r}")
    _require(0.0 <= warmup_fraction < 1.0,
             f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
    return k


def _service_table(service: ServiceModel, k: int, max_requests: int) -> list[float]:
    """Mean execution time (ms) of a batch of ``m`` requests, for m = 0..max_requests
    (index 0 unused): the callable is evaluated once per size, not per batch."""
    table = [0.0]
    for m in range(1, max_requests + 1):
        value = float(service.mean_ms(m * k))
        _require(math.isfinite(value) and value >= 0,
                 f"mean_ms({m * k}) must be finite and >= 0, got {value}")
        _require(value + service.overhead_ms > 0,
                 f"mean_ms({m * k}) + overhead_ms must be > 0")
        table.append(value)
    return table


def _best_preferred(config: BatcherConfig, k: int, max_requests: int) -> list[int]:
    """``table[n]``: the largest ``j ≤ n`` requests whose ``j × k`` samples are a
    preferred size, or 0 — the scan's last preferred hit with ``n`` requests."""
    preferred = set(config.preferred_batch_sizes) or {config.max_batch_size}
    table = [0] * (max_requests + 1)
    for n in range(1, max_requests + 1):
        table[n] = n if n * k in preferred else table[n - 1]
    return table


def simulate(config: BatcherConfig, service: ServiceModel, load: Load, *,
             requests: int = 20000, seed: int = 0,
             warmup_fraction: float = 0.1) -> SimResult:
    """Simulate ``requests`` arrivals of ``load`` against ``config`` and ``service``.

    Deterministic for a given ``seed``. Raises ``ValueError`` for inputs Triton would
    refuse (a request larger than ``max_batch_size``, batching on a model that does
    not batch) or that make no sense (rate ≤ 0, cv < 0, ...). See the module
    docstring for the scheduler semantics and :class:`SimResult` for the window.
    """
    k = _validate(config, service, load, requests, warmup_fraction)
    batching = config.dynamic_batching
    m_max = max(config.max_batch_size, 1) // k if batching else 1
    svc = _service_table(service, k, m_max)
    rng = np.random.default_rng(seed)
    R = requests
    INF = math.inf
    nan = math.nan

    # --- load
    open_load = isinstance(load, OpenLoad)
    arr: list[float]
    if isinstance(load, OpenLoad):
        mean_gap = 1000.0 / load.rate_per_s
        d = load.dispersion
        if d == 0:
            gaps = np.full(R, mean_gap)
        elif d == 1.0:
            gaps = rng.exponential(mean_gap, R)
        else:
            gaps = rng.gamma(1.0 / d, mean_gap * d, R)
        arr = np.cumsum(gaps).tolist()
        clients, think = 0, 0.0
        client_ms, think_draws = 0.0, None
    else:
        arr = [0.0] * R
        clients, think = load.clients, float(load.think_ms)
        client_ms = float(load.client_ms)
        think_draws = None
        if load.think_cv > 0 and think > 0:
            tshape = 1.0 / (load.think_cv * load.think_cv)
            think_draws = rng.gamma(tshape, think / tshape, R).tolist()
    client_of = [0] * (0 if open_load else R)
    back = [nan] * (0 if open_load else R)  # when each request's client sent again
    staggered = client_ms > 0 or think_draws is not None
    client_free = 0.0  # when the clients' shared station is next free
    reject_retry_ms = think + svc[1]

    # --- service randomness: one unit-mean multiplier per batch (at most R batches)
    cv = service.cv
    mult: list[float] | None = None
    if cv > 0:
        shape = 1.0 / (cv * cv)
        mult = rng.gamma(shape, 1.0 / shape, R).tolist()
    overhead = float(service.overhead_ms)
    f = service.cpu_fraction
    cores = service.cores
    contended = cores is not None and f > 0
    cores_f = float(cores) if cores is not None else 1.0
    free_ends_exec = contended and overhead == 0

    # --- batcher
    delay = config.max_queue_delay_us / 1000.0 if batching else 0.0
    timeout = config.default_timeout_us / 1000.0 if batching else 0.0
    reject_on_timeout = config.timeout_action == "REJECT"
    max_q = config.max_queue_size if batching else 0
    exact = _best_preferred(config, k, m_max) if batching else [0, 1]
    preferred = set(config.preferred_batch_sizes) or {max(config.max_batch_size, 1)}
    max_pref = max(preferred)
    c_pref = max(1, max_pref // k)  # requests that fit in the largest preferred size
    wake_timeouts = timeout > 0 and not open_load  # clients wait on timeout rejections

    # --- state; per-request lists are preallocated (no per-event allocation)
    start = [nan] * R
    end = [nan] * R
    q: list[int] = []  # queued request ids, FIFO; q[qh:] are still queued
    qh = 0
    dq: list[int] = []  # requests that timed out under DELAY, behind everything else
    dqh = 0
    free = list(range(config.instance_count))
    instances = config.instance_count
    executing = 0
    heap: list[tuple[float, int, int]] = []
    push = heapq.heappush
    pop = heapq.heappop
    b_start: list[float] = []
    b_end: list[float] = []
    b_size: list[int] = []
    b_members: list[list[int]] = []
    nb = 0
    na = 0  # open: next arrival index; closed: requests generated so far
    wake_at = -INF
    rejected_measured = 0
    warm = min(int(R * warmup_fraction), R - 1)
    incoming: list[int] = []  # closed: clients sending at this instant
    arriving: list[int] = []

    if not open_load:
        incoming.extend(range(clients))
        push(heap, (0.0, _WAKE, 0))

    while True:
        t = heap[0][0] if heap else INF
        if open_load and na < R and arr[na] < t:
            t = arr[na]
        if t == INF:
            break

        # 1. every event at this instant
        while heap and heap[0][0] <= t:
            _, kind, x = pop(heap)
            if kind == _FREE:
                free.append(x)
                if free_ends_exec:
                    executing -= 1
            elif kind == _RESPOND:
                if staggered:
                    # Each response passes the shared station in turn, then thinks.
                    for rid in b_members[x]:
                        client_free = (client_free if client_free > t else t) + client_ms
                        again = client_free + (think_draws[rid] if think_draws else think)
                        back[rid] = again
                        push(heap, (again, _RETRY, client_of[rid]))
                else:
                    for rid in b_members[x]:
                        back[rid] = t
                        incoming.append(client_of[rid])
            elif kind == _RETRY:
                incoming.append(x)
            elif kind == _EXEC_END:
                executing -= 1
            # _WAKE: nothing to apply; the batcher looks at the queue below

        # 2. arrivals at this instant
        if open_load:
            while na < R and arr[na] <= t:
                arriving.append(na)
                na += 1
        elif incoming:
            for client in incoming:
                if na < R:
                    arr[na] = t
                    client_of[na] = client
                    arriving.append(na)
                    na += 1
            incoming.clear()

        if timeout > 0:
            # Same timeout for everyone and FIFO order: expired requests are a prefix.
            while qh < len(q) and arr[q[qh]] + timeout <= t:
                rid = q[qh]
                qh += 1
                if reject_on_timeout:
                    if rid >= warm:
                        rejected_measured += 1
                    if not open_load:
                        push(heap, (t + think, _RETRY, client_of[rid]))
                else:
                    dq.append(rid)

        if arriving:
            if max_q:
                for rid in arriving:
                    if len(q) - qh + len(dq) - dqh >= max_q:
                        if rid >= warm:
                            rejected_measured += 1
                        if not open_load:
                            push(heap, (t + reject_retry_ms, _RETRY, client_of[rid]))
                    else:
                        q.append(rid)
            else:
                q.extend(arriving)
            arriving.clear()

        # 3. the batcher: form batches while an instance is free
        want_wake = INF
        due = INF
        while free:
            nq = len(q) - qh
            nd = len(dq) - dqh
            n = nq + nd
            if n == 0:
                break
            if batching:
                nn = n if n < m_max else m_max
                best = exact[nn]
                if not best and n > c_pref:
                    best = c_pref
                exceeded = False
                if delay > 0:
                    due = (arr[dq[dqh]] if nd else arr[q[qh]]) + delay
                    exceeded = t >= due
                if best and not exceeded:
                    m = best
                elif n > m_max or nn * k >= max_pref or exceeded or delay == 0:
                    m = nn
                else:
                    want_wake = due
                    break
            else:
                m = 1
            # Members: the main queue first, then requests delayed by a timeout.
            if m <= nq:
                members = q[qh:qh + m]
                qh += m
            else:
                members = q[qh:] + dq[dqh:dqh + m - nq]
                qh = len(q)
                dqh += m - nq
            inst = free.pop()
            s = svc[m]
            if mult is not None:
                s *= mult[nb]
            if contended:
                executing += 1
                demand = executing * f
                if demand > cores_f:
                    s *= (1.0 - f) + f * demand / cores_f
            te = t + s
            for rid in members:
                start[rid] = t
                end[rid] = te
            b_start.append(t)
            b_end.append(te)
            b_size.append(m)
            if overhead > 0:
                push(heap, (te + overhead, _FREE, inst))
                if contended:
                    push(heap, (te, _EXEC_END, inst))
            else:
                push(heap, (te, _FREE, inst))
            if not open_load:
                b_members.append(members)
                push(heap, (te if staggered else te + think, _RESPOND, nb))
            nb += 1

        if wake_timeouts and qh < len(q):
            due_timeout = arr[q[qh]] + timeout
            if due_timeout < want_wake:
                want_wake = due_timeout
        if want_wake < INF and (wake_at <= t or want_wake < wake_at):
            push(heap, (want_wake, _WAKE, 0))
            wake_at = want_wake

    return _summarise(arr[:na] if not open_load else arr, start, end, warm,
                      rejected_measured, b_start, b_end, b_size, k, instances,
                      back=None if open_load else back)


def _summarise(arr: list[float], start: list[float], end: list[float], warm: int,
               rejected_measured: int, b_start: list[float], b_end: list[float],
               b_size: list[int], k: int, instances: int, *,
               back: list[float] | None = None) -> SimResult:
    """Window statistics from the per-request and per-batch records (vectorised)."""
    n = len(arr)
    a = np.asarray(arr, dtype=float)
    st = np.asarray(start[:n], dtype=float)
    en = np.asarray(end[:n], dtype=float)
    t0 = a[warm] if warm < n else a[-1]
    t1 = a[-1]
    if t1 <= t0:  # degenerate (e.g. every request arrived at once): to the last response
        finite = en[~np.isnan(en)]
        t1 = float(finite.max()) if finite.size else t0
    window = t1 - t0
    done = ~np.isnan(en[warm:])
    lat = (en[warm:] - a[warm:])[done]
    wait = (st[warm:] - a[warm:])[done]
    if lat.size:
        p50, p95, p99 = (float(v) for v in np.percentile(lat, [50.0, 95.0, 99.0]))
        mean_lat, mean_wait = float(lat.mean()), float(wait.mean())
    else:
        p50 = p95 = p99 = mean_lat = mean_wait = math.nan
    client_p50, client_p95, client_mean = p50, p95, 0.0
    if back is not None:
        again = np.asarray(back[:n], dtype=float)[warm:]
        sent = ~np.isnan(again)
        if sent.any():
            cycle = again[sent] - a[warm:][sent]
            client_p50, client_p95 = (float(v) for v in np.percentile(cycle, [50.0, 95.0]))
            client_mean = float((again[sent] - en[warm:][sent]).mean())

    bs = np.asarray(b_start, dtype=float)
    be = np.asarray(b_end, dtype=float)
    sizes = np.asarray(b_size, dtype=np.int64) * k
    if window > 0:
        throughput = float(np.count_nonzero((en >= t0) & (en <= t1))) / window * 1000.0
        overlap = np.clip(np.minimum(be, t1) - np.maximum(bs, t0), 0.0, None)
        busy = float(overlap.sum()) / (window * instances)
        rejected = rejected_measured / window * 1000.0
    else:
        throughput = busy = rejected = math.nan
    in_window = (bs >= t0) & (bs <= t1)
    counted = sizes[in_window]
    if counted.size:
        values, counts = np.unique(counted, return_counts=True)
        size_counts = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
        avg_batch = float(counted.mean())
    else:
        size_counts, avg_batch = {}, math.nan
    return SimResult(
        throughput_per_s=throughput, p50_ms=p50, p95_ms=p95, p99_ms=p99,
        mean_latency_ms=mean_lat, mean_queue_ms=mean_wait, avg_batch_size=avg_batch,
        busy_share=busy, rejected_per_s=rejected, batch_size_counts=size_counts,
        completed=int(done.sum()), client_p50_ms=client_p50, client_p95_ms=client_p95,
        mean_client_ms=client_mean)
