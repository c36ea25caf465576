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

import math
from heapq import heappop, heappush

import numpy as np

from collector.analysis.sim_records import (
    ClosedLoad,
    Load,
    OpenLoad,
    ServiceModel,
    SimResult,
    require,
    validate,
)
from collector.records import BatcherConfig

__all__ = [
    "ClosedLoad",
    "Load",
    "OpenLoad",
    "ServiceModel",
    "SimResult",
    "simulate",
]


# Event kinds; at one instant the order does not matter (the batcher decides after).
_FREE = 0  # an instance becomes free (payload: instance id)
_RESPOND = 1  # closed load: the clients of a batch send again (payload: batch index)
_RETRY = 2  # closed load: one client sends again (payload: client)
_WAKE = 3  # the batcher re-examines the queue (delay expired, timeout, start)
_EXEC_END = 4  # an execution ends before the instance's overhead (contention only)

_Event = tuple[float, int, int]  # (time in ms, kind, payload)


def _service_table(service: ServiceModel, k: int, max_requests: int) -> list[float]:
    """Mean execution time (ms) of a batch of ``m`` requests, for m = 0..max_requests
    (index 0 unused): the callable is evaluated once per size, not per batch."""
    table = [0.0]
    for m in range(1, max_requests + 1):
        value = float(service.mean_ms(m * k))
        require(
            math.isfinite(value) and value >= 0,
            f"mean_ms({m * k}) must be finite and >= 0, got {value}",
        )
        require(value + service.overhead_ms > 0, f"mean_ms({m * k}) + overhead_ms must be > 0")
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


def simulate(
    config: BatcherConfig,
    service: ServiceModel,
    load: Load,
    *,
    requests: int = 20000,
    seed: int = 0,
    warmup_fraction: float = 0.1,
) -> SimResult:
    """Simulate ``requests`` arrivals of ``load`` against ``config`` and ``service``.

    Deterministic for a given ``seed``. Raises ``ValueError`` for inputs Triton would
    refuse (a request larger than ``max_batch_size``, batching on a model that does
    not batch) or that make no sense (rate ≤ 0, cv < 0, ...). See the module
    docstring for the scheduler semantics and :class:`SimResult` for the window.
    """
    k = validate(config, service, load, requests, warmup_fraction)
    return _Simulation(config, service, load, k, requests, seed, warmup_fraction).run()


class _BatchRule:
    """Triton's dynamic batcher's decision (see the module docstring): how many of the
    queued requests to send when an instance is free, or to wait for the delay."""

    __slots__ = ("batching", "c_pref", "delay_ms", "exact", "k", "m_max", "max_pref")

    def __init__(self, config: BatcherConfig, k: int) -> None:
        self.k = k
        self.batching = config.dynamic_batching
        self.m_max = max(config.max_batch_size, 1) // k if self.batching else 1
        self.delay_ms = config.max_queue_delay_us / 1000.0 if self.batching else 0.0
        self.exact = _best_preferred(config, k, self.m_max) if self.batching else [0, 1]
        preferred = set(config.preferred_batch_sizes) or {max(config.max_batch_size, 1)}
        self.max_pref = max(preferred)
        self.c_pref = max(1, self.max_pref // k)  # requests that fit in the largest preferred

    def choose(self, queued: int, oldest_arrival_ms: float, t: float) -> tuple[int, float]:
        """(requests to send now, when the oldest request's delay runs out); 0 requests
        means the batcher waits until then. ``oldest_arrival_ms`` is only read when
        there is a delay."""
        if not self.batching:
            return 1, math.inf
        m_max = self.m_max
        nn = queued if queued < m_max else m_max
        best = self.exact[nn]
        if not best and queued > self.c_pref:
            best = self.c_pref
        due = math.inf
        exceeded = False
        if self.delay_ms > 0:
            due = oldest_arrival_ms + self.delay_ms
            exceeded = t >= due
        if best and not exceeded:
            return best, due
        if queued > m_max or nn * self.k >= self.max_pref or exceeded or self.delay_ms == 0:
            return nn, due
        return 0, due


class _Queue:
    """Queued request ids in FIFO order (``main[head:]``), and behind them the
    requests that timed out under ``DELAY`` (``delayed[delayed_head:]``). Heads move
    instead of popping, so no per-event allocation."""

    __slots__ = ("delayed", "delayed_head", "head", "main")

    def __init__(self) -> None:
        self.main: list[int] = []
        self.head = 0
        self.delayed: list[int] = []
        self.delayed_head = 0

    def __len__(self) -> int:
        return len(self.main) - self.head + len(self.delayed) - self.delayed_head

    def oldest(self) -> int:
        """The request whose delay decides: the first delayed one, else the head."""
        if len(self.delayed) > self.delayed_head:
            return self.delayed[self.delayed_head]
        return self.main[self.head]

    def take(self, m: int) -> list[int]:
        """The next ``m`` requests: the main queue first, then the delayed ones."""
        main, head = self.main, self.head
        in_main = len(main) - head
        if m <= in_main:
            self.head = head + m
            return main[head : head + m]
        from_delayed = m - in_main
        members = main[head:] + self.delayed[self.delayed_head : self.delayed_head + from_delayed]
        self.head = len(main)
        self.delayed_head += from_delayed
        return members


class _Executions:
    """How long each batch runs: the mean per size, a unit-mean random multiplier per
    batch, and the stretch of CPU contention (see :class:`ServiceModel`)."""

    __slots__ = (
        "contended",
        "cores",
        "cpu_fraction",
        "executing",
        "free_ends_exec",
        "mean_ms",
        "multipliers",
        "overhead_ms",
    )

    def __init__(
        self, service: ServiceModel, mean_ms: list[float], requests: int, rng: np.random.Generator
    ) -> None:
        self.mean_ms = mean_ms
        # One multiplier per batch: at most one batch per request.
        self.multipliers: list[float] | None = None
        if service.cv > 0:
            shape = 1.0 / (service.cv * service.cv)
            self.multipliers = rng.gamma(shape, 1.0 / shape, requests).tolist()
        self.overhead_ms = float(service.overhead_ms)
        self.cpu_fraction = service.cpu_fraction
        self.contended = service.cores is not None and service.cpu_fraction > 0
        self.cores = float(service.cores) if service.cores is not None else 1.0
        # Without overhead the instance is free when the execution ends: one event.
        self.free_ends_exec = self.contended and self.overhead_ms == 0
        self.executing = 0

    def stretch(self) -> float:
        """An execution starts under contention: the factor on its time (≥ 1)."""
        self.executing += 1
        f = self.cpu_fraction
        demand = self.executing * f
        return (1.0 - f) + f * demand / self.cores if demand > self.cores else 1.0


class _Clients:
    """The clients of a closed load: who sent which request, when each sent again,
    and the shared serial station their responses pass (see :class:`ClosedLoad`)."""

    __slots__ = (
        "back",
        "client_free",
        "client_ms",
        "client_of",
        "count",
        "incoming",
        "reject_retry_ms",
        "staggered",
        "think_draws",
        "think_ms",
    )

    def __init__(
        self, load: ClosedLoad, requests: int, rng: np.random.Generator, one_request_ms: float
    ) -> None:
        self.count = load.clients
        self.think_ms = float(load.think_ms)
        self.client_ms = float(load.client_ms)
        self.think_draws: list[float] | None = None
        if load.think_cv > 0 and self.think_ms > 0:
            shape = 1.0 / (load.think_cv * load.think_cv)
            self.think_draws = rng.gamma(shape, self.think_ms / shape, requests).tolist()
        self.client_of = [0] * requests
        self.back = [math.nan] * requests  # when each request's client sent again
        self.staggered = self.client_ms > 0 or self.think_draws is not None
        self.client_free = 0.0  # when the shared station is next free
        self.reject_retry_ms = self.think_ms + one_request_ms
        self.incoming: list[int] = list(range(self.count))  # clients sending now

    def respond(self, t: float, members: list[int], heap: list[_Event]) -> None:
        """The responses of a batch reach their clients at ``t``."""
        if not self.staggered:
            for rid in members:
                self.back[rid] = t
                self.incoming.append(self.client_of[rid])
            return
        # Each response passes the shared station in turn, then its client thinks.
        draws = self.think_draws
        for rid in members:
            free = self.client_free
            self.client_free = (free if free > t else t) + self.client_ms
            again = self.client_free + (draws[rid] if draws else self.think_ms)
            self.back[rid] = again
            heappush(heap, (again, _RETRY, self.client_of[rid]))


class _Simulation:
    """One run: the event heap, the queue, the instances and what each request and
    batch did. :meth:`run` is the event loop; each step of an instant is a method."""

    __slots__ = (
        "arrival",
        "arrived",
        "batch_end",
        "batch_members",
        "batch_size",
        "batch_start",
        "clients",
        "end",
        "executions",
        "free",
        "heap",
        "instances",
        "k",
        "max_queue_size",
        "queue",
        "reject_on_timeout",
        "rejected_measured",
        "requests",
        "rule",
        "start",
        "timeout_ms",
        "wake_at",
        "wake_timeouts",
        "warm",
    )

    def __init__(
        self,
        config: BatcherConfig,
        service: ServiceModel,
        load: Load,
        k: int,
        requests: int,
        seed: int,
        warmup_fraction: float,
    ) -> None:
        self.k = k
        self.rule = _BatchRule(config, k)
        mean_ms = _service_table(service, k, self.rule.m_max)
        rng = np.random.default_rng(seed)  # draws: load first, then executions
        self.requests = requests
        self.clients: _Clients | None = None
        if isinstance(load, OpenLoad):
            self.arrival = _open_arrivals(load, requests, rng)
        else:
            self.arrival = [0.0] * requests  # a closed load's arrivals happen as it runs
            self.clients = _Clients(load, requests, rng, mean_ms[1])
        self.executions = _Executions(service, mean_ms, requests, rng)
        batching = config.dynamic_batching
        self.timeout_ms = config.default_timeout_us / 1000.0 if batching else 0.0
        self.reject_on_timeout = config.timeout_action == "REJECT"
        self.max_queue_size = config.max_queue_size if batching else 0
        # Clients wait on timeout rejections, so the batcher must wake for them.
        self.wake_timeouts = self.timeout_ms > 0 and self.clients is not None
        self.instances = config.instance_count
        self.free = list(range(config.instance_count))
        self.queue = _Queue()
        self.heap: list[_Event] = []
        self.arrived = 0  # open: next arrival index; closed: requests generated so far
        self.wake_at = -math.inf
        self.warm = min(int(requests * warmup_fraction), requests - 1)
        self.rejected_measured = 0
        self.start = [math.nan] * requests
        self.end = [math.nan] * requests
        self.batch_start: list[float] = []
        self.batch_end: list[float] = []
        self.batch_size: list[int] = []
        self.batch_members: list[list[int]] = []
        if self.clients is not None:
            heappush(self.heap, (0.0, _WAKE, 0))

    def run(self) -> SimResult:
        # The loop turns once per instant, hundreds of thousands of times a run: what
        # it touches is bound to locals once, and steps with nothing to do are skipped.
        heap, free, queue = self.heap, self.free, self.queue
        apply_events, arrivals = self._apply_events, self._arrivals
        form_batches, schedule_wake = self._form_batches, self._schedule_wake
        arrival, requests, inf = self.arrival, self.requests, math.inf
        open_load = self.clients is None
        incoming = self.clients.incoming if self.clients is not None else []
        expires, wake_timeouts = self.timeout_ms > 0, self.wake_timeouts
        while True:
            t = heap[0][0] if heap else inf
            if open_load and self.arrived < requests and arrival[self.arrived] < t:
                t = arrival[self.arrived]
            if t == inf:
                break
            if heap and heap[0][0] <= t:
                apply_events(t)  # 1. every event at this instant
            if (
                incoming
                or (open_load and self.arrived < requests and arrival[self.arrived] <= t)
                or (expires and queue.head < len(queue.main))
            ):
                arrivals(t)  # 2. arrivals, timeouts, admission
            waiting = queue.head < len(queue.main) or queue.delayed_head < len(queue.delayed)
            want = form_batches(t) if free and waiting else inf  # 3. the batcher
            if want < inf or wake_timeouts:
                schedule_wake(want, t)
        return self._summary()

    def _apply_events(self, t: float) -> None:
        heap, executions, clients = self.heap, self.executions, self.clients
        while heap and heap[0][0] <= t:
            _, kind, x = heappop(heap)
            if kind == _FREE:
                self.free.append(x)
                if executions.free_ends_exec:
                    executions.executing -= 1
            elif kind == _RESPOND:
                assert clients is not None
                clients.respond(t, self.batch_members[x], heap)
            elif kind == _RETRY:
                assert clients is not None
                clients.incoming.append(x)
            elif kind == _EXEC_END:
                executions.executing -= 1
            # _WAKE: nothing to apply; the batcher looks at the queue after

    def _arrivals(self, t: float) -> None:
        """This instant's arrivals, then the queue timeouts, then admission: a request
        arriving at a full queue is turned away, after the timeouts made room."""
        first = n = self.arrived  # request ids are given in arrival order
        arrival, clients, requests = self.arrival, self.clients, self.requests
        if clients is None:
            while n < requests and arrival[n] <= t:
                n += 1
        else:
            for client in clients.incoming:
                if n < requests:
                    arrival[n] = t
                    clients.client_of[n] = client
                    n += 1
            clients.incoming.clear()
        self.arrived = n
        if self.timeout_ms > 0:
            self._expire(t)
        limit = self.max_queue_size
        if not limit:
            self.queue.main.extend(range(first, n))
            return
        for rid in range(first, n):
            if len(self.queue) >= limit:
                self._reject(rid, t, clients.reject_retry_ms if clients else 0.0)
            else:
                self.queue.main.append(rid)

    def _expire(self, t: float) -> None:
        """Requests queued past the timeout. Same timeout for everyone and FIFO order:
        the expired ones are a prefix of the main queue."""
        queue, arrival, timeout = self.queue, self.arrival, self.timeout_ms
        while queue.head < len(queue.main) and arrival[queue.main[queue.head]] + timeout <= t:
            rid = queue.main[queue.head]
            queue.head += 1
            if self.reject_on_timeout:
                self._reject(rid, t, self.clients.think_ms if self.clients else 0.0)
            else:
                queue.delayed.append(rid)

    def _reject(self, rid: int, t: float, retry_after_ms: float) -> None:
        if rid >= self.warm:
            self.rejected_measured += 1
        if self.clients is not None:
            heappush(self.heap, (t + retry_after_ms, _RETRY, self.clients.client_of[rid]))

    def _form_batches(self, t: float) -> float:
        """Start batches while an instance is free; returns when the batcher wants to
        look again (the oldest request's delay), or infinity."""
        queue, free, arrival, rule = self.queue, self.free, self.arrival, self.rule
        main, delayed = queue.main, queue.delayed
        delays = rule.delay_ms > 0
        while free:
            queued = len(main) - queue.head + len(delayed) - queue.delayed_head
            if queued == 0:
                break
            if rule.batching:
                m, due = rule.choose(queued, arrival[queue.oldest()] if delays else 0.0, t)
                if m == 0:
                    return due
            else:
                m = 1  # each request executes alone
            self._start_batch(t, queue.take(m), free.pop())
        return math.inf

    def _start_batch(self, t: float, members: list[int], instance: int) -> None:
        """``members`` start executing on ``instance`` at ``t``: when it ends, the
        instance frees (after its overhead) and, for a closed load, the clients hear."""
        sizes = self.batch_size
        number = len(sizes)
        m = len(members)
        executions = self.executions
        s = executions.mean_ms[m]
        if executions.multipliers is not None:
            s *= executions.multipliers[number]
        if executions.contended:
            s *= executions.stretch()
        te = t + s
        start, end = self.start, self.end
        for rid in members:
            start[rid] = t
            end[rid] = te
        self.batch_start.append(t)
        self.batch_end.append(te)
        sizes.append(m)
        heap, overhead = self.heap, executions.overhead_ms
        if overhead > 0:
            heappush(heap, (te + overhead, _FREE, instance))
            if executions.contended:
                heappush(heap, (te, _EXEC_END, instance))
        else:
            heappush(heap, (te, _FREE, instance))
        clients = self.clients
        if clients is not None:
            self.batch_members.append(members)
            heappush(heap, (te if clients.staggered else te + clients.think_ms, _RESPOND, number))

    def _schedule_wake(self, want: float, t: float) -> None:
        """Schedule the batcher's next look: the delay it waits for, or (closed loads
        with a queue timeout) when the head request times out."""
        queue = self.queue
        if self.wake_timeouts and queue.head < len(queue.main):
            due_timeout = self.arrival[queue.main[queue.head]] + self.timeout_ms
            if due_timeout < want:
                want = due_timeout
        if want < math.inf and (self.wake_at <= t or want < self.wake_at):
            heappush(self.heap, (want, _WAKE, 0))
            self.wake_at = want

    def _summary(self) -> SimResult:
        closed = self.clients is not None
        return _summarise(
            self.arrival[: self.arrived] if closed else self.arrival,
            self.start,
            self.end,
            self.warm,
            self.rejected_measured,
            self.batch_start,
            self.batch_end,
            self.batch_size,
            self.k,
            self.instances,
            back=self.clients.back if self.clients else None,
        )


def _open_arrivals(load: OpenLoad, requests: int, rng: np.random.Generator) -> list[float]:
    """Arrival times (ms) of an open load: gamma gaps with squared CV ``dispersion``."""
    mean_gap = 1000.0 / load.rate_per_s
    d = load.dispersion
    if d == 0:
        gaps = np.full(requests, mean_gap)
    elif d == 1.0:
        gaps = rng.exponential(mean_gap, requests)
    else:
        gaps = rng.gamma(1.0 / d, mean_gap * d, requests)
    arrivals: list[float] = np.cumsum(gaps).tolist()
    return arrivals


def _summarise(
    arr: list[float],
    start: list[float],
    end: list[float],
    warm: int,
    rejected_measured: int,
    b_start: list[float],
    b_end: list[float],
    b_size: list[int],
    k: int,
    instances: int,
    *,
    back: list[float] | None = None,
) -> SimResult:
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
        throughput_per_s=throughput,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        mean_latency_ms=mean_lat,
        mean_queue_ms=mean_wait,
        avg_batch_size=avg_batch,
        busy_share=busy,
        rejected_per_s=rejected,
        batch_size_counts=size_counts,
        completed=int(done.sum()),
        client_p50_ms=client_p50,
        client_p95_ms=client_p95,
        mean_client_ms=client_mean,
    )
