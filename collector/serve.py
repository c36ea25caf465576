"""``batchscope serve``: collector, analysis, alerts and the web UI in one process.

The collector's scheduler scrapes every target and runs the detectors, the
recommender and the alert rules in its own threads; the outbox is delivered by a
thread of its own when receivers are configured (``alerts.runtime``); the dashboard
is served by waitress (a production WSGI server) on the same store. ``Service`` is
the one place that starts and stops them together, for the CLI, the demo and the
tests.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from alerts.runtime import AlertsInProcess
from collector.analysis.detect import detector_job, detector_settings
from collector.analysis.recommend import recommender_job
from collector.config import Settings
from collector.scheduler import CollectorService, build_sources, store_pool_size
from collector.store import Store
from collector.wsgi_server import BackgroundWsgiServer

__all__ = ["Service", "analysis_jobs", "every", "http_url"]

log = logging.getLogger("batchscope.serve")


def every(
    seconds: float, job: Callable[[Store, float], object]
) -> Callable[[Store, float], object]:
    """``job`` run at most once per ``seconds`` (the scheduler calls analyses more
    often: recommending costs a few CPU-seconds per model, detecting far less)."""
    last = [-float("inf")]

    def run_at_most_every(store: Store, now: float) -> object:
        if now - last[0] < seconds:
            return None
        last[0] = now
        return job(store, now)

    run_at_most_every.__name__ = getattr(job, "__name__", "job")
    return run_at_most_every


def analysis_jobs(
    settings: Settings, alerts: AlertsInProcess
) -> list[Callable[[Store, float], object]]:
    """What runs after the scrapes, in order: the detectors, the recommender (at most
    every ``recommend_every_s``), then the alert rules — last, so that a firing alert
    reads this pass's findings and recommendation (the fix it carries)."""
    return [
        detector_job(detector_settings(settings.analysis)),
        every(settings.recommend_every_s, recommender_job(settings.slo_p95_ms)),
        *alerts.jobs,
    ]


def http_url(host: str, port: int) -> str:
    """The URL of a server listening on ``host:port`` (an IPv6 address bracketed)."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


class Service:
    """The collector (with detectors and recommender) and the dashboard over one
    store. ``start()`` returns once the UI listens; ``url`` is where."""

    def __init__(
        self,
        settings: Settings,
        *,
        host: str = "127.0.0.1",
        port: int = 8050,
        refresh_s: float = 5.0,
        threads: int = 8,
    ) -> None:
        from dashboard.actions import ConfigActions
        from dashboard.app import create_app

        self.settings = settings
        # The one store (one engine) of the process: collector, analyses, UI and Apply.
        # Its pool: the collector's threads, the UI's and the alerts' delivery.
        self.store = Store(
            settings.db_url, pool_size=store_pool_size(settings, other_threads=threads + 1)
        )
        self.alerts = AlertsInProcess(self.store, settings)
        self.collector = CollectorService(
            settings,
            self.store,
            build_sources(settings),
            analyses=analysis_jobs(settings, self.alerts),
        )
        self.actions = ConfigActions(self.store, settings.targets, apply=settings.ui_apply)
        self.app = create_app(
            self.store,
            actions=self.actions,
            refresh_s=refresh_s,
            ui=settings.ui,
            host=host,
            slo_p95_ms=settings.slo_p95_ms,
        )
        self._host, self._port, self._threads = host, port, threads
        self._server: BackgroundWsgiServer | None = None

    @property
    def url(self) -> str:
        port = self._server.port if self._server is not None else self._port
        return http_url(self._host, port)

    def start(self) -> None:
        from dashboard.app import waitress_options

        self.collector.start()
        self.alerts.start()
        self._server = BackgroundWsgiServer(
            self.app.server,
            host=self._host,
            port=self._port,
            threads=self._threads,
            name="ui",
            ident="batchscope",
            **waitress_options(self.settings.ui),
        )
        self._server.start()

    def run(self, stop: threading.Event, duration_s: float | None = None) -> None:
        """Start, wait for ``stop`` (or ``duration_s``), then stop everything."""
        self.start()
        try:
            stop.wait(duration_s)
        finally:
            self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.collector.shutdown()
        self.alerts.stop()  # after the last evaluation; what it left pending is kept
        self.actions.close()  # an Apply not yet verified is rolled back
        self.store.close()

    def __enter__(self) -> Service:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
