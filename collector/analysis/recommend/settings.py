"""The recommender's knobs (``RecommendSettings``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecommendSettings:
    """Knobs of the search. Defaults are meant to be left alone."""

    window_s: float = 30.0  # the load the prediction is for
    lookback_s: float = 900.0  # batch_stats and population are taken over this much history
    settle_s: float = 5.0  # ignore this long after a config change
    delays_us: tuple[int, ...] = (0, 100, 250, 500, 1000, 2000, 5000, 10000)
    max_instances: int = 4
    latency_margin: float = 1.10  # without an SLO: p95 may rise at most 10 %
    min_gain: float = 0.03  # a change must beat the current config by this much
    instance_gain: float = 0.10  # each extra instance must add this much throughput
    screen_requests: int = 4000  # requests per simulation while screening candidates
    final_requests: int = 20000  # requests per simulation for the finalists
    finalists: int = 8
    seed: int = 1
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
