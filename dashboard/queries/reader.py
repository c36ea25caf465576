"""``DashboardQueries``: every read the pages make, over the one ``Store`` of the
process, each answering with a view (``dashboard.queries.views``) and never raising
on a database failure: the view carries ``error`` (a one-line message for the
banner) and the exception is logged."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy.exc import SQLAlchemyError

from collector.analysis.health import target_healths
from collector.errors import ConfigError
from collector.store import Store, StoredFinding
from dashboard.queries import model as model_parts
from dashboard.queries.alerts import read_alerts
from dashboard.queries.devices import read_devices
from dashboard.queries.events import EventQuery, model_findings, read_events
from dashboard.queries.overview import read_overview
from dashboard.queries.series import series_and_distribution
from dashboard.queries.views import (
    AlertsView,
    BatchDistribution,
    DevicesView,
    EventsView,
    ModelDetail,
    ModelSeries,
    OverviewData,
    RecommendationView,
    ServiceTimeView,
    WhatIfView,
    parse_range,
    severity_rank,
)
from dashboard.queries.what_if import WhatIfCurves

__all__ = ["DashboardQueries"]

log = logging.getLogger("batchscope.dashboard")

_T = TypeVar("_T")


class DashboardQueries:
    """The dashboard's reads over ``store`` (owned by the caller, which closes it).

    A store whose database is down answers every read with an error line, and the
    next read tries again, so a dashboard started before its database answers comes
    up with a banner and recovers by itself. Safe to share between threads (each
    ``Store`` call has its own session).
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        slo_p95_ms: dict[str, float] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._what_if = WhatIfCurves(store, slo_p95_ms=slo_p95_ms)

    def _guard(self, what: str, read: Callable[[Store], _T], failed: Callable[[str], _T]) -> _T:
        try:
            return read(self._store)
        except (ConfigError, SQLAlchemyError, OSError) as err:
            log.warning("dashboard: %s failed: %s", what, _one_line(err), exc_info=True)
            return failed(_store_error(err))

    def overview(self, *, window_s: float = 60.0, now: float | None = None) -> OverviewData:
        """Every target, every model row and every device over the latest window."""
        at = self._clock() if now is None else now
        return self._guard(
            "overview",
            lambda store: read_overview(store, window_s=window_s, now=at),
            lambda error: OverviewData(generated_at=at, window_s=window_s, error=error),
        )

    # ------------------------------------------------------------------ one model

    def model_detail(
        self,
        target: str,
        model: str,
        *,
        range_name: str | None = None,
        now: float | None = None,
        max_points: int = 240,
    ) -> ModelDetail:
        """Everything a model page shows, from one pass over the store."""
        name, seconds = parse_range(range_name)
        until = self._clock() if now is None else now
        since = until - seconds

        def read(store: Store) -> ModelDetail:
            series, distribution = series_and_distribution(
                store, target, model, since, until, max_points=max_points
            )
            config = store.latest_model_configs(target).get((target, model))
            states = store.targets()  # judged at ``until`` (now), as the overview does
            healths = zip(states, target_healths(states, until), strict=True)
            up = next((h.up for t, h in healths if t.name == target), None)
            return ModelDetail(
                target=target,
                model=model,
                range_name=name,
                since=since,
                until=until,
                up=up,
                series=series,
                distribution=distribution,
                service_time=model_parts.service_time(
                    distribution, config.config.max_batch_size if config else None
                ),
                config=config,
                findings=model_findings(store, target, model, since),
                recommendation=model_parts.latest_recommendation(store, target, model),
            )

        return self._guard(
            f"model page of {model!r} on {target!r}",
            read,
            lambda error: ModelDetail(
                target=target, model=model, range_name=name, since=since, until=until, error=error
            ),
        )

    def model_series(
        self, target: str, model: str, *, since: float, until: float, max_points: int = 240
    ) -> ModelSeries:
        return self._guard(
            "model series",
            lambda s: series_and_distribution(
                s, target, model, since, until, max_points=max_points
            )[0],
            lambda _error: ModelSeries(0.0, "none"),
        )

    def batch_distribution(
        self, target: str, model: str, *, since: float, until: float
    ) -> BatchDistribution:
        return self._guard(
            "batch distribution",
            lambda s: series_and_distribution(s, target, model, since, until)[1],
            lambda _error: BatchDistribution(),
        )

    def service_time(
        self, target: str, model: str, *, since: float, until: float
    ) -> ServiceTimeView | None:
        def read(store: Store) -> ServiceTimeView | None:
            distribution = series_and_distribution(store, target, model, since, until)[1]
            config = store.latest_model_configs(target).get((target, model))
            return model_parts.service_time(
                distribution, config.config.max_batch_size if config else None
            )

        return self._guard("service time", read, lambda _error: None)

    def findings(self, target: str, model: str, *, since: float) -> list[StoredFinding]:
        return self._guard(
            "findings", lambda s: model_findings(s, target, model, since), lambda _error: []
        )

    def latest_recommendation(self, target: str, model: str) -> RecommendationView | None:
        return self._guard(
            "recommendation",
            lambda s: model_parts.latest_recommendation(s, target, model),
            lambda _error: None,
        )

    # ------------------------------------------------------------------ other pages

    def recommendations(self) -> tuple[list[RecommendationView], str | None]:
        """The latest recommendation of every model, the one whose model has the most
        severe open finding first, then changes before none; and an error line when
        the store could not be read."""

        def read(store: Store) -> tuple[list[RecommendationView], str | None]:
            worst = model_parts.worst_open_severity(store.active_findings())
            views = [
                model_parts.recommendation_view(r, worst.get((r.target, r.model)))
                for r in store.latest_recommendations()
            ]
            views.sort(
                key=lambda v: (
                    severity_rank(v.severity),
                    not v.changes,
                    v.stored.target,
                    v.stored.model,
                )
            )
            return views, None

        return self._guard("recommendations", read, lambda error: ([], error))

    def events(
        self,
        *,
        since_s: float = 7 * 24 * 3600.0,
        target: str | None = None,
        subject: str | None = None,
        kind: str | None = None,
        severity: str | None = None,
        state: str = "active",
        now: float | None = None,
    ) -> EventsView:
        """Findings (and, later, other events) matching the filters; ``state`` is
        ``active``, ``past`` or ``all``; past ones from the last ``since_s``."""
        at = self._clock() if now is None else now
        return self._guard(
            "events",
            lambda s: read_events(
                s,
                EventQuery(
                    since=at - since_s,
                    target=target,
                    subject=subject,
                    kind=kind,
                    severity=severity,
                    state=state,
                ),
            ),
            lambda error: EventsView(error=error),
        )

    def alerts(self, *, now: float | None = None) -> AlertsView:
        """Alert states, the silences in force and the notification outbox at ``now``."""
        at = self._clock() if now is None else now
        return self._guard(
            "alerts",
            lambda s: read_alerts(s, at),
            lambda error: AlertsView(generated_at=at, error=error),
        )

    def devices(
        self, *, range_name: str | None = None, now: float | None = None, max_points: int = 120
    ) -> DevicesView:
        """Utilisation of every GPU / MIG instance and model-instance process over a
        range, bucketed for a heatmap, with memory and power."""
        name, seconds = parse_range(range_name)
        until = self._clock() if now is None else now
        since = until - seconds
        return self._guard(
            "devices",
            lambda s: read_devices(s, since=since, until=until, name=name, max_points=max_points),
            lambda error: DevicesView(range_name=name, since=since, until=until, error=error),
        )

    def what_if(
        self,
        target: str,
        model: str,
        *,
        preferred: Sequence[int],
        instances: int,
        now: float | None = None,
    ) -> WhatIfView:
        """Predicted QPS and p95 over the max queue delays for ``preferred`` sizes and
        ``instances`` instances, at the load last observed for the model."""
        at = self._clock() if now is None else now
        return self._guard(
            f"what-if of {model!r}",
            lambda _s: self._what_if.curve(
                target, model, preferred=preferred, instances=instances, now=at
            ),
            lambda error: WhatIfView(
                target=target,
                model=model,
                preferred=sorted(set(preferred)),
                instances=instances,
                error=error,
            ),
        )


def _one_line(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def _store_error(err: BaseException) -> str:
    if isinstance(err, ConfigError):
        return f"the store cannot be opened: {_one_line(err)}"
    return f"the store is unreachable: {_one_line(err)}"
