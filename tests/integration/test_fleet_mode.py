"""Fleet mode on a real Prometheus scraping a real Triton: the same figures as scraping
Triton directly.

One CPU testbed (the dynamically batched model), one Debian ``prometheus`` scraping its
metrics endpoint every second, and two collectors at a 1 s interval side by side, each
into its own SQLite store: one scraping Triton directly (the ``triton`` source), one
reading Prometheus's HTTP API (the ``prometheus`` source). Under a steady closed-loop
load, ``build_status`` over the same window of each store gives the same average batch
size and queue share, within 5 %; Triton's target in the fleet store is up by
Prometheus's ``up`` series. ``pytest -s`` prints the figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collector.analysis.health import HealthState
from collector.analysis.status import build_status
from collector.config import Settings, target_from_url
from collector.records import ModelRates
from collector.scheduler import CollectorService
from collector.sources.base import Source
from collector.sources.prometheus import PrometheusSource
from collector.sources.triton import TritonSource
from collector.store import Store
from collector.testbed.load import run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TritonServer
from tests.integration.prometheus_server import PrometheusServer, ScrapeJob, host_port
from tests.support import wait_until

pytestmark = pytest.mark.integration

MODEL = "batched"
INTERVAL_S = 1.0
LOAD_S = 14.0
# The compared window starts this long after the load did (its first scrapes) and ends
# one interval before the load does.
WARM_UP_S = 2.0
CONCURRENCY = 8
TOLERANCE = 0.05


@pytest.fixture
def triton(triton_factory: Callable[..., TritonServer]) -> TritonServer:
    (batched,) = [spec for spec in BATCHED_AND_UNBATCHED if spec.name == MODEL]
    return triton_factory([batched])


@pytest.fixture
def prometheus(triton: TritonServer, tmp_path: Path) -> Iterator[PrometheusServer]:
    job = ScrapeJob("triton", (host_port(triton.metrics_url),))
    with PrometheusServer(tmp_path / "prometheus", [job], interval_s=INTERVAL_S) as prom:
        yield prom


def _collector(db_url: str, source: Source) -> tuple[Store, CollectorService]:
    settings = Settings(db_url=db_url, interval_s=INTERVAL_S, jitter_s=0.0)
    store = Store(db_url)
    store.open()
    return store, CollectorService(settings, store, [source])


def _has_sample_after(store: Store, at: float) -> Callable[[], bool]:
    return lambda: (store.latest_collected_at() or 0.0) > at


def _rates(store: Store, window_s: float, now: float) -> tuple[str, ModelRates]:
    report = build_status(store, window_s=window_s, now=now)
    (status,) = [m for m in report.models if m.model == MODEL]
    assert status.rates is not None, f"no rates for {MODEL} in {store}"
    return status.target, status.rates


def test_fleet_mode_gives_the_figures_of_direct_scraping(
    triton: TritonServer, prometheus: PrometheusServer, tmp_path: Path
) -> None:
    target = target_from_url(triton.http_url, triton.metrics_url)
    direct_store, direct = _collector(f"sqlite:///{tmp_path / 'direct.db'}", TritonSource(target))
    fleet_store, fleet = _collector(
        f"sqlite:///{tmp_path / 'fleet.db'}",
        PrometheusSource(prometheus.url, interval_s=INTERVAL_S, timeout_s=2.0),
    )
    try:
        direct.start()
        fleet.start()
        for store in (direct_store, fleet_store):
            wait_until(_has_sample_after(store, 0.0), 15, f"a first sample in {store}")
        started = time.time()
        result = run_load(triton.grpc_url, MODEL, concurrency=CONCURRENCY, duration_s=LOAD_S)
        ended = time.time()
        assert result.errors == 0, result.error_samples
        now = ended - INTERVAL_S
        # Prometheus's newest sample lags its scrape by up to an interval.
        for store in (direct_store, fleet_store):
            wait_until(_has_sample_after(store, now), 10, f"a sample after the load in {store}")
    finally:
        direct.shutdown()
        fleet.shutdown()
    window_s = now - (started + WARM_UP_S)
    try:
        direct_target, ours = _rates(direct_store, window_s, now)
        fleet_target, theirs = _rates(fleet_store, window_s, now)
        healths = {t.name: t.health for t in build_status(fleet_store, now=now).targets}
    finally:
        direct_store.close()
        fleet_store.close()
    compared = {
        "average batch size": (ours.avg_batch_size, theirs.avg_batch_size),
        "queue share": (ours.queue_share, theirs.queue_share),
        "requests/s": (ours.requests_per_s, theirs.requests_per_s),
    }
    lines = [f"window {window_s:.1f} s; direct {direct_target!r}, fleet {fleet_target!r}"]
    for name, (a, b) in compared.items():
        assert a is not None and b is not None, f"{name}: direct {a}, fleet {b}"
        lines.append(f"{name}: direct {a:.5g}, fleet {b:.5g}, difference {abs(a - b) / a:.2%}")
    report = "\n".join(lines)
    print("\n" + report)
    assert fleet_target == host_port(triton.metrics_url)
    # Prometheus's up says the Triton is up; the Prometheus itself is a target too.
    assert healths[fleet_target].state is HealthState.UP, healths
    assert healths["prometheus"].state is HealthState.UP, healths
    assert ours.avg_batch_size is not None and ours.avg_batch_size > 2, report
    for name in ("average batch size", "queue share"):
        a, b = compared[name]
        assert b == pytest.approx(a, rel=TOLERANCE), report
