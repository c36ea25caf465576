"""The scheduler: a stalled target never delays a healthy one, failures are recorded
with their kind and retried with backoff, and counters become stored rates."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from collector.analysis.rates import rates_between
from collector.config import Settings, target_from_url
from collector.records import HostFacts, ProcessSample
from collector.scheduler import CollectorService
from collector.sources.triton import TritonSource
from collector.store import Store

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"
ROUTES = {
    "/v2": "server_metadata.json",
    "/metrics": "metrics_gpu.txt",
    "/v2/models/stats": "stats_two_models.json",
    "/v2/models/resnet50/config": "config_resnet50.json",
    "/v2/models/text_encoder/config": "config_text_encoder.json",
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # noqa: N802
        name = ROUTES.get(self.path)
        body = (FIXTURES / name).read_bytes() if name else b'{"error":"not found"}'
        self.send_response(200 if name else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def healthy_url() -> Iterator[str]:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()  # pytest runs this after the test, passed or failed


@pytest.fixture
def stalled_url() -> Iterator[str]:
    """Accepts TCP connections (the kernel's backlog) but never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_stalled_target_does_not_delay_the_healthy_one(
    tmp_path: Path, healthy_url: str, stalled_url: str
) -> None:
    interval = 0.25
    healthy = target_from_url(healthy_url, healthy_url + "/metrics", name="healthy")
    stalled = target_from_url(stalled_url, stalled_url + "/metrics", name="stalled")
    settings = Settings(
        targets=(healthy, stalled),
        db_url=f"sqlite:///{tmp_path}/s.db",
        interval_s=interval,
        timeout_s=1.5,
        jitter_s=0.0,
        backoff_max_s=0.5,
    )
    store = Store(settings.db_url)
    sources = [TritonSource(t, timeout_s=settings.timeout_s) for t in settings.targets]
    service = CollectorService(settings, store, sources)
    try:
        service.run(duration_s=3.2)
        samples = store.model_samples(target="healthy", model="resnet50")
        times = [s.collected_at for s in samples]
        assert len(times) >= 8, times
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        # The stalled target's 1.5 s timeouts never hold the healthy one back.
        assert max(gaps) < 3 * interval, gaps
        states = {t.name: t for t in store.targets()}
        assert states["healthy"].up is True
        assert states["stalled"].up is False
        assert states["stalled"].last_error_kind == "timeout"
        assert "'stalled'" in (states["stalled"].last_error or "")  # the message names it
        # Counters did not move between scrapes: stored rates are zero, not missing.
        rated = [s.rates for s in samples if s.rates is not None]
        assert rated and all(r.requests_per_s == 0.0 for r in rated)
        assert samples[-1].stats is not None and samples[-1].stats.batch_stats
    finally:
        store.close()


def test_dead_target_backs_off_exponentially(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now: connection refused
    dead = target_from_url(f"http://127.0.0.1:{port}", name="dead")
    settings = Settings(
        targets=(dead,), db_url=f"sqlite:///{tmp_path}/d.db", interval_s=1.0, backoff_max_s=8.0
    )
    store = Store(settings.db_url)
    now = [1000.0]
    source = TritonSource(dead, timeout_s=0.5)
    service = CollectorService(settings, store, [source], clock=lambda: now[0])
    try:
        attempts = []
        for _ in range(24):  # one simulated scheduler tick per interval
            before = service.health(source).attempts
            service.run_source(source)
            if service.health(source).attempts > before:
                attempts.append(now[0])
            now[0] += 1.0
        state = store.targets()[0]
        assert state.up is False and state.last_error_kind == "down"
        assert state.consecutive_failures == len(attempts)
        gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
        assert gaps == [1.0, 2.0, 4.0, 8.0, 8.0], gaps  # doubling, capped at backoff_max_s
    finally:
        store.close()
        source.close()


class _HostLike:
    """A host source stand-in: one tick of process readings and the host's facts."""

    name = "host"
    target = "triton-a"

    def collect(self) -> list[ProcessSample | HostFacts]:
        return [
            ProcessSample(source="host", pid=42, role="server", cpu_pct=150.0),
            HostFacts(target=self.target, collected_at=1000.0, cpu_count=12),
        ]

    def close(self) -> None:
        pass


def test_host_facts_and_processes_are_stored_per_target(tmp_path: Path) -> None:
    settings = Settings(db_url=f"sqlite:///{tmp_path}/h.db", interval_s=1.0)
    store = Store(settings.db_url)
    service = CollectorService(settings, store, [_HostLike()], clock=lambda: 1000.0)
    try:
        assert service.run_source(_HostLike())
        assert store.host_facts("triton-a") == HostFacts("triton-a", 1000.0, 12)
        [process] = store.process_samples(target="triton-a")
        assert (process.target, process.sample.pid) == ("triton-a", 42)
    finally:
        store.close()


def test_stored_rates_come_from_the_rates_module(tmp_path: Path, healthy_url: str) -> None:
    """What the scheduler stores per scrape is ``rates_between`` of the two scrapes."""
    target = target_from_url(healthy_url, healthy_url + "/metrics", name="triton-a")
    settings = Settings(targets=(target,), db_url=f"sqlite:///{tmp_path}/r.db", interval_s=1.0)
    store = Store(settings.db_url)
    now = [1000.0]
    source = TritonSource(target, timeout_s=2.0)
    service = CollectorService(settings, store, [source], clock=lambda: now[0])
    try:
        service.run_source(source)
        now[0] += 5.0
        service.run_source(source)
        samples = store.model_samples(model="resnet50")
        assert len(samples) == 2 and samples[0].rates is None
        instances = store.latest_model_configs()[("triton-a", "resnet50")].config.instance_count
        # Both scrapes read the same fixture, so the counters stand still; the stored
        # rates are exactly what the rates module makes of the pair.
        expected = rates_between(
            replace(samples[0], rates=None),
            replace(samples[1], rates=None),
            instance_count=instances,
        )
        assert samples[1].rates == expected
    finally:
        store.close()
        source.close()


def test_a_run_writes_down_where_each_triton_is_scraped(healthy_url: str, tmp_path: Path) -> None:
    target = target_from_url(healthy_url, f"{healthy_url}/metrics", name="served")
    settings = Settings(targets=(target,), db_url=f"sqlite:///{tmp_path}/e.db", interval_s=1.0)
    store = Store(settings.db_url)
    service = CollectorService(settings, store, [TritonSource(target, timeout_s=2.0)])
    try:
        assert service.run_source(service.sources[0])
        [state] = store.targets()
        assert (state.name, state.url, state.metrics_url) == (
            "served",
            healthy_url,
            f"{healthy_url}/metrics",
        )
    finally:
        store.close()
