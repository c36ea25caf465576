"""Service-time fit from batch_stats increases, and arrival statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collector.analysis.fit import (
    BLEND_EXECUTIONS,
    CV_FLOOR,
    arrival_stats,
    fit_service_time,
    mean_execution_ms,
)
from collector.analysis.rates import batch_stats_increase
from collector.records import BatchStat, Duration


def stat(size: int, count: int, mean_ms: float) -> BatchStat:
    """``count`` executions at ``size`` averaging ``mean_ms``, split over the three
    compute phases the way Triton reports them (the fit must sum all three)."""
    total = round(count * mean_ms * 1e6)
    inp, out = total // 10, total // 20
    return BatchStat(
        batch_size=size,
        compute_input=Duration(count, inp),
        compute_infer=Duration(count, total - inp - out),
        compute_output=Duration(count, out),
    )


def linear(counts: dict[int, int], intercept: float = 2.0, slope: float = 0.5) -> list[BatchStat]:
    return [stat(b, n, intercept + slope * b) for b, n in counts.items()]


COUNTS = {1: 400, 2: 200, 4: 120, 8: 40}


def test_recovers_intercept_and_slope_of_a_linear_model() -> None:
    fit = fit_service_time(linear(COUNTS))
    assert fit is not None
    assert fit.intercept_ms == pytest.approx(2.0, abs=1e-9)
    assert fit.per_sample_ms == pytest.approx(0.5, abs=1e-9)
    assert fit.residual_cv == CV_FLOOR  # a perfect fit shows no spread: the floor
    assert fit.max_observed_batch == 8
    assert fit.executions == sum(COUNTS.values())
    assert [(p.batch_size, p.executions) for p in fit.points] == sorted(COUNTS.items())
    assert fit.points[2].mean_ms == pytest.approx(4.0)
    assert fit.mean_ms(16) == pytest.approx(10.0)
    assert fit.mean_ms(4) == pytest.approx(4.0)  # blending a point on the line: no-op


def test_fit_from_cumulative_readings_via_batch_stats_increase() -> None:
    before = linear({1: 1000, 4: 300}, intercept=7.0, slope=3.0)  # an older regime
    after_inc = linear({1: 500, 4: 200, 8: 100})
    cumulative = [
        BatchStat(
            batch_size=b.batch_size,
            compute_input=Duration(
                b.compute_input.count + a.compute_input.count,
                b.compute_input.ns + a.compute_input.ns,
            ),
            compute_infer=Duration(
                b.compute_infer.count + a.compute_infer.count,
                b.compute_infer.ns + a.compute_infer.ns,
            ),
            compute_output=Duration(
                b.compute_output.count + a.compute_output.count,
                b.compute_output.ns + a.compute_output.ns,
            ),
        )
        for a, b in zip(before + [stat(8, 0, 0.0)], after_inc, strict=True)
    ]
    fit = fit_service_time(batch_stats_increase(before, cumulative))
    assert fit is not None
    assert fit.intercept_ms == pytest.approx(2.0, abs=1e-6)
    assert fit.per_sample_ms == pytest.approx(0.5, abs=1e-6)


def test_standard_errors_shrink_with_more_executions() -> None:
    small = fit_service_time(linear(COUNTS))
    large = fit_service_time(linear({b: 10 * n for b, n in COUNTS.items()}))
    assert small is not None and large is not None
    assert small.intercept_se_ms is not None and large.intercept_se_ms is not None
    assert small.per_sample_se_ms is not None and large.per_sample_se_ms is not None
    assert large.intercept_se_ms == pytest.approx(small.intercept_se_ms / math.sqrt(10))
    assert large.per_sample_se_ms == pytest.approx(small.per_sample_se_ms / math.sqrt(10))
    lo_s, hi_s = small.interval_ms(8)
    lo_l, hi_l = large.interval_ms(8)
    assert lo_s < lo_l < 6.0 < hi_l < hi_s
    assert large.relative_uncertainty(8) < small.relative_uncertainty(8)


def test_band_widens_away_from_the_observed_sizes() -> None:
    fit = fit_service_time(linear(COUNTS))
    assert fit is not None
    width = {b: fit.interval_ms(b)[1] - fit.interval_ms(b)[0] for b in (2, 8, 32, 128)}
    assert width[2] < width[8] < width[32] < width[128]
    lo, hi = fit.interval_ms(32)
    assert lo < fit.mean_ms(32) < hi


def test_single_batch_size_leaves_the_slope_unidentified() -> None:
    fit = fit_service_time([stat(1, 500, 3.0)])
    assert fit is not None
    assert fit.per_sample_ms is None and fit.per_sample_se_ms is None
    assert not fit.slope_identified
    assert fit.intercept_ms == pytest.approx(3.0)  # the anchor: mean at the one size
    assert fit.intercept_se_ms == pytest.approx(CV_FLOOR * 3.0 / math.sqrt(500))
    assert fit.mean_ms(1) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="per_sample_ms"):
        fit.mean_ms(8)
    assert fit.mean_ms(8, per_sample_ms=0.25) == pytest.approx(3.0 + 0.25 * 7)
    assert fit.interval_ms(8) == (0.0, math.inf)
    assert fit.relative_uncertainty(8) == math.inf
    assert fit.relative_uncertainty(1) == pytest.approx(CV_FLOOR / math.sqrt(500))


def test_given_slope_is_ignored_when_the_fit_has_one() -> None:
    fit = fit_service_time(linear(COUNTS))
    assert fit is not None
    assert fit.mean_ms(16, per_sample_ms=5.0) == pytest.approx(10.0)


def test_noisy_means_raise_residual_cv_above_the_floor() -> None:
    # ±10 % around the line, alternating: a spread the floor does not explain.
    sizes = [1, 2, 3, 4, 6, 8]
    stats = [stat(b, 200, (2.0 + 0.5 * b) * (1.1 if i % 2 else 0.9)) for i, b in enumerate(sizes)]
    fit = fit_service_time(stats)
    assert fit is not None
    assert fit.residual_cv > CV_FLOOR
    assert 0.07 < fit.residual_cv < 0.2
    exact = fit_service_time(linear(dict.fromkeys(sizes, 200)))
    assert exact is not None and exact.intercept_se_ms is not None
    assert fit.intercept_se_ms is not None and fit.intercept_se_ms > exact.intercept_se_ms


def test_well_sampled_point_off_the_line_is_predicted_as_observed() -> None:
    stats = linear({1: 50, 2: 50, 4: 50, 16: 50})
    stats.append(stat(8, 5000, 3.0))  # a fast TensorRT profile at 8: far below the line
    fit = fit_service_time(stats)
    assert fit is not None
    w = 5000 / (5000 + BLEND_EXECUTIONS)
    line = fit.line_ms(8)
    assert fit.mean_ms(8) == pytest.approx(w * 3.0 + (1 - w) * line)
    assert abs(fit.mean_ms(8) - 3.0) < abs(line - 3.0) / 50


def test_no_executions_gives_none_and_duplicates_are_summed() -> None:
    assert fit_service_time([]) is None
    assert fit_service_time([BatchStat(batch_size=4)]) is None
    split = fit_service_time(linear({1: 100, 4: 30}) + linear({1: 100, 4: 30}))
    whole = fit_service_time(linear({1: 200, 4: 60}))
    assert split is not None and whole is not None
    assert split.points == whole.points
    assert split.per_sample_ms == pytest.approx(whole.per_sample_ms)


def test_mean_ms_rejects_non_positive_batch() -> None:
    fit = fit_service_time(linear(COUNTS))
    assert fit is not None
    with pytest.raises(ValueError):
        fit.mean_ms(0)


# --------------------------------------------------------------------------- arrivals


def test_arrival_stats_on_poisson_counts_is_about_one() -> None:
    rng = np.random.default_rng(1)
    intervals = rng.uniform(5.0, 15.0, 400)  # scrapes are not evenly spaced
    counts = rng.poisson(40.0 * intervals)
    stats = arrival_stats(counts.tolist(), intervals.tolist())
    assert stats.intervals == 400
    assert stats.rate_per_s == pytest.approx(40.0, rel=0.02)
    assert stats.dispersion == pytest.approx(1.0, abs=0.2)


def test_arrival_stats_on_bursty_counts_is_above_one() -> None:
    # Gamma inter-arrivals with squared CV 5: the bursty renewal process the
    # simulator uses for dispersion 5; counts over 10 s bins.
    rng = np.random.default_rng(2)
    scv = 5.0
    gaps = rng.gamma(1.0 / scv, scv / 40.0, 200_000)
    arrivals = np.cumsum(gaps)
    counts, _ = np.histogram(arrivals, bins=np.arange(0.0, arrivals[-1] - 10.0, 10.0))
    stats = arrival_stats(counts.tolist(), [10.0] * len(counts))
    assert stats.rate_per_s == pytest.approx(40.0, rel=0.05)
    assert 3.0 < stats.dispersion < 7.0


def test_arrival_stats_edge_cases() -> None:
    assert arrival_stats([], []).dispersion == 1.0
    one = arrival_stats([30.0], [10.0])
    assert (one.rate_per_s, one.dispersion, one.intervals) == (3.0, 1.0, 1)
    idle = arrival_stats([0.0, 0.0], [10.0, 10.0])
    assert (idle.rate_per_s, idle.dispersion) == (0.0, 1.0)
    skipped = arrival_stats([5.0, 10.0, 10.0], [0.0, 10.0, 10.0])
    assert skipped.intervals == 2 and skipped.dispersion == 0.0
    with pytest.raises(ValueError, match="length"):
        arrival_stats([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        arrival_stats([-1.0, 2.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        arrival_stats([math.nan, 2.0], [1.0, 1.0])


def test_mean_execution_time_weighs_every_execution_alike() -> None:
    # 10 executions of 2 ms and 30 of 6 ms (all three compute phases): 5 ms each.
    assert mean_execution_ms([stat(1, 10, 2.0), stat(8, 30, 6.0)]) == pytest.approx(5.0)
    assert mean_execution_ms([]) is None


def test_the_fit_bounds_the_relative_cost_of_two_batch_sizes() -> None:
    """``log_ratio_se``: what the fit leaves uncertain of time(a)/time(b); it shrinks
    with more executions (on a line the means fit: a lack of fit keeps it wide) and
    is unbounded while the slope is unknown."""

    def fitted(count: int):  # type: ignore[no-untyped-def]
        return fit_service_time([stat(b, count, 8.0 + 0.3 * b) for b in (4, 8, 16)])

    few, many = fitted(20), fitted(2000)
    assert few is not None and many is not None
    assert many.log_ratio_se(8, 8) == 0.0
    assert 0.0 < many.log_ratio_se(4, 16) < few.log_ratio_se(4, 16)
    # Further from the observed sizes, less is known.
    assert many.log_ratio_se(4, 32) > many.log_ratio_se(4, 16)
    single = fit_service_time([stat(1, 500, 10.0)])
    assert single is not None and math.isinf(single.log_ratio_se(1, 8))
