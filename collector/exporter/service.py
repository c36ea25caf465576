"""The exporter sidecar: collector, analysis and ``/metrics`` in one process.

``Exporter`` runs the sources, the per-scrape rates, the detectors, the recommender
and the alert rules on the collector's scheduler, and delivers the alerts to the
receivers of its settings (as ``batchscope serve`` does, ``alerts.runtime``), over one
store, and serves through waitress:

* ``/metrics``: every family of ``collector.exporter.families``, from one snapshot of
  the store per scrape (``SnapshotCollector``), built ahead once per collector
  interval (``SnapshotKeeper``), on a registry of its own;
* ``/healthz``: 200 while the collector's scheduler runs;
* ``/readyz``: 503 with the reason until every Triton target has been scraped
  successfully, then 200 while they are up by the one freshness rule
  (``collector.analysis.health``);
* ``/``: a landing page linking the above and naming the targets.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from alerts.runtime import AlertsInProcess
from collector.analysis.detect import detector_settings
from collector.analysis.health import HealthState, target_healths
from collector.config import Settings
from collector.exporter.collectors import SnapshotCollector
from collector.exporter.keeper import SnapshotKeeper
from collector.exporter.snapshot import ExporterSnapshot, batchscope_version, take_snapshot
from collector.scheduler import CollectorService, build_sources, store_pool_size
from collector.serve import analysis_jobs, http_url
from collector.store import Store
from collector.wsgi_server import BackgroundWsgiServer

__all__ = ["DEFAULT_LISTEN_PORT", "Exporter", "Readiness"]

log = logging.getLogger("batchscope.exporter")

#: Prometheus's list of default exporter ports (9100-9999) is fully allocated; 9478 is
#: free on common hosts (9400 is DCGM exporter's) and configurable with --listen.
DEFAULT_LISTEN_PORT = 9478

_StartResponse = Callable[[str, list[tuple[str, str]]], Any]
_WsgiApp = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


@dataclass(frozen=True)
class Readiness:
    """Whether the exporter has something true to export, and why not."""

    ready: bool
    reason: str


class Exporter:
    """The sidecar over ``settings`` (targets, sources, interval, store). ``start()``
    binds ``host:port`` first (a taken port raises ``OSError`` before anything runs),
    then starts the collector and the HTTP server; ``close()`` stops both."""

    def __init__(self, settings: Settings, *, host: str, port: int, threads: int = 4) -> None:
        self.settings = settings
        # Its pool: the collector's threads, the HTTP server's, the snapshots' and the
        # alerts' delivery.
        self.store = Store(
            settings.db_url, pool_size=store_pool_size(settings, other_threads=threads + 2)
        )
        # The analysis gauges cover the detectors' window, so they match the findings.
        self.window_s = detector_settings(settings.analysis).window_s
        self.alerts = AlertsInProcess(self.store, settings)
        self.collector = CollectorService(
            settings,
            self.store,
            build_sources(settings),
            analyses=analysis_jobs(settings, self.alerts),
        )
        self.version = batchscope_version()
        # Built once per collector interval; served while younger than two (a build
        # takes well under an interval), so a scrape does not wait for the store.
        self.keeper = SnapshotKeeper(
            self.snapshot, period_s=settings.interval_s, max_age_s=2 * settings.interval_s
        )
        # A registry of its own: the process and platform collectors of the default
        # one describe this Python process, which Prometheus's own `up` and the
        # node's exporter already cover; they would only add series to every scrape.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            SnapshotCollector(
                self.keeper.current,
                store_writes=self.collector.store_buffer,
                version=self.version,
            )
        )
        self._host, self._port, self._threads = host, port, threads
        self._server: BackgroundWsgiServer | None = None
        self._keeper_thread: threading.Thread | None = None
        self._stop_keeper = threading.Event()
        self._running = False

    # ------------------------------------------------------------------ what it serves

    def snapshot(self, now: float | None = None) -> ExporterSnapshot:
        """One read of the store for the scrapes, judged at ``now`` (default: now)."""
        return take_snapshot(self.store, window_s=self.window_s, now=now, version=self.version)

    def healthy(self) -> bool:
        """Whether the collector's scheduler runs (it owns every scrape and analysis)."""
        return self._running and self.collector.running

    def readiness(self, now: float | None = None) -> Readiness:
        """Ready once every Triton target is up now (scraped, and lately)."""
        now = time.time() if now is None else now
        # Health only: readiness needs no machine facts (which judge_targets also reads).
        known = self.store.targets()
        states = {t.name: h for t, h in zip(known, target_healths(known, now), strict=True)}
        waiting = []
        for target in self.collector.targets:  # its shard, file_sd's included
            judged = states.get(target.name)
            if judged is None:
                waiting.append(f"{target.name}: not scraped yet")
            elif judged.state is not HealthState.UP:
                waiting.append(f"{target.name}: {judged.state} ({judged.reason})")
        if waiting:
            return Readiness(False, "; ".join(waiting))
        return Readiness(True, "every Triton target is up")

    @property
    def url(self) -> str:
        port = self._server.port if self._server is not None else self._port
        return http_url(self._host, port)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.store.open()  # a database that cannot be opened is one line now
        self._server = BackgroundWsgiServer(
            exporter_app(self),
            host=self._host,
            port=self._port,
            threads=self._threads,
            name="exporter",
            ident="batchscope-exporter",
        )
        self.collector.start()
        self.alerts.start()
        self._running = True
        self._server.start()
        self._keeper_thread = threading.Thread(
            target=self.keeper.run, args=(self._stop_keeper,), name="snapshots", daemon=True
        )
        self._keeper_thread.start()

    def close(self) -> None:
        self._running = False
        self._stop_keeper.set()
        if self._keeper_thread is not None:
            self._keeper_thread.join(timeout=10)
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.collector.shutdown()
        self.alerts.stop()
        self.store.close()

    def __enter__(self) -> Exporter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- HTTP


def exporter_app(exporter: Exporter) -> _WsgiApp:
    """The WSGI app: ``/metrics`` through prometheus-client (content negotiation,
    gzip, ``name[]`` filters), and the health and landing pages."""
    metrics_app = make_wsgi_app(exporter.registry)

    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            ok = exporter.healthy()
            return _text(start_response, ok, "ok" if ok else "collector not running")
        if path == "/readyz":
            readiness = exporter.readiness()
            return _text(start_response, readiness.ready, readiness.reason)
        if path == "/":
            return _page(start_response, landing_page(exporter))
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found; see /\n"]

    return app


def _text(start_response: _StartResponse, ok: bool, body: str) -> list[bytes]:
    status = "200 OK" if ok else "503 Service Unavailable"
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [f"{body}\n".encode()]


def _page(start_response: _StartResponse, body: str) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
    return [body.encode()]


def landing_page(exporter: Exporter) -> str:
    """A small HTML page: what this is, its endpoints, and the targets it watches."""
    targets = "".join(
        f"<li>{html.escape(t.name)}: <a href='{html.escape(t.url)}'>{html.escape(t.url)}</a>"
        f" (metrics <a href='{html.escape(t.metrics_url)}'>{html.escape(t.metrics_url)}</a>)"
        "</li>"
        for t in exporter.settings.targets
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<title>batchscope exporter</title></head><body>"
        f"<h1>batchscope exporter {html.escape(exporter.version)}</h1>"
        "<p>Batch sizes, analysis, findings and recommendations for Prometheus.</p><ul>"
        "<li><a href='metrics'>/metrics</a>: the exposition</li>"
        "<li><a href='healthz'>/healthz</a>: 200 while the collector runs</li>"
        "<li><a href='readyz'>/readyz</a>: 200 while every Triton target is up</li>"
        f"</ul><h2>Targets</h2><ul>{targets}</ul>"
        f"<p>Scraped every {exporter.settings.interval_s:g} s; analysis window "
        f"{exporter.window_s:g} s.</p></body></html>\n"
    )
