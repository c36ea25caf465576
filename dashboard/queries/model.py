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
from collector.analysis.rates import batch_stats_increase, sum_batch_stats, window_batch_stats
from collector.analysis.recommend import recommendation_figures
from collector.records import BatchStat, Duration, ModelSample, Prediction, Recommendation
from collector.store import Store, StoredFinding, StoredRecommendation
from dashboard.queries.views import (
    BatchDistribution,
    RecommendationView,
    ServiceTimeView,
    is_open,
    severity_rank,
)

__all__ = [
    "by_version",
    "distribution_edges",
    "distribution_pairwise",
    "latest_recommendation",
    "recommendation_view",
    "service_time",
    "shown_figures",
    "worst_open_severity",
]

# Batch stats of a long range: the sample nearest each end within this much.
_EDGE_S: Final = 300.0


def by_version(samples: Iterable[ModelSample]) -> dict[str, list[ModelSample]]:
    out: dict[str, list[ModelSample]] = defaultdict(list)
    for s in samples:
        out[s.version].append(s)
    return out


def _distribution(batches: Sequence[BatchStat]) -> BatchDistribution:
    executed = [b for b in batches if b.exec_count > 0]
    return BatchDistribution(
        sizes=[b.batch_size for b in executed],
        executions=[b.exec_count for b in executed],
        mean_ms=[b.compute_ns / b.exec_count / 1e6 for b in executed],
    )


def distribution_pairwise(samples: Sequence[ModelSample], since: float) -> BatchDistribution:
    """Exact: the batch_stats increase of every pair ending in the range."""
    return _distribution(
        sum_batch_stats(
            window_batch_stats(series, since=since) for series in by_version(samples).values()
        )
    )


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
    increases = []
    for version, newest in last.items():
        # The statistics may be read less often than the metrics: the edges' outermost
        # samples that have them.
        end = next((s for s in reversed(newest) if s.stats is not None), None)
        if end is None or end.stats is None:
            continue
        start = next((s for s in first.get(version, ()) if s.stats is not None), None)
        before = start.stats.batch_stats if start is not None and start.stats else None
        increases.append(batch_stats_increase(before, end.stats.batch_stats))
    return _distribution(sum_batch_stats(increases))


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
    latest = store.latest_recommendation(target, model)
    return None if latest is None else recommendation_view(latest)


def shown_figures(rec: Recommendation) -> tuple[Prediction, Prediction, float | None]:
    """The one current and one predicted throughput (with p95) a page shows beside
    ``rec``, and the gain between them: the recommender's figures
    (``recommendation_figures``), so the page, the CLI and the reason agree."""
    figures = recommendation_figures(rec)
    return (
        Prediction(qps=figures.current_qps, p95_ms=rec.current.p95_ms),
        Prediction(qps=figures.predicted_qps, p95_ms=rec.predicted.p95_ms),
        figures.gain,
    )


def recommendation_view(
    stored: StoredRecommendation, severity: str | None = None
) -> RecommendationView:
    """``stored`` as the pages show it; ``severity``: its model's most severe open
    finding."""
    rec = stored.recommendation
    current, predicted, gain = shown_figures(rec)
    return RecommendationView(
        stored=stored,
        changes=[[c.field, str(c.before), str(c.after)] for c in rec.changes],
        current_pbtxt=render_pbtxt(
            rec.current_config, instance_kind=_instance_kind(rec.config_json)
        ),
        current=current,
        predicted=predicted,
        gain=gain,
        severity=severity,
    )


def worst_open_severity(findings: Iterable[StoredFinding]) -> dict[tuple[str, str], str]:
    """Per (target, subject), the most severe of ``findings`` that are still open."""
    worst: dict[tuple[str, str], str] = {}
    for f in findings:
        key = (f.target, f.subject)
        if is_open(f) and (
            key not in worst or severity_rank(f.severity) < severity_rank(worst[key])
        ):
            worst[key] = f.severity
    return worst


def _instance_kind(config_json: str) -> str:
    try:
        groups = json.loads(config_json).get("instance_group") or [{}]
        return str(groups[0].get("kind") or "KIND_CPU")
    except (ValueError, AttributeError, IndexError):
        return "KIND_CPU"
