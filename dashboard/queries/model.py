"""A model page's parts besides its rate charts: the executed batch sizes over the
range (from the statistics API's cumulative batch_stats), the service-time fit over
them, and the latest recommendation."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from collector.analysis.configs import render_pbtxt
from collector.analysis.fit import fit_service_time
from collector.analysis.rates import batch_stats_increase, stats_reset
from collector.records import BatchStat, Duration, ModelSample
from collector.store import Store, StoredRecommendation
from dashboard.queries.views import BatchDistribution, RecommendationView, ServiceTimeView

__all__ = [
    "by_version",
    "distribution_edges",
    "distribution_pairwise",
    "latest_recommendation",
    "recommendation_view",
    "service_time",
]

# Batch stats of a long range: the sample nearest each end within this much.
_EDGE_S: Final = 300.0


def by_version(samples: Iterable[ModelSample]) -> dict[str, list[ModelSample]]:
    out: dict[str, list[ModelSample]] = defaultdict(list)
    for s in samples:
        out[s.version].append(s)
    return out


def _sum_batches(increases: Iterable[BatchStat], into: dict[int, list[int]]) -> None:
    for b in increases:
        t = into.setdefault(b.batch_size, [0, 0, 0, 0])
        t[0] += b.exec_count
        t[1] += b.compute_input.ns
        t[2] += b.compute_infer.ns
        t[3] += b.compute_output.ns


def _distribution(totals: dict[int, list[int]]) -> BatchDistribution:
    sizes = sorted(s for s, t in totals.items() if t[0] > 0)
    return BatchDistribution(
        sizes=sizes,
        executions=[totals[s][0] for s in sizes],
        mean_ms=[(totals[s][1] + totals[s][2] + totals[s][3]) / totals[s][0] / 1e6 for s in sizes],
    )


def distribution_pairwise(samples: Sequence[ModelSample], since: float) -> BatchDistribution:
    """Exact: the batch_stats increase of every pair ending in the range."""
    totals: dict[int, list[int]] = {}
    for series in by_version(samples).values():
        for prev, cur in zip(series, series[1:], strict=False):
            if cur.collected_at < since or cur.stats is None:
                continue
            reset = prev.stats is None or stats_reset(prev, cur)
            _sum_batches(
                batch_stats_increase(
                    prev.stats.batch_stats if prev.stats else None,
                    cur.stats.batch_stats,
                    reset=reset,
                ),
                totals,
            )
    return _distribution(totals)


def distribution_edges(
    store: Store, target: str, model: str, since: float, until: float
) -> BatchDistribution:
    """For a long range, the difference between the cumulative batch_stats near its two
    ends (two small reads). A reload inside the range leaves only what the sizes
    accrued since (``batch_stats_increase`` treats a size that went down as reset)."""
    first = by_version(
        store.model_samples(
            target=target, model=model, since=since, until=min(since + _EDGE_S, until)
        )
    )
    last = by_version(
        store.model_samples(
            target=target, model=model, since=max(until - _EDGE_S, since), until=until
        )
    )
    totals: dict[int, list[int]] = {}
    for version, newest in last.items():
        end = newest[-1]
        if end.stats is None:
            continue
        start = first.get(version, [None])[0]
        before = start.stats.batch_stats if start is not None and start.stats else None
        _sum_batches(batch_stats_increase(before, end.stats.batch_stats), totals)
    return _distribution(totals)


def service_time(
    distribution: BatchDistribution, max_batch_size: int | None
) -> ServiceTimeView | None:
    if distribution.empty:
        return None
    fit = fit_service_time(
        [
            BatchStat(batch_size=s, compute_infer=Duration(n, int(ms * n * 1e6)))
            for s, n, ms in zip(
                distribution.sizes, distribution.executions, distribution.mean_ms, strict=True
            )
        ]
    )
    if fit is None:
        return None
    return ServiceTimeView(
        sizes=[p.batch_size for p in fit.points],
        mean_ms=[p.mean_ms for p in fit.points],
        executions=[p.executions for p in fit.points],
        intercept_ms=fit.intercept_ms,
        per_sample_ms=fit.per_sample_ms,
        max_batch_size=max_batch_size or None,
    )


def latest_recommendation(store: Store, target: str, model: str) -> RecommendationView | None:
    stored = store.recommendations(target=target, model=model)
    if not stored:
        return None
    return recommendation_view(stored[-1])


def recommendation_view(stored: StoredRecommendation) -> RecommendationView:
    rec = stored.recommendation
    return RecommendationView(
        stored=stored,
        changes=[[c.field, str(c.before), str(c.after)] for c in rec.changes],
        current_pbtxt=render_pbtxt(
            rec.current_config, instance_kind=_instance_kind(rec.config_json)
        ),
    )


def _instance_kind(config_json: str) -> str:
    try:
        groups = json.loads(config_json).get("instance_group") or [{}]
        return str(groups[0].get("kind") or "KIND_CPU")
    except (ValueError, AttributeError, IndexError):
        return "KIND_CPU"
