"""One scrape's view of the store: ``ExporterSnapshot``, read once per ``/metrics``.

Every figure in it comes from the function that computes it elsewhere: the status
(``collector.analysis.status.build_status``: targets judged from now, window rates,
effective configs, devices, processes), the store's active findings and stored
recommendations, the latest ``batch_stats`` of each fresh series, the alerts pending or
firing and the outbox's count per receiver and state. The collectors
(``collector.exporter.collectors``) only turn this record into metric families, so
every family of one scrape describes the same moment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from collector.analysis.health import TRITON_KIND, is_fresh, scrape_interval_s, stale_after_s
from collector.analysis.status import StatusReport, build_status
from collector.config import MAX_STATISTICS_INTERVAL_S
from collector.records import ModelSample
from collector.store import Store, StoredFinding, StoredRecommendation
from collector.store.alerts import NOTIFICATION_STATES, AlertState

__all__ = ["ExporterSnapshot", "OutboxCount", "batchscope_version", "take_snapshot"]

#: The alert states the exporter shows (a resolved alert is over, as in Prometheus).
ACTIVE_ALERT_STATES = ("pending", "firing")


def batchscope_version() -> str:
    """The installed distribution's version (``"unknown"`` when run from a bare tree)."""
    try:
        return version("batchscope")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class OutboxCount:
    """How many notifications to ``receiver`` the outbox holds in ``state``."""

    receiver: str
    state: str
    count: int


@dataclass(frozen=True)
class ExporterSnapshot:
    """What one scrape exports, read at ``taken_at``.

    ``status`` holds the targets with their health now, each model's rates over the
    analysis window (``window_s``) and effective config, and the fresh device and
    process readings. ``latest_stats`` is the newest sample of each series whose
    newest sample is fresh and carries statistics (cumulative ``batch_stats``).
    ``findings`` are the active findings, ``recommendations`` the latest stored per
    (target, model). ``alerts`` are those pending or firing; ``outbox`` counts every
    state for each receiver the outbox names (0 where it holds none)."""

    taken_at: float
    window_s: float
    status: StatusReport
    latest_stats: tuple[ModelSample, ...]
    findings: tuple[StoredFinding, ...]
    recommendations: tuple[StoredRecommendation, ...]
    version: str
    alerts: tuple[AlertState, ...] = ()
    outbox: tuple[OutboxCount, ...] = ()


def take_snapshot(
    store: Store, *, window_s: float, now: float | None = None, version: str = ""
) -> ExporterSnapshot:
    """Read the store once for one scrape, judged at ``now`` (default: the clock)."""
    now = time.time() if now is None else now
    status = build_status(store, window_s=window_s, now=now)
    return ExporterSnapshot(
        taken_at=now,
        window_s=window_s,
        status=status,
        latest_stats=_latest_fresh_stats(store, status, now),
        findings=tuple(store.active_findings()),
        recommendations=tuple(store.latest_recommendations()),
        version=version or batchscope_version(),
        alerts=tuple(s for s in store.alert_states() if s.state in ACTIVE_ALERT_STATES),
        outbox=_outbox_counts(store),
    )


def _outbox_counts(store: Store) -> tuple[OutboxCount, ...]:
    """Every (receiver, state) the outbox names, each state of each receiver present,
    so that a query for dead notifications reads 0 rather than nothing."""
    counts = store.notification_counts()
    receivers = sorted({receiver for receiver, _ in counts})
    return tuple(
        OutboxCount(receiver, state, counts.get((receiver, state), 0))
        for receiver in receivers
        for state in NOTIFICATION_STATES
    )


def _latest_fresh_stats(store: Store, status: StatusReport, now: float) -> tuple[ModelSample, ...]:
    """The newest sample with statistics of each series whose newest sample is fresh by
    its target's scrape interval (the one freshness rule of ``analysis.health``). The
    statistics may be read less often than the metrics (``statistics_interval_s``), so
    they are looked for that much further back."""
    intervals = {
        t.name: scrape_interval_s(t.target) for t in status.targets if t.target.kind == TRITON_KIND
    }
    if not intervals:
        return ()
    since = now - max(stale_after_s(i) for i in intervals.values())
    fresh = {
        (m.target, m.model, m.version)
        for m in status.models
        if is_fresh(m.last_sample_at, now, intervals.get(m.target, scrape_interval_s(None)))
    }
    with_statistics = store.newest_model_samples(
        since=since - MAX_STATISTICS_INTERVAL_S, until=now, with_statistics=True
    )
    return tuple(
        sorted(
            (s for s in with_statistics if (s.target, s.model, s.version) in fresh),
            key=lambda s: (s.target, s.model, s.version),
        )
    )
