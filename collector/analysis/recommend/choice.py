"""When one config's prediction beats another's: the one comparison rule of the
recommender, and the order in which ties are broken.

A prediction is not one number but several paired runs of the batcher model: one per
client serial share the model is calibrated for (the stagger the server cannot see)
and per simulation seed. Every config is run on the same (variant, seed) pairs, so
two configs compare run by run. The *uncertainty* of a predicted gain of ``a`` over
``b`` combines, in log space:

* the spread of the paired log ratios ``log(qps_a,i / qps_b,i)`` across those runs
  and across runs of the model calibrated on the earlier windows of the same config
  (``window_offsets``: a bootstrap over windows — what the same search would have
  said moments ago). Their sample standard deviation carries the model's own
  ambiguity, the simulation's noise and the window's sampling noise; it is not divided
  by √n, since the runs are readings the data cannot tell apart, not draws to
  average away; and
* the fit's standard error of ``log time(b_a) − log time(b_b)`` at the mean batch
  sizes the two configs run at (``ServiceTimeFit.log_ratio_se``): how uncertain the
  measured cost curve leaves the relative cost of the two batch sizes.

``a`` beats ``b`` only when its predicted gain exceeds ``GAIN_Z`` (≈95 %) times that
uncertainty, and at least ``min_gain``. Likewise a standing config keeps meeting the
p95 objective while its predicted p95 is above it by less than its own spread
(``meets``). Otherwise the two are tied, and ties go to the
*standing* config (the one now running, then the recommendation already stored),
then to the simpler one: fewer instances, fewer preferred sizes, smaller delay. Among
fresh options (none of them standing) a tie is a predicted difference under
``NEAR_TIE``: on the CPU bench, taking the simplest config within the whole
uncertainty of the best measured about 10 % less throughput than the best, so the
wide band is kept for what it is for — not changing advice that stands. The
standing advice is the recommendation already stored for the running config when
there is one (it was chosen over the running config, and stays chosen until a
challenger, the running config included, beats it), else the running config.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from collector.analysis.fit import ServiceTimeFit
from collector.records import BatcherConfig, Prediction

__all__ = [
    "GAIN_Z",
    "NEAR_TIE",
    "Estimate",
    "beats",
    "gain_uncertainty",
    "log_gain",
    "meets",
    "prefer",
    "simplicity",
]

GAIN_Z = 1.96
"""A gain must exceed this many standard errors (two-sided ≈95 %) to count."""

NEAR_TIE = 0.01
"""Fresh options predicted within this share of the best are tied: the simpler wins."""


@dataclass(frozen=True)
class Estimate:
    """One config's predicted QPS and p95: the mean over the batcher model's paired
    runs (``runs``, one per variant and seed, in the same order for every config)."""

    config: BatcherConfig
    prediction: Prediction
    runs: tuple[Prediction, ...]
    # Paired runs of the model calibrated on earlier windows: they widen the spread
    # (how far the gain moves with the window looked at), not the prediction.
    window_runs: tuple[Prediction, ...] = ()

    @property
    def qps(self) -> float:
        return self.prediction.qps

    @property
    def p95_ms(self) -> float:
        """Infinite when no request completed (it meets no objective)."""
        p95 = self.prediction.p95_ms
        return p95 if p95 is not None else math.inf

    @property
    def batch(self) -> float:
        return self.prediction.avg_batch_size or 1.0


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def log_gain(a: Estimate, b: Estimate) -> float:
    """``log(qps_a / qps_b)`` of the mean predictions."""
    return _log(a.qps) - _log(b.qps)


def gain_uncertainty(a: Estimate, b: Estimate, fit: ServiceTimeFit | None) -> float:
    """Standard error of ``log_gain(a, b)`` (see the module docstring); ``inf`` when
    the runs are not paired or the fit cannot bound the cost of ``a``'s batches."""
    mine, theirs = a.runs + a.window_runs, b.runs + b.window_runs
    if len(mine) != len(theirs) or not mine:
        return math.inf
    ratios = [_log(x.qps) - _log(y.qps) for x, y in zip(mine, theirs, strict=True)]
    if not all(math.isfinite(r) for r in ratios):
        return math.inf
    spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    fitted = fit.log_ratio_se(a.batch, b.batch) if fit is not None else math.inf
    return math.sqrt(spread * spread + fitted * fitted)


def beats(a: Estimate, b: Estimate, fit: ServiceTimeFit | None, *, min_gain: float) -> bool:
    """Whether ``a`` serves more than ``b`` by more than the uncertainty of the gain
    (``GAIN_Z`` standard errors) and by at least ``min_gain``."""
    gain = log_gain(a, b)
    needed = max(GAIN_Z * gain_uncertainty(a, b, fit), math.log1p(min_gain))
    return gain > needed


def meets(e: Estimate, limit_ms: float, *, standing: bool = False) -> bool:
    """Whether ``e``'s predicted p95 meets ``limit_ms``. A standing config keeps
    meeting it while its p95 is within the uncertainty of the limit (``GAIN_Z`` times
    the spread of ``log p95`` across its runs): a p95 that wavers around the
    objective from one window to the next does not make the advice flip."""
    if e.p95_ms <= limit_ms:
        return True
    if not standing:
        return False
    logs = [math.log(p.p95_ms) for p in e.runs + e.window_runs if p.p95_ms and p.p95_ms > 0]
    spread = statistics.stdev(logs) if len(logs) > 1 else 0.0
    return math.log(e.p95_ms / limit_ms) <= GAIN_Z * spread


def simplicity(config: BatcherConfig) -> tuple[int, int, int, bool]:
    """Sort key, simplest first: fewer instances, fewer preferred sizes, less delay."""
    return (
        config.instance_count,
        len(config.preferred_batch_sizes),
        config.max_queue_delay_us,
        config.dynamic_batching,
    )


def prefer(
    best: Estimate,
    options: Sequence[Estimate],
    fit: ServiceTimeFit | None,
    *,
    standing: Sequence[BatcherConfig],
    min_gain: float,
) -> Estimate:
    """``best``, unless the first of ``standing`` that ``best`` does not beat (by the
    uncertainty and ``min_gain``) is among ``options``: then that one. Among fresh
    options the simplest of those predicted within ``NEAR_TIE`` of ``best`` wins: the
    model cannot rank them, while a wider band would trade measurable throughput for
    simplicity on a first recommendation."""
    for config in standing:
        for e in options:
            if e.config == config and not beats(best, e, fit, min_gain=min_gain):
                return e
    near = [e for e in options if e.qps >= best.qps * (1.0 - NEAR_TIE)]
    return min(near or [best], key=lambda e: (simplicity(e.config), e.p95_ms))
