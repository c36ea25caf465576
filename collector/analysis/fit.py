"""Service time per executed batch size, and arrival statistics, from a window.

Two pure estimators that feed the batcher simulation (``batcher_sim``):

* :func:`fit_service_time` fits ``time(b) = intercept + per_sample × b`` to the
  statistics API's ``batch_stats`` *increases* over a window (one mean per executed
  batch size, see :func:`collector.analysis.rates.batch_stats_increase`). Execution
  time is ``compute_input + compute_infer + compute_output`` — what an instance is
  occupied with per execution — and the number of executions is
  ``compute_infer.count``.
* :func:`arrival_stats` turns per-scrape request counts into a rate and an index of
  dispersion (1 for Poisson arrivals, above 1 for bursty traffic).

What ``batch_stats`` can and cannot say: it holds a count and a *sum* per size, so
the per-size means are exact but the spread of single executions is not observable.
``residual_cv`` therefore measures how far the per-size means stray from the line
(weighted by executions), never less than a floor that stands in for the jitter
batch_stats hide. The standard errors follow from that spread and shrink as
``1/√executions`` when the line fits; when it does not (deviations larger than the
noise could explain), the lack of fit keeps them wide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from collector.records import BatchStat

__all__ = [
    "ArrivalStats",
    "BLEND_EXECUTIONS",
    "CV_FLOOR",
    "ServicePoint",
    "ServiceTimeFit",
    "arrival_stats",
    "fit_service_time",
    "mean_execution_ms",
]

CV_FLOOR = 0.05
"""Least relative spread assumed for one execution (batch_stats cannot show less)."""

BLEND_EXECUTIONS = 50.0
"""An observed per-size mean backed by this many executions weighs as much as the line."""

_Z95 = 1.959963984540054  # two-sided 95 % normal quantile
_MIN_MS = 1e-3  # a predicted execution never takes less than 1 µs (keeps simulations finite)


@dataclass(frozen=True)
class ServicePoint:
    """Mean execution time at one executed batch size over the window."""

    batch_size: int
    executions: int
    mean_ms: float


@dataclass(frozen=True)
class ServiceTimeFit:
    """``time(b) ≈ intercept_ms + per_sample_ms × b`` per execution of a batch of ``b``.

    ``per_sample_ms`` is ``None`` when one batch size was observed: the slope is then
    unidentified, and ``intercept_ms`` holds the observed mean at that single size
    (``max_observed_batch``) instead — an anchor from which :meth:`mean_ms`
    extrapolates with a slope the caller supplies.

    Standard errors are ``None`` when the parameter is unidentified.
    ``intercept_slope_cov_ms2`` is their covariance (needed for the band at a given
    size; ``None`` with the slope). ``residual_cv`` is the execution-weighted relative
    spread of the per-size means around the line, never below the floor.
    """

    intercept_ms: float
    per_sample_ms: float | None
    intercept_se_ms: float | None
    per_sample_se_ms: float | None
    residual_cv: float
    points: tuple[ServicePoint, ...]
    max_observed_batch: int
    executions: int
    intercept_slope_cov_ms2: float | None = None

    @property
    def slope_identified(self) -> bool:
        return self.per_sample_ms is not None

    def line_ms(self, batch: int, *, per_sample_ms: float | None = None) -> float:
        """The fitted line at ``batch`` (no blending with observed means).

        With the slope unidentified, ``per_sample_ms`` is required unless ``batch`` is
        the one observed size; a given ``per_sample_ms`` is ignored when the slope was
        fitted.
        """
        if self.per_sample_ms is not None:
            return self.intercept_ms + self.per_sample_ms * batch
        anchor = self.max_observed_batch
        if batch == anchor:
            return self.intercept_ms
        if per_sample_ms is None:
            raise ValueError(
                f"slope unidentified (only batch size {anchor} observed): "
                f"pass per_sample_ms to predict batch size {batch}"
            )
        return self.intercept_ms + per_sample_ms * (batch - anchor)

    def mean_ms(self, batch: int, *, per_sample_ms: float | None = None) -> float:
        """Predicted mean execution time of a batch of ``batch`` samples, in ms.

        The line, blended at an observed size with the observed mean: weight
        ``n / (n + BLEND_EXECUTIONS)`` on the observed mean of ``n`` executions, so a
        well-sampled size that bends away from the line (a TensorRT profile, say) is
        predicted as measured, and a rarely seen one mostly by the line. Never below
        1 µs. ``per_sample_ms`` as in :meth:`line_ms`.
        """
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        value = self.line_ms(batch, per_sample_ms=per_sample_ms)
        for p in self.points:
            if p.batch_size == batch:
                w = p.executions / (p.executions + BLEND_EXECUTIONS)
                value = w * p.mean_ms + (1.0 - w) * value
                break
        return max(value, _MIN_MS)

    def _se_ms(self, batch: int) -> float:
        # Standard error of the line at ``batch``; inf where nothing bounds it.
        if self.per_sample_ms is None:
            if batch == self.max_observed_batch and self.intercept_se_ms is not None:
                return self.intercept_se_ms
            return math.inf
        var_a = (self.intercept_se_ms or 0.0) ** 2
        var_s = (self.per_sample_se_ms or 0.0) ** 2
        cov = self.intercept_slope_cov_ms2 or 0.0
        return math.sqrt(max(var_a + batch * batch * var_s + 2.0 * batch * cov, 0.0))

    def interval_ms(self, batch: int, *, per_sample_ms: float | None = None) -> tuple[float, float]:
        """≈95 % band of the mean execution time at ``batch``: ``mean ± 1.96 SE``,
        the SE of the fitted line there (it widens away from the observed sizes).
        With the slope unidentified, a size other than the observed one gets
        ``(0.0, inf)``: the data say nothing about it."""
        se = self._se_ms(batch)
        if math.isinf(se):
            return (0.0, math.inf)
        mid = self.mean_ms(batch, per_sample_ms=per_sample_ms)
        return (max(mid - _Z95 * se, 0.0), mid + _Z95 * se)

    def relative_uncertainty(self, batch: int, *, per_sample_ms: float | None = None) -> float:
        """Relative standard error (SE / mean) of the mean execution time at
        ``batch``; ``inf`` where the slope is unidentified and ``batch`` is not the
        observed size."""
        se = self._se_ms(batch)
        if math.isinf(se):
            return math.inf
        return se / self.mean_ms(batch, per_sample_ms=per_sample_ms)

    def log_ratio_se(self, batch_a: float, batch_b: float) -> float:
        """Standard error of ``log time(a) − log time(b)`` on the fitted line, to first
        order: how far the fit alone leaves the relative cost of executions of ``a``
        and ``b`` samples uncertain (0 for ``a == b``; the shared error of the line
        cancels). ``inf`` with the slope unidentified, unless ``a == b``. Batch sizes
        may be fractional (a simulated mean batch)."""
        if batch_a == batch_b:
            return 0.0
        if self.per_sample_ms is None:
            return math.inf
        t_a = max(self.intercept_ms + self.per_sample_ms * batch_a, _MIN_MS)
        t_b = max(self.intercept_ms + self.per_sample_ms * batch_b, _MIN_MS)
        # d log t(b) = (d intercept + b · d slope) / t(b)
        g_a = 1.0 / t_a - 1.0 / t_b
        g_s = batch_a / t_a - batch_b / t_b
        var_a = (self.intercept_se_ms or 0.0) ** 2
        var_s = (self.per_sample_se_ms or 0.0) ** 2
        cov = self.intercept_slope_cov_ms2 or 0.0
        return math.sqrt(max(g_a * g_a * var_a + g_s * g_s * var_s + 2.0 * g_a * g_s * cov, 0.0))


def mean_execution_ms(batches: Sequence[BatchStat]) -> float | None:
    """Mean time of one execution (ms), whatever its batch size, over ``batches``
    (``batch_stats`` increases); ``None`` without executions."""
    executions = sum(b.exec_count for b in batches)
    if not executions:
        return None
    return _mean_ms(sum(b.compute_ns for b in batches), executions)


def _mean_ms(total_ns: float, executions: int) -> float:
    return total_ns / executions / 1e6


def fit_service_time(
    batches: Sequence[BatchStat], *, cv_floor: float = CV_FLOOR
) -> ServiceTimeFit | None:
    """Weighted least squares of mean execution time on batch size.

    ``batches`` are batch_stats *increases* over a window (a size may appear more
    than once, e.g. increases of several sample pairs; they are summed). Sizes with
    no execution are ignored; ``None`` when no execution remains. Weights are the
    executions per size: a per-size mean of ``n`` executions has variance ``σ²/n``.

    ``σ²`` is the larger of the weighted residual variance of the means (with more
    than two sizes; it carries any lack of fit) and ``(residual_cv × mean)²``.
    """
    if cv_floor < 0:
        raise ValueError(f"cv_floor must be >= 0, got {cv_floor}")
    sums: dict[int, list[int]] = {}
    for b in batches:
        count = b.exec_count
        if count <= 0:
            continue
        if b.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {b.batch_size}")
        acc = sums.setdefault(b.batch_size, [0, 0])
        acc[0] += count
        acc[1] += b.compute_ns
    if not sums:
        return None
    points = tuple(
        ServicePoint(batch_size=size, executions=n, mean_ms=_mean_ms(ns, n))
        for size, (n, ns) in sorted(sums.items())
    )
    total = sum(p.executions for p in points)
    largest = points[-1].batch_size
    ybar = sum(p.executions * p.mean_ms for p in points) / total

    if len(points) == 1:
        cv = cv_floor
        return ServiceTimeFit(
            intercept_ms=points[0].mean_ms,
            per_sample_ms=None,
            intercept_se_ms=cv * ybar / math.sqrt(total),
            per_sample_se_ms=None,
            residual_cv=cv,
            points=points,
            max_observed_batch=largest,
            executions=total,
        )

    # Closed-form WLS on centred sizes: exact, and well conditioned for large sizes.
    xbar = sum(p.executions * p.batch_size for p in points) / total
    sxx = sum(p.executions * (p.batch_size - xbar) ** 2 for p in points)
    sxy = sum(p.executions * (p.batch_size - xbar) * (p.mean_ms - ybar) for p in points)
    slope = sxy / sxx
    intercept = ybar - slope * xbar

    dof = len(points) - 2
    ss = 0.0  # Σ n r²: the weighted residual sum of squares of the means
    ss_rel = 0.0  # Σ n (r / fitted)²
    for p in points:
        fitted = intercept + slope * p.batch_size
        r = p.mean_ms - fitted
        ss += p.executions * r * r
        ss_rel += p.executions * (r / max(abs(fitted), _MIN_MS)) ** 2
    # With two sizes the line passes through both means: no spread is observable.
    cv = math.sqrt(ss_rel / total * len(points) / dof) if dof > 0 else 0.0
    cv = max(cv, cv_floor)
    sigma2 = max(ss / dof if dof > 0 else 0.0, (cv * ybar) ** 2)
    return ServiceTimeFit(
        intercept_ms=intercept,
        per_sample_ms=slope,
        intercept_se_ms=math.sqrt(sigma2 * (1.0 / total + xbar * xbar / sxx)),
        per_sample_se_ms=math.sqrt(sigma2 / sxx),
        residual_cv=cv,
        points=points,
        max_observed_batch=largest,
        executions=total,
        intercept_slope_cov_ms2=-xbar * sigma2 / sxx,
    )


# --------------------------------------------------------------------------- arrivals


@dataclass(frozen=True)
class ArrivalStats:
    """Request rate over a window and the index of dispersion of its counts.

    ``dispersion`` ≈ 1 for Poisson arrivals, > 1 for bursty ones (< 1 for arrivals
    more regular than Poisson); 1.0 when fewer than two intervals could be used.
    ``intervals`` is how many intervals (with positive length) went in.
    """

    rate_per_s: float
    dispersion: float
    intervals: int


def arrival_stats(counts: Sequence[float], interval_s: Sequence[float]) -> ArrivalStats:
    """Rate and index of dispersion from per-scrape request counts.

    ``counts[i]`` requests arrived in an interval of ``interval_s[i]`` seconds.
    Intervals may differ in length, so the dispersion is Pearson's statistic over its
    degrees of freedom, ``Σ (cᵢ − λtᵢ)² / (λtᵢ) / (m − 1)`` with ``λ = Σc / Σt``: for
    equal intervals this is variance/mean of the counts, and for Poisson arrivals its
    expectation is 1 whatever the lengths. Intervals of zero or negative length are
    skipped.
    """
    if len(counts) != len(interval_s):
        raise ValueError(
            f"counts and interval_s differ in length ({len(counts)} vs {len(interval_s)})"
        )
    pairs: list[tuple[float, float]] = []
    for c, t in zip(counts, interval_s, strict=True):
        if not (math.isfinite(c) and math.isfinite(t)):
            raise ValueError(f"non-finite count or interval: {c!r}, {t!r}")
        if c < 0:
            raise ValueError(f"counts must be >= 0, got {c}")
        if t > 0:
            pairs.append((float(c), float(t)))
    m = len(pairs)
    seconds = sum(t for _, t in pairs)
    total = sum(c for c, _ in pairs)
    rate = total / seconds if seconds > 0 else 0.0
    if m < 2 or total <= 0:
        return ArrivalStats(rate_per_s=rate, dispersion=1.0, intervals=m)
    chi2 = sum((c - rate * t) ** 2 / (rate * t) for c, t in pairs)
    return ArrivalStats(rate_per_s=rate, dispersion=chi2 / (m - 1), intervals=m)
