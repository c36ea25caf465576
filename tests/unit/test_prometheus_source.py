"""The ``prometheus`` source (fleet mode) against a tiny real HTTP server that answers
``/api/v1/query`` with recorded Prometheus API JSON, or misbehaves on demand.

``cpu_first.json`` / ``cpu_second.json`` are the fleet query's answers from a real
Prometheus scraping the CPU testbed under load, about two seconds apart.
``fleet_1.json`` / ``fleet_2.json`` are answers of the same shape for what the CPU
testbed cannot give: a GPU Triton with DCGM exporter's and batchscope exporter's series
beside it, a second Triton that goes down, a third whose queue family is missing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from collector.analysis.health import scrape_decides, target_up
from collector.config import Settings, target_from_url
from collector.errors import (
    CollectError,
    ConfigError,
    ParseError,
    ResponseTooLarge,
    TargetDown,
    TargetHTTPError,
    TargetTimeout,
)
from collector.records import ScrapeHealth, TritonSnapshot
from collector.scheduler import CollectorService
from collector.sources import SOURCES
from collector.sources.prometheus import PrometheusSource, fleet_query, selector_from_url
from collector.store import Store
from tests.support import free_port

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "prometheus_api"
CPU_INSTANCE = "127.0.0.1:45401"  # the testbed's metrics endpoint when it was recorded
TIMEOUT_S = 0.3


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


# --------------------------------------------------------------------------- the server


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.body = b""
        self.status = 200
        self.stall_s = 0.0
        self.queries: list[str] = []
        self.stop = threading.Event()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client hanging up on a stalled answer is the point of that test

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        parts = urlsplit(self.path)
        if parts.path != "/api/v1/query":
            self.send_error(404)
            return
        self.server.queries.append(parse_qs(parts.query)["query"][0])
        if self.server.stall_s:
            self.server.stop.wait(self.server.stall_s)
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def _source(url: str, **kwargs: Any) -> PrometheusSource:
    kwargs.setdefault("timeout_s", 5.0)
    return PrometheusSource(url, interval_s=1.0, **kwargs)


def _split(records: Any) -> tuple[dict[str, TritonSnapshot], dict[str, ScrapeHealth]]:
    snaps = {r.target: r for r in records if isinstance(r, TritonSnapshot)}
    healths = {r.target: r for r in records if isinstance(r, ScrapeHealth)}
    assert len(snaps) + len(healths) == len(records)
    return snaps, healths


def _answer(name: str) -> dict[str, Any]:
    return dict(json.loads(fixture(name)))


def _value(answer: dict[str, Any], name: str, **labels: str) -> float:
    (found,) = [
        float(r["value"][1])
        for r in answer["data"]["result"]
        if r["metric"].get("__name__") == name
        and all(r["metric"].get(k) == v for k, v in labels.items())
    ]
    return found


# --------------------------------------------------------------------------- mapping


def test_a_recorded_answer_gives_one_snapshot_per_triton_at_its_scrape_time(
    prom: _Server,
) -> None:
    prom.body = fixture("cpu_first.json")
    source = _source(prom.url)
    snaps, healths = _split(source.collect())
    assert len(prom.queries) == 1, "one query per collection"
    assert set(snaps) == set(healths) == {CPU_INSTANCE}
    snap, health = snaps[CPU_INSTANCE], healths[CPU_INSTANCE]
    # Stamped with the scrape's own time, not the query's evaluation time.
    assert snap.collected_at == health.scraped_at == 1796328827.383
    assert health.up and health.source == "prometheus" and health.error is None
    assert health.duration_s == pytest.approx(0.00146389)
    answer = _answer("cpu_first.json")
    by_model = {m.model: m for m in snap.model_metrics}
    assert set(by_model) == {"batched", "unbatched"}
    batched = by_model["batched"]
    for field, family in (
        ("inference_count", "nv_inference_count"),
        ("exec_count", "nv_inference_exec_count"),
        ("queue_duration_us", "nv_inference_queue_duration_us"),
        ("request_duration_us", "nv_inference_request_duration_us"),
    ):
        assert getattr(batched, field) == _value(answer, family, model="batched"), field
    assert batched.request_failure_by_reason.keys() >= {"BACKEND", "REJECTED"}
    assert snap.server is not None and snap.server.cpu_memory_total_bytes == 25276071936
    # Neither the statistics API nor the config API is read in fleet mode.
    assert snap.model_stats == () and snap.model_configs == () and snap.partial_errors == {}


def test_rates_in_the_store_are_over_the_time_between_scrapes(
    prom: _Server, tmp_path: Path
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'fleet.db'}")
    store.open()
    source = _source(prom.url)
    service = CollectorService(Settings(interval_s=1.0), store, [source])
    try:
        for name in ("cpu_first.json", "cpu_second.json", "cpu_second.json"):
            prom.body = fixture(name)
            assert service.run_source(source)
        samples = store.model_samples(target=CPU_INSTANCE)
        targets = {t.name: t for t in store.targets()}
    finally:
        store.close()
    batched = [s for s in samples if s.model == "batched"]
    # The repeated answer (no scrape since) stored nothing twice.
    assert [s.collected_at for s in batched] == [1796328827.383, 1796328829.383]
    rates = batched[1].rates
    assert rates is not None and rates.window_s == pytest.approx(2.0)
    first, second = _answer("cpu_first.json"), _answer("cpu_second.json")

    def delta(family: str) -> float:
        return _value(second, family, model="batched") - _value(first, family, model="batched")

    assert rates.avg_batch_size == pytest.approx(
        delta("nv_inference_count") / delta("nv_inference_exec_count")
    )
    assert rates.queue_share == pytest.approx(
        delta("nv_inference_queue_duration_us") / delta("nv_inference_request_duration_us")
    )
    assert rates.requests_per_s == pytest.approx(delta("nv_inference_request_success") / 2.0)
    # Prometheus's up made the Triton a target that is up; the Prometheus is a host.
    triton = targets[CPU_INSTANCE]
    assert triton.kind == "triton" and triton.up is True
    assert triton.last_seen_at == 1796328829.383 and triton.interval_s == pytest.approx(2.0)
    assert targets["prometheus"].kind == "host" and targets["prometheus"].up is True


def test_a_fleet_with_gpus_dcgm_the_exporter_a_gap_and_a_target_going_down(
    prom: _Server,
) -> None:
    source = _source(prom.url)
    prom.body = fixture("fleet_1.json")
    snaps, healths = _split(source.collect())
    assert set(snaps) == set(healths) == {"10.0.0.5:8002", "10.0.0.6:8002", "10.0.0.7:8002"}
    gpu_triton = snaps["10.0.0.5:8002"]
    (resnet,) = gpu_triton.model_metrics
    # Summed over the per-GPU series, as a scraped page is.
    assert (resnet.inference_count, resnet.exec_count) == (6000, 1000)
    assert resnet.request_failure_by_reason == {"BACKEND": 2}
    assert resnet.summary_quantiles_us == {
        "nv_inference_request_summary_us": {0.5: 3900.0, 0.95: 5200.0}
    }
    assert resnet.pending_request_count == 3
    # DCGM's SM activity joins the GPU Triton names; Triton's own utilization stays.
    (gpu,) = gpu_triton.gpus
    assert gpu.uuid == "GPU-a" and gpu.source == "triton"
    assert gpu.sm_active_pct == pytest.approx(42.0)
    assert gpu.utilization_gpu_pct == pytest.approx(50.0)
    assert gpu.memory_used_bytes == 4294967296 and gpu.power_w == 210.5
    # The exporter beside it (named by its HTTP port) gives batch_stats.
    (stats,) = gpu_triton.model_stats
    assert [(b.batch_size, b.exec_count) for b in stats.batch_stats] == [(4, 400), (8, 600)]
    assert stats.batch_stats[1].compute_ns == 1_900_000_000
    # A missing core family is said, and the rest stands.
    partial = snaps["10.0.0.7:8002"]
    assert partial.partial_errors == {
        "family:nv_inference_queue_duration_us": "not in Prometheus for this target"
    }
    (mlp,) = partial.model_metrics
    assert mlp.inference_count == 50
    # The DCGM and exporter jobs are not Tritons.
    assert not any(t.endswith((":9400", ":9108")) for t in (*snaps, *healths))

    prom.body = fixture("fleet_2.json")
    snaps, healths = _split(source.collect())
    # The second Triton's scrape failed: its series are gone, its up says so.
    assert set(snaps) == {"10.0.0.5:8002", "10.0.0.7:8002"}
    down = healths["10.0.0.6:8002"]
    assert not down.up and down.duration_s == 3.0
    assert down.error is not None and "10.0.0.6:8002" in down.error and "up is 0" in down.error
    assert healths["10.0.0.5:8002"].up
    assert healths["10.0.0.5:8002"].interval_s == pytest.approx(5.0)  # Prometheus's pace


def test_a_target_prometheus_stopped_scraping_is_forgotten(prom: _Server) -> None:
    source = _source(prom.url)
    prom.body = fixture("fleet_1.json")
    assert len(_split(source.collect())[0]) == 3
    prom.body = fixture("cpu_first.json")  # another fleet: the three are gone
    assert set(_split(source.collect())[0]) == {CPU_INSTANCE}
    assert source.collect() == []  # no newer scrape
    prom.body = fixture("fleet_1.json")  # back, as new targets (same scrape times)
    assert len(_split(source.collect())[0]) == 3


def test_configured_targets_lend_their_names_or_are_left_to_the_triton_source(
    prom: _Server,
) -> None:
    prom.body = fixture("cpu_first.json")
    target = target_from_url(
        "http://127.0.0.1:45400", f"http://{CPU_INSTANCE}/metrics", "cpu-testbed"
    )
    common = {"targets": [target], "prometheus_url": prom.url, "interval_s": 1.0}
    fleet_only = PrometheusSource.from_settings(Settings(**common, sources=("prometheus",)))
    snaps, healths = _split(fleet_only.collect())
    assert set(snaps) == set(healths) == {"cpu-testbed"}
    both = PrometheusSource.from_settings(Settings(**common, sources=("triton", "prometheus")))
    assert both.collect() == []  # scraped directly: not read twice


def test_with_the_triton_source_file_sd_targets_are_refused_not_read_twice(
    tmp_path: Path,
) -> None:
    listed = tmp_path / "fleet.json"
    listed.write_text('[{"targets": ["10.0.0.5:8000"]}]')
    common = {"prometheus_url": "http://p:9090", "file_sd": (str(listed),)}
    fleet_only = PrometheusSource.from_settings(Settings(**common, sources=("prometheus",)))
    assert fleet_only.name == "prometheus"
    with pytest.raises(ConfigError, match="file_sd.*--file-sd"):
        PrometheusSource.from_settings(Settings(**common, sources=("triton", "prometheus")))
    srv = {"prometheus_url": "http://p:9090", "dns_sd": ("_http._tcp.triton.test",)}
    with pytest.raises(ConfigError, match="dns_sd.*--dns-sd"):
        PrometheusSource.from_settings(Settings(**srv, sources=("triton", "prometheus")))


def test_shards_share_the_fleet_without_double_work(prom: _Server) -> None:
    prom.body = fixture("fleet_1.json")
    taken = [set(_split(_source(prom.url, shard=(i, 2)).collect())[0]) for i in range(2)]
    assert taken[0] | taken[1] == {"10.0.0.5:8002", "10.0.0.6:8002", "10.0.0.7:8002"}
    assert not taken[0] & taken[1]
    settings = Settings(prometheus_url=prom.url, shard="1/2")
    assert set(_split(PrometheusSource.from_settings(settings).collect())[0]) == taken[1]


def test_label_matchers_in_the_url_narrow_every_selector(prom: _Server) -> None:
    prom.body = fixture("cpu_first.json")
    _source(f"{prom.url}/?job=triton&namespace=~prod-.*").collect()
    (query,) = prom.queries
    assert query == fleet_query('job="triton",namespace=~"prod-.*"')
    assert query.count('job="triton",namespace=~"prod-.*"') == 3
    assert selector_from_url("https://p.example/prom/") == ("https://p.example/prom", "")
    with pytest.raises(ConfigError, match="prometheus_url"):
        selector_from_url("http://p:9090?bad-label=x")


def test_the_source_is_registered_and_needs_its_url() -> None:
    spec = SOURCES["prometheus"]
    assert not spec.per_target
    with pytest.raises(ConfigError, match="prometheus_url.*--prometheus"):
        spec.factory(Settings(sources=("prometheus",)), None)
    source = spec.factory(Settings(prometheus_url="http://p:9090"), None)
    assert source.name == source.target == "prometheus"


def test_prometheus_s_up_decides_a_triton_target() -> None:
    assert scrape_decides("triton", "prometheus")
    assert target_up("triton", {"prometheus": False, "host": True}) is False
    assert target_up("triton", {"prometheus": True, "triton": False}) is False
    assert target_up("triton", {"prometheus": True, "nvml": False}) is True


# --------------------------------------------------------------------------- failures


def test_a_prometheus_that_is_down_fails_the_collection() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TargetDown, match=f"GET {url}/api/v1/query \\(the fleet query\\)") as e:
        _source(url).collect()
    assert "query=" not in str(e.value), "the message names the endpoint, not the long query"


def test_a_slow_prometheus_times_out(prom: _Server) -> None:
    prom.body, prom.stall_s = fixture("cpu_first.json"), 5.0
    started = time.monotonic()
    with pytest.raises(TargetTimeout):
        _source(prom.url, timeout_s=TIMEOUT_S).collect()
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    ("body", "error", "match"),
    [
        (b"<html>proxy error</html>", ParseError, "not JSON"),
        (b'["success"]', ParseError, "not a Prometheus API answer"),
        (
            b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
            ParseError,
            "not an instant vector",
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}',
            ParseError,
            "malformed sample",
        ),
        (
            b'{"status":"error","errorType":"execution","error":"query timed out"}',
            CollectError,
            "answered 'error': execution: query timed out",
        ),
    ],
)
def test_an_answer_that_is_not_a_result_fails_with_a_clear_message(
    prom: _Server, body: bytes, error: type[Exception], match: str
) -> None:
    prom.body = body
    with pytest.raises(error, match=match) as caught:
        _source(prom.url).collect()
    assert prom.url in str(caught.value)


def test_an_error_status_carries_prometheus_s_reason(prom: _Server) -> None:
    prom.status = 422
    prom.body = b'{"status":"error","errorType":"execution","error":"too many samples"}'
    with pytest.raises(TargetHTTPError, match="HTTP 422.*too many samples"):
        _source(prom.url).collect()


def test_an_answer_over_the_cap_is_refused(prom: _Server) -> None:
    prom.body = fixture("fleet_1.json")
    with pytest.raises(ResponseTooLarge):
        _source(prom.url, max_response_bytes=1024).collect()
