"""A model's rate charts over a range, and its executed batch sizes.

Ranges up to ``RAW_RANGE_S`` are read from raw samples: each point is the rates of
one time bucket, the samples' stored per-scrape rates merged over the bucket and
across the model's versions. Longer ranges are read from rollups (the versions' rates
of a rollup bucket merged, then the buckets of one point merged over time) plus the
raw samples after the last rollup. Every merge is ``collector.analysis.rates``'s; this
module only chooses what to merge. At most ``max_points`` points.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from collector.analysis.rates import (
    bucket_rates,
    gauge_mean,
    merge_over_series,
    merge_over_time,
)
from collector.records import ModelRates, ModelSample
from collector.store import ModelRollup, Store
from dashboard.queries.model import by_version, distribution_edges, distribution_pairwise
from dashboard.queries.views import RAW_FALLBACK_S, RAW_RANGE_S, BatchDistribution, ModelSeries

__all__ = ["series_and_distribution"]

# Raw reads start this much before the range, so the first pair has a predecessor.
_LEAD_S: Final = 60.0
# A sample pair spanning more scrape intervals than this is drawn as a gap.
_GAP_INTERVALS: Final = 3.0


def series_and_distribution(
    store: Store,
    target: str,
    model: str,
    since: float,
    until: float,
    *,
    max_points: int = 240,
) -> tuple[ModelSeries, BatchDistribution]:
    max_points = max(int(max_points), 2)
    if until - since <= RAW_RANGE_S:
        samples = store.model_samples(
            target=target, model=model, since=since - _LEAD_S, until=until
        )
        return (
            raw_series(samples, since, until, max_points),
            distribution_pairwise(samples, since),
        )

    rollups = store.model_rollups(target=target, model=model, since=since, until=until)
    distribution = distribution_edges(store, target, model, since, until)
    if not rollups:
        start = max(since, until - RAW_FALLBACK_S)
        samples = store.model_samples(
            target=target, model=model, since=start - _LEAD_S, until=until
        )
        series = raw_series(samples, start, until, max_points)
        if start > since:
            series = replace(series, truncated_to_s=until - start)
        return series, distribution
    bucket_s = min(r.bucket_s for r in rollups)
    rollups = [r for r in rollups if r.bucket_s == bucket_s]
    rolled_until = max(r.bucket_start + r.bucket_s for r in rollups)
    tail: list[ModelSample] = []
    if rolled_until < until:
        tail = store.model_samples(
            target=target, model=model, since=rolled_until - _LEAD_S, until=until
        )
    step = max(bucket_s, (until - since) / max_points)
    return rollup_series(rollups, tail, rolled_until, until, step), distribution


# requests/s, avg batch, queue ms, compute ms, pending requests, failures/s
_Values = tuple[float | None, float | None, float | None, float | None, float | None, float | None]
_GAP: Final[_Values] = (None, None, None, None, None, None)


class _Columns:
    """Accumulates the points of a ``ModelSeries``, with a gap point (every value
    ``None``) where buckets are missing."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.values: list[_Values] = []

    def gap(self, t: float) -> None:
        self.t.append(t)
        self.values.append(_GAP)

    def add(self, t: float, rates: ModelRates, pending_request_count: float | None) -> None:
        self.t.append(t)
        self.values.append(
            (
                rates.requests_per_s,
                rates.avg_batch_size,
                _ms(rates.queue_us_per_request),
                _ms(rates.compute_us_per_request),
                pending_request_count,
                rates.fail_per_s,
            )
        )

    def extend(self, series: ModelSeries) -> None:
        self.t.extend(series.t)
        self.values.extend(
            zip(
                series.requests_per_s,
                series.avg_batch_size,
                series.queue_ms,
                series.compute_ms,
                series.pending_request_count,
                series.fail_per_s,
                strict=True,
            )
        )

    def series(self, bucket_s: float, source: str) -> ModelSeries:
        cols: list[list[float | None]] = [[] for _ in _GAP]
        for point in self.values:
            for col, value in zip(cols, point, strict=True):
                col.append(value)
        return ModelSeries(
            bucket_s=bucket_s,
            source=source if self.t else "none",
            t=self.t,
            requests_per_s=cols[0],
            avg_batch_size=cols[1],
            queue_ms=cols[2],
            compute_ms=cols[3],
            pending_request_count=cols[4],
            fail_per_s=cols[5],
        )


def _ms(us: float | None) -> float | None:
    return us / 1000.0 if us is not None else None


def _median_interval(samples: Sequence[ModelSample]) -> float | None:
    gaps = sorted(
        b.collected_at - a.collected_at for a, b in zip(samples, samples[1:], strict=False)
    )
    return gaps[len(gaps) // 2] if gaps else None


def raw_series(
    samples: Sequence[ModelSample], since: float, until: float, max_points: int
) -> ModelSeries:
    """One point per bucket: the versions' rates over the bucket merged across
    versions (their windows overlap), at the bucket's latest sample; the pending
    gauge's mean per version, summed.

    A bucket is never shorter than the scrape interval, so a steady series has no
    empty buckets; a pair spanning more than ``_GAP_INTERVALS`` intervals (the
    collector or the target was down) puts a gap row before its bucket."""
    versions = by_version(samples)
    interval = min(
        (i for v in versions.values() if (i := _median_interval(v)) is not None), default=1.0
    )
    bucket_s = max((until - since) / max_points, interval, 1.0)
    long_pair = max(_GAP_INTERVALS * interval, 2 * bucket_s)

    def bucket(at: float) -> int:
        return int((at - since) // bucket_s)

    rates: dict[int, list[ModelRates]] = defaultdict(list)
    last_t: dict[int, float] = {}
    pending: dict[int, list[float]] = defaultdict(list)
    gap_before: set[int] = set()
    for series in versions.values():
        for at, merged in bucket_rates(series, since=since, until=until, bucket_s=bucket_s):
            rates[bucket(at)].append(merged)
            last_t[bucket(at)] = max(last_t.get(bucket(at), at), at)
        gauges: dict[int, list[float | None]] = defaultdict(list)
        for prev, cur in zip(series, series[1:], strict=False):
            if cur.collected_at < since:
                continue
            if cur.collected_at - prev.collected_at > long_pair and prev.collected_at >= since:
                gap_before.add(bucket(cur.collected_at))
            gauges[bucket(cur.collected_at)].append(cur.metrics.pending_request_count)
        for k, values in gauges.items():
            if (mean := gauge_mean(values)) is not None:
                pending[k].append(mean)

    out = _Columns()
    for k in sorted(rates):
        across = merge_over_series(rates[k])
        if across is None or across.window_s <= 0:
            continue
        if k in gap_before and out.t:
            out.gap(out.t[-1] + interval)
        out.add(last_t[k], across, sum(pending[k]) if pending[k] else None)
    return out.series(bucket_s, "raw")


def rollup_series(
    rollups: Sequence[ModelRollup],
    tail: Sequence[ModelSample],
    rolled_until: float,
    until: float,
    step: float,
) -> ModelSeries:
    """Rollup buckets merged over versions and into ``step``-long points, then the raw
    samples after the last rollup."""
    groups: dict[float, dict[float, list[ModelRollup]]] = defaultdict(lambda: defaultdict(list))
    origin = min(r.bucket_start for r in rollups)
    for r in rollups:
        point = origin + math.floor((r.bucket_start - origin) / step) * step
        groups[point][r.bucket_start].append(r)
    out = _Columns()
    previous: float | None = None
    for start in sorted(groups):
        buckets = groups[start]
        per_bucket = [
            merge_over_series([r.rates for r in rows if r.rates is not None])
            for rows in buckets.values()
        ]
        merged = merge_over_time([r for r in per_bucket if r is not None])
        if merged is None:
            continue
        if previous is not None and start - previous > step * 1.5:
            out.gap(previous + step)
        previous = start
        # The pending gauge: summed over versions, averaged over the point's buckets.
        pending = gauge_mean(
            sum(values)
            if (
                values := [
                    r.pending_request_count for r in rows if r.pending_request_count is not None
                ]
            )
            else None
            for rows in buckets.values()
        )
        out.add(start + step / 2, merged, pending)
    if tail:
        out.extend(
            raw_series(tail, rolled_until, until, max(int((until - rolled_until) / step), 1))
        )
    return out.series(step, "rollup")
