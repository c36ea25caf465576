"""The recommender's knobs (``RecommendSettings``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecommendSettings:
    """Knobs of the search. Defaults are meant to be left alone."""

    # The load the prediction is for: a minute, so that a load that moves in phases
    # (the demo's repeats every 50 s) gives the same window on calls seconds apart, and
    # the advice does not follow whichever phase the last half-minute caught.
    window_s: float = 60.0
    lookback_s: float = 900.0  # batch_stats and population are taken over this much history
    settle_s: float = 5.0  # ignore this long after a config change
    delays_us: tuple[int, ...] = (0, 100, 250, 500, 1000, 2000, 5000, 10000)
    max_instances: int = 4
    latency_margin: float = 1.10  # without an SLO: p95 may rise at most 10 %
    # A change must beat the standing config by this much at least, whatever the
    # measured uncertainty (``choice``): the floor of the model's own error on a gain,
    # which neither its runs nor the fit show (the load model's structure; on the CPU
    # bench, paired predicted gains between configs miss by a few percent).
    min_gain: float = 0.05
    instance_gain: float = 0.10  # each extra instance must add this much throughput
    # The search, coarse to fine (see ``search``): every (preferred sizes, delay in
    # ``coarse_delays_us``) at the current instance count is screened on one variant
    # with ``screen_requests``; the delays next to the best ``refine`` ones and the
    # neighbouring instance counts of the best ``refine`` follow; ``finalists`` (with
    # the running and the standing config) get paired runs on every variant and seed.
    coarse_delays_us: tuple[int, ...] = (0, 500, 2000, 10000)
    refine: int = 4
    screen_requests: int = 1500  # requests per simulation while screening candidates
    final_requests: int = 3000  # requests per simulation for the finalists
    finalists: int = 5
    seed: int = 1
    final_seeds: tuple[int, ...] = (1,)
    # Earlier windows (ending this many window lengths before now) the batcher model
    # is also calibrated on: how far the predicted gain moves between them is part of
    # its uncertainty (``choice``), so advice does not follow a window's noise.
    window_offsets: tuple[float, ...] = (0.5, 1.0)
    calibration_steps: int = 8  # secant steps at most, per calibration
    calibration_tolerance: float = 0.005  # |log(simulated / observed mean)| accepted
    # A stored recommendation for the running config is reused as it stands (no
    # simulation) while every input it was computed from is within this relative
    # distance of today's (see ``job.reuse_inputs``).
    reuse_tolerance: float = 0.05
    # Responses of one batch reach their clients together, but clients rarely answer
    # them at once: they share an event loop, a sender thread or a proxy that handles
    # one request at a time, so the next requests come back staggered — which decides
    # whether a free instance takes a batch of one. While one instance is saturated
    # the server cannot see that stagger, so a share of the least client time per
    # request is taken as spent in such a shared, serial station (the rest is delay).
    # Closed loops lock into different batching patterns as that share moves, so every
    # prediction is the mean over these shares: a config that only shines for one
    # exact stagger is not trusted.
    client_serial_shares: tuple[float, ...] = (0.1, 0.2, 0.4)
    # batch_stats hold sums, so the spread of single executions is unseen; the fit's
    # own floor (5 %) is for its standard errors. Simulated executions vary at least
    # this much: scheduling, the GIL, clocks and co-tenants move real ones by 10-20 %,
    # and the p95 a client sees is made of that spread.
    service_cv_floor: float = 0.15
    # Spread of each client's own time between a response and its next request
    # (coefficient of variation): real clients are not clocks, so a batch waiting for
    # its preferred size may see the delay run out first.
    client_think_cv: float = 0.3


DEFAULT_SETTINGS = RecommendSettings()
