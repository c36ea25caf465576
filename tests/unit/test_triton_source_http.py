"""TritonSource against a tiny real HTTP server that serves the fixtures and misbehaves
on demand (stalls, drips, garbles, overflows, fails, closes early).

The server runs in a thread on a port the OS picks, one per test, and is stopped in
teardown; every handler that waits does so on the server's stop event, so teardown is
immediate. The binding socket is listening before the constructor returns, so no test
waits for readiness.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from collector.config import Settings, TargetSettings
from collector.errors import (
    ParseError,
    ResponseTooLarge,
    TargetDown,
    TargetHTTPError,
    TargetTimeout,
)
from collector.sources import SOURCES
from collector.sources.triton import (
    TritonSource,
    parse_metrics,
    parse_model_config,
    parse_model_stats,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"
TIMEOUT_S = 0.3  # for the timeout tests: short, so they stay fast
GENEROUS_TIMEOUT_S = 5.0  # for everything else: no flakes on a loaded machine

Behaviour = Callable[["_Handler"], None]


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


# --------------------------------------------------------------------------- the server


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Behaviour] = {}
        self.hits: list[str] = []
        self.peers: set[tuple[str, int]] = set()  # one per TCP connection
        self.stop = threading.Event()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The client hanging up on a stalled or dripping handler is the point of those
        # tests, not an error worth a traceback.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Triton's server does
    # Headers and body go out in separate writes; with Nagle on, a reused connection
    # waits for the client's delayed ACK (~40 ms) on every response.
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.hits.append(self.path)
        self.server.peers.add(self.client_address)
        behaviour = self.server.routes.get(self.path)
        if behaviour is None:
            send(self, 404, b'{"error":"unknown path"}', "application/json")
        else:
            behaviour(self)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def send(h: _Handler, status: int, body: bytes, content_type: str = "application/json") -> None:
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def ok(body: bytes, content_type: str = "application/json") -> Behaviour:
    return lambda h: send(h, 200, body, content_type)


def status(code: int, body: bytes) -> Behaviour:
    return lambda h: send(h, code, body)


def stall(seconds: float, then: Behaviour) -> Behaviour:
    def behaviour(h: _Handler) -> None:
        if not h.server.stop.wait(seconds):
            then(h)

    return behaviour


def drip(body: bytes, interval_s: float) -> Behaviour:
    """Headers at once, then the body one byte per interval: every single read is quick,
    only a total deadline stops it."""

    def behaviour(h: _Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.flush()
        for i in range(len(body)):
            if h.server.stop.wait(interval_s):
                return
            h.wfile.write(body[i : i + 1])
            h.wfile.flush()

    return behaviour


def unsized(body: bytes) -> Behaviour:
    """A body without Content-Length, ended by closing the connection."""

    def behaviour(h: _Handler) -> None:
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)
        h.close_connection = True

    return behaviour


def chunked(body: bytes, size: int) -> Behaviour:
    """Transfer-Encoding: chunked, as a streaming server sends a body of unknown size."""

    def behaviour(h: _Handler) -> None:
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for i in range(0, len(body), size):
            part = body[i : i + size]
            h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        h.wfile.write(b"0\r\n\r\n")

    return behaviour


def cut_short(body: bytes) -> Behaviour:
    """Declares the whole body, sends half of it, then hangs up."""

    def behaviour(h: _Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body[: len(body) // 2])
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)

    return behaviour


def healthy_routes() -> dict[str, Behaviour]:
    return {
        "/v2": ok(fixture_bytes("server_metadata.json")),
        "/metrics": ok(fixture_bytes("metrics_gpu.txt"), "text/plain; charset=utf-8"),
        "/v2/models/stats": ok(fixture_bytes("stats_two_models.json")),
        "/v2/models/resnet50/config": ok(fixture_bytes("config_resnet50.json")),
        "/v2/models/text_encoder/config": ok(fixture_bytes("config_text_encoder.json")),
    }


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    srv.routes.update(healthy_routes())
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield srv
    finally:
        srv.stop.set()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


class FakeClock:
    def __init__(self, now: float = 1_764_690_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def target_for(srv: _Server) -> TargetSettings:
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    return TargetSettings(name="triton-test", url=base, metrics_url=f"{base}/metrics")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def source(server: _Server, clock: FakeClock) -> Iterator[TritonSource]:
    src = TritonSource(target_for(server), timeout_s=GENEROUS_TIMEOUT_S, clock=clock)
    yield src
    src.close()


@pytest.fixture
def impatient_source(server: _Server) -> Iterator[TritonSource]:
    src = TritonSource(target_for(server), timeout_s=TIMEOUT_S)
    yield src
    src.close()


def config_hits(srv: _Server) -> list[str]:
    return [p for p in srv.hits if p.endswith("/config")]


# --------------------------------------------------------------------------- happy path


def test_collect_returns_one_full_snapshot(source: TritonSource, server: _Server) -> None:
    (snap,) = source.collect()
    assert snap.target == "triton-test"
    assert snap.collected_at == 1_764_690_000.0
    assert snap.server_version == "2.52.0"
    metrics = parse_metrics(fixture_bytes("metrics_gpu.txt").decode())
    assert snap.model_metrics == metrics.models
    assert snap.gpus == metrics.gpus and len(snap.gpus) == 2
    assert snap.server == metrics.server
    assert snap.model_stats == parse_model_stats(fixture_bytes("stats_two_models.json"))
    assert snap.model_configs == (
        parse_model_config(fixture_bytes("config_resnet50.json").decode()),
        parse_model_config(fixture_bytes("config_text_encoder.json").decode()),
    )
    assert snap.partial_errors == {}
    assert sorted(set(server.hits)) == sorted(healthy_routes())


def test_connections_are_reused_across_collections(source: TritonSource, server: _Server) -> None:
    for _ in range(3):
        (snap,) = source.collect()
        assert snap.server_version == "2.52.0"
    # 9 requests (the version once, 3 x metrics and stats, 2 configs once), one TCP
    # connection: a fully read body hands its connection back to the pool.
    assert len(server.hits) == 9
    assert len(server.peers) == 1


def test_chunked_body_is_read_whole(source: TritonSource, server: _Server) -> None:
    server.routes["/metrics"] = chunked(fixture_bytes("metrics_gpu.txt"), 4096)
    (snap,) = source.collect()
    assert snap.model_metrics == parse_metrics(fixture_bytes("metrics_gpu.txt").decode()).models


def test_huge_chunked_body_is_cut(server: _Server) -> None:
    server.routes["/metrics"] = chunked(b"# padding\n" * 100_000, 8192)  # 1 MB
    src = TritonSource(target_for(server), timeout_s=GENEROUS_TIMEOUT_S, max_response_bytes=100_000)
    with pytest.raises(ResponseTooLarge):
        src.collect()
    src.close()


def test_configs_are_cached_and_refreshed_on_schedule(server: _Server, clock: FakeClock) -> None:
    source = TritonSource(
        target_for(server), timeout_s=GENEROUS_TIMEOUT_S, clock=clock, config_refresh_s=100.0
    )
    source.collect()
    source.collect()
    assert len(config_hits(server)) == 2  # one per model, not per collection
    clock.now += 99.0
    source.collect()
    assert len(config_hits(server)) == 2
    # Each model's safety refresh falls between 100 and 150 s after its fetch, at its
    # own time, so a target's models are not refetched all in one collection.
    refreshed_at: dict[str, float] = {}
    while clock.now < 1_764_690_000.0 + 151.0:
        clock.now += 1.0
        server.hits.clear()
        (snap,) = source.collect()
        for hit in config_hits(server):
            refreshed_at.setdefault(hit.split("/")[3], clock.now - 1_764_690_000.0)
        assert [c.model for c in snap.model_configs] == ["resnet50", "text_encoder"]
    source.close()
    assert sorted(refreshed_at) == ["resnet50", "text_encoder"]
    assert all(100.0 <= t <= 150.0 for t in refreshed_at.values()), refreshed_at
    assert refreshed_at["resnet50"] != refreshed_at["text_encoder"]


def test_the_version_is_read_once_then_after_a_failure_or_a_restart(
    source: TritonSource, server: _Server
) -> None:
    def version_hits() -> int:
        return server.hits.count("/v2")

    source.collect()
    source.collect()
    assert version_hits() == 1
    # The server went away: the collection fails, and the next one reads the version.
    server.routes["/metrics"] = status(503, b"starting")
    with pytest.raises(TargetHTTPError):
        source.collect()
    server.routes["/metrics"] = ok(fixture_bytes("metrics_gpu.txt"))
    server.routes["/v2"] = ok(b'{"name":"triton","version":"2.53.0"}')
    (snap,) = source.collect()
    assert snap.server_version == "2.53.0" and version_hits() == 2
    (snap,) = source.collect()
    assert snap.server_version == "2.53.0" and version_hits() == 2
    # Counters went down (a restart between two collections): read it again.
    server.routes["/v2"] = ok(b'{"name":"triton","version":"2.54.0"}')
    server.routes["/v2/models/stats"] = ok(
        fixture_bytes("stats_two_models.json").replace(
            b'"inference_count":4400,"execution_count":550',
            b'"inference_count":8,"execution_count":1',
        )
    )
    (snap,) = source.collect()
    assert snap.server_version == "2.54.0" and version_hits() == 3


def test_a_model_whose_versions_changed_has_the_version_read_again(
    source: TritonSource, server: _Server
) -> None:
    # A new version replacing the old one, counters not lower: a reload all the same,
    # perhaps on a server that was replaced, so its version is read again.
    source.collect()
    assert server.hits.count("/v2") == 1
    server.routes["/v2"] = ok(b'{"name":"triton","version":"2.55.0"}')
    server.routes["/v2/models/stats"] = ok(
        fixture_bytes("stats_two_models.json").replace(
            b'"name":"resnet50","version":"1"', b'"name":"resnet50","version":"2"'
        )
    )
    (snap,) = source.collect()
    assert snap.server_version == "2.55.0" and server.hits.count("/v2") == 2
    (snap,) = source.collect()
    assert server.hits.count("/v2") == 2


def test_a_counter_going_down_refetches_that_models_config(
    source: TritonSource, server: _Server
) -> None:
    source.collect()
    # resnet50 reloaded: its statistics start again from (nearly) zero.
    server.routes["/v2/models/stats"] = ok(
        fixture_bytes("stats_two_models.json").replace(
            b'"inference_count":4400,"execution_count":550',
            b'"inference_count":8,"execution_count":1',
        )
    )
    server.hits.clear()
    source.collect()
    assert config_hits(server) == ["/v2/models/resnet50/config"]


def test_one_failing_config_is_a_partial_error(source: TritonSource, server: _Server) -> None:
    server.routes["/v2/models/text_encoder/config"] = status(
        400, b'{"error":"Request for unknown model: \'text_encoder\' is not found"}'
    )
    (snap,) = source.collect()
    assert [c.model for c in snap.model_configs] == ["resnet50"]
    assert list(snap.partial_errors) == ["config:text_encoder"]
    message = snap.partial_errors["config:text_encoder"]
    assert message.startswith("HTTP 400")
    assert "/v2/models/text_encoder/config" in message and "triton-test" in message
    assert "is not found" in message  # the server's own words, as an excerpt
    # The rest of the snapshot survives.
    assert len(snap.model_metrics) == 2 and len(snap.model_stats) == 2 and snap.gpus

    # Not cached as a failure: the next collection tries again and recovers.
    server.routes["/v2/models/text_encoder/config"] = ok(fixture_bytes("config_text_encoder.json"))
    (snap,) = source.collect()
    assert snap.partial_errors == {}
    assert [c.model for c in snap.model_configs] == ["resnet50", "text_encoder"]


def test_garbled_config_json_is_a_partial_parse_error(
    source: TritonSource, server: _Server
) -> None:
    server.routes["/v2/models/resnet50/config"] = ok(b'{"name":"resnet50","max_batch_size":')
    (snap,) = source.collect()
    assert [c.model for c in snap.model_configs] == ["text_encoder"]
    assert "unparseable model config" in snap.partial_errors["config:resnet50"]


def test_model_names_are_quoted_in_config_urls(source: TritonSource, server: _Server) -> None:
    stats = b'{"model_stats":[{"name":"a b/c","version":"1"}]}'
    server.routes["/v2/models/stats"] = ok(stats)
    server.routes["/v2/models/a%20b%2Fc/config"] = ok(b'{"name":"a b/c","max_batch_size":4}')
    (snap,) = source.collect()
    assert [(c.model, c.max_batch_size) for c in snap.model_configs] == [("a b/c", 4)]


# --------------------------------------------------------------------------- failures


def test_slow_response_times_out(impatient_source: TritonSource, server: _Server) -> None:
    server.routes["/metrics"] = stall(10.0, ok(b""))
    started = time.monotonic()
    with pytest.raises(TargetTimeout) as caught:
        impatient_source.collect()
    assert time.monotonic() - started < TIMEOUT_S + 1.0
    assert "/metrics" in str(caught.value) and "triton-test" in str(caught.value)


def test_slow_drip_body_hits_the_total_deadline(
    impatient_source: TritonSource, server: _Server
) -> None:
    # 400 bytes at one per 20 ms would take 8 s; no single read waits anywhere near the
    # read timeout, so only the per-request deadline can stop it.
    server.routes["/v2/models/stats"] = drip(fixture_bytes("stats_two_models.json")[:400], 0.02)
    started = time.monotonic()
    with pytest.raises(TargetTimeout) as caught:
        impatient_source.collect()
    elapsed = time.monotonic() - started
    # Far below the 8 s the drip would take; the margin is for a busy machine (0.81 s
    # was seen with a 0.3 s deadline).
    assert elapsed < TIMEOUT_S + 2.0
    assert "/v2/models/stats" in str(caught.value)


def test_garbled_metrics_is_a_parse_error(source: TritonSource, server: _Server) -> None:
    server.routes["/metrics"] = ok(b"<html><body>Service Unavailable</body></html>", "text/html")
    with pytest.raises(ParseError) as caught:
        source.collect()
    message = str(caught.value)
    assert "unparseable metrics" in message and "/metrics" in message and "triton-test" in message


def test_metrics_that_are_not_utf8_are_a_parse_error(source: TritonSource, server: _Server) -> None:
    server.routes["/metrics"] = ok(b'nv_inference_count{model="\xff\xfe"} 1\n', "text/plain")
    with pytest.raises(ParseError, match="not UTF-8"):
        source.collect()


def test_garbled_stats_json_is_a_parse_error(source: TritonSource, server: _Server) -> None:
    server.routes["/v2/models/stats"] = ok(b'{"model_stats":[{"name":')
    with pytest.raises(ParseError, match="unparseable model statistics.*/v2/models/stats"):
        source.collect()


def test_huge_body_with_content_length_is_refused_before_reading(server: _Server) -> None:
    server.routes["/metrics"] = ok(b"#" * 50_000, "text/plain")
    src = TritonSource(target_for(server), timeout_s=GENEROUS_TIMEOUT_S, max_response_bytes=10_000)
    with pytest.raises(ResponseTooLarge, match="50000 bytes exceeds the cap of 10000"):
        src.collect()
    src.close()


def test_huge_body_without_content_length_is_cut_while_streaming(server: _Server) -> None:
    server.routes["/metrics"] = unsized(b"# padding\n" * 200_000)  # 2 MB
    src = TritonSource(target_for(server), timeout_s=GENEROUS_TIMEOUT_S, max_response_bytes=100_000)
    with pytest.raises(ResponseTooLarge, match="exceeds the cap of 100000 bytes.*/metrics"):
        src.collect()
    src.close()


def test_body_at_exactly_the_cap_is_accepted(server: _Server) -> None:
    body = fixture_bytes("server_metadata.json")
    server.routes["/v2"] = unsized(body)
    server.routes["/v2/models/stats"] = ok(b'{"model_stats":[]}')
    server.routes["/metrics"] = ok(b"", "text/plain")
    src = TritonSource(
        target_for(server), timeout_s=GENEROUS_TIMEOUT_S, max_response_bytes=len(body)
    )
    (snap,) = src.collect()
    assert snap.server_version == "2.52.0"
    src.close()


def test_http_503_is_an_http_error_with_status_and_excerpt(
    source: TritonSource, server: _Server
) -> None:
    server.routes["/v2/models/stats"] = status(503, b"Server is not ready\n" + b"x" * 5000)
    with pytest.raises(TargetHTTPError) as caught:
        source.collect()
    assert caught.value.status == 503
    message = str(caught.value)
    assert message.startswith("HTTP 503")
    assert "/v2/models/stats" in message and "Server is not ready" in message
    assert len(message) < 400  # an excerpt, not the whole body


def test_connection_refused_is_target_down() -> None:
    # A socket that is bound but not listening refuses connections, and holding it
    # keeps the port from being reused by anything else while the test runs.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        src = TritonSource(
            TargetSettings(name="gone", url=base, metrics_url=f"{base}/metrics"),
            timeout_s=TIMEOUT_S,
        )
        with pytest.raises(TargetDown) as caught:
            src.collect()
        src.close()
    message = str(caught.value)
    assert "connection failed" in message and f"{base}/v2" in message and "'gone'" in message


def test_connection_closed_mid_body_is_target_down(source: TritonSource, server: _Server) -> None:
    server.routes["/metrics"] = cut_short(fixture_bytes("metrics_gpu.txt"))
    with pytest.raises(TargetDown, match="connection broken while reading.*/metrics"):
        source.collect()


# --------------------------------------------------------------------------- lifecycle


def test_close_closes_the_session(server: _Server) -> None:
    closed: list[bool] = []

    class RecordingSession(requests.Session):
        def close(self) -> None:
            closed.append(True)
            super().close()

    src = TritonSource(target_for(server), timeout_s=GENEROUS_TIMEOUT_S, session=RecordingSession())
    (snap,) = src.collect()  # the injected session is the one used
    assert snap.server_version == "2.52.0"
    src.close()
    assert closed == [True]


def test_registered_factory_builds_a_source_from_settings() -> None:
    spec = SOURCES["triton"]
    assert spec.per_target is True
    settings = Settings(timeout_s=1.5, max_response_bytes=4096, statistics_interval_s=7.0)
    target = TargetSettings(name="t", url="http://127.0.0.1:1", metrics_url="http://127.0.0.1:2/m")
    src = spec.factory(settings, target)
    try:
        assert isinstance(src, TritonSource)
        assert (src.name, src.target) == ("triton", "t")
        assert (src._http.timeout_s, src._http.max_response_bytes) == (1.5, 4096)
        assert src._statistics_interval_s == 7.0
    finally:
        src.close()


def test_statistics_are_read_every_statistics_interval(server: _Server, clock: FakeClock) -> None:
    """Metrics every collection; statistics once ``statistics_interval_s`` has passed (a
    tenth early), and at once after a failed collection. Between, a snapshot has no
    statistics and the configs last read."""
    source = TritonSource(
        target_for(server), timeout_s=GENEROUS_TIMEOUT_S, clock=clock, statistics_interval_s=5.0
    )

    def stats_hits() -> int:
        return server.hits.count("/v2/models/stats")

    read = []
    try:
        for _ in range(11):  # one a second, from 0 s to 10 s
            (snap,) = source.collect()
            read.append(bool(snap.model_stats))
            assert [c.model for c in snap.model_configs] == ["resnet50", "text_encoder"]
            assert snap.model_metrics
            clock.now += 1.0
        assert read == [True, False, False, False, False, True] + [False] * 4 + [True]
        assert stats_hits() == 3
        # A failed collection: the next one reads the statistics whatever the time.
        server.routes["/metrics"] = status(503, b"starting")
        with pytest.raises(TargetHTTPError):
            source.collect()
        server.routes["/metrics"] = ok(fixture_bytes("metrics_gpu.txt"))
        clock.now += 1.0
        (snap,) = source.collect()
        assert snap.model_stats and stats_hits() == 4
    finally:
        source.close()


def test_statistics_every_collection_without_an_interval(
    source: TritonSource, server: _Server
) -> None:
    for _ in range(3):
        (snap,) = source.collect()
        assert snap.model_stats
    assert server.hits.count("/v2/models/stats") == 3
