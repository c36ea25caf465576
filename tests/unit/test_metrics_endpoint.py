"""Where `batchscope apply` reads a server's metrics: the flag, the settings, the local
tritonserver's own command line, Triton's default port, each tried against a real
HTTP endpoint; and one line naming --metrics-url when none answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
import requests

from collector.config import target_from_url
from collector.demo import apply_command
from collector.errors import ConfigError
from collector.metrics_endpoint import candidates, find_metrics_target, process_metrics_url

METRICS = b'# TYPE nv_inference_count counter\nnv_inference_count{model="m",version="1"} 7\n'


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()
        self.wfile.write(METRICS)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_port() -> Iterator[int]:
    server = HTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Proc:
    def __init__(self, pid: int, cmdline: list[str]) -> None:
        self.pid, self._cmdline = pid, cmdline

    def cmdline(self) -> list[str]:
        return self._cmdline

    def name(self) -> str:
        return self._cmdline[0].rsplit("/", 1)[-1]


def test_a_tritonserver_command_line_says_where_its_metrics_are() -> None:
    assert (
        process_metrics_url(
            ["/opt/tritonserver", "--http-port=18000", "--metrics-port=18002"], "127.0.0.1"
        )
        == "http://127.0.0.1:18002/metrics"
    )
    assert (
        process_metrics_url(["tritonserver", "--metrics-address", "10.0.0.5"], "localhost")
        == "http://10.0.0.5:8002/metrics"
    )
    assert process_metrics_url(["tritonserver", "--metrics-address=0.0.0.0"], "::1") == (
        "http://[::1]:8002/metrics"
    )
    assert process_metrics_url(["tritonserver", "--allow-metrics=false"], "127.0.0.1") is None


def test_the_store_that_collected_a_server_says_first_where_its_metrics_are(tmp_path: Any) -> None:
    from collector.store import Store

    store = Store(f"sqlite:///{tmp_path}/s.db")
    try:
        store.record_endpoints(
            "127.0.0.1:18000",
            url="http://127.0.0.1:18000",
            metrics_url="http://127.0.0.1:9300/metrics",
        )
        stored = store.targets()
    finally:
        store.close()
    assert [(t.url, t.metrics_url) for t in stored] == [
        ("http://127.0.0.1:18000", "http://127.0.0.1:9300/metrics")
    ]
    target = target_from_url("http://127.0.0.1:18000")
    configured = [target_from_url("http://127.0.0.1:18000", "http://127.0.0.1:9100/metrics")]
    found = candidates(target, configured, lambda: [], stored)
    assert [(c.url, c.origin) for c in found] == [
        ("http://127.0.0.1:9300/metrics", "the store"),
        ("http://127.0.0.1:9100/metrics", "the settings"),
        ("http://127.0.0.1:8002/metrics", "Triton's default port"),
    ]


def test_candidates_come_from_the_settings_then_the_local_server_then_the_default() -> None:
    target = target_from_url("http://127.0.0.1:18000")
    configured = [
        target_from_url("http://127.0.0.1:18000", "http://127.0.0.1:9100/metrics"),
        target_from_url("http://127.0.0.1:19000", "http://127.0.0.1:9200/metrics"),
    ]
    procs = [
        _Proc(11, ["/usr/bin/tritonserver", "--http-port=19000", "--metrics-port=19002"]),
        _Proc(12, ["/usr/bin/tritonserver", "--http-port=18000", "--metrics-port=18002"]),
        _Proc(13, ["python", "--http-port=18000", "--metrics-port=18003"]),  # not Triton
    ]
    found = candidates(target, configured, lambda: procs)
    assert [(c.url, c.origin) for c in found] == [
        ("http://127.0.0.1:9100/metrics", "the settings"),
        ("http://127.0.0.1:18002/metrics", "tritonserver pid 12 on this host"),
        ("http://127.0.0.1:8002/metrics", "Triton's default port"),
    ]
    # A configured target at the default metrics URL adds nothing, and nothing twice.
    plain = [target_from_url("http://127.0.0.1:18000")]
    assert [c.url for c in candidates(target, plain, lambda: [])] == [
        "http://127.0.0.1:8002/metrics"
    ]


def test_the_first_candidate_that_serves_the_models_metrics_is_taken(metrics_port: int) -> None:
    dead = _closed_port()
    procs = [_Proc(5, ["tritonserver", "--http-port=18000", f"--metrics-port={metrics_port}"])]
    configured = [target_from_url("http://127.0.0.1:18000", f"http://127.0.0.1:{dead}")]
    with requests.Session() as http:
        found = find_metrics_target(
            "http://127.0.0.1:18000",
            None,
            configured,
            http=http,
            model="m",
            processes=lambda: procs,
        )
    target = found.target
    assert found.origin == "tritonserver pid 5 on this host"
    assert target.metrics_url == f"http://127.0.0.1:{metrics_port}/metrics"
    assert target.url == "http://127.0.0.1:18000" and target.name == "127.0.0.1:18000"


def test_no_answering_metrics_is_one_config_error_naming_the_flag(metrics_port: int) -> None:
    with requests.Session() as http, pytest.raises(ConfigError) as caught:
        # The only server found serves metrics, but not of this model.
        find_metrics_target(
            f"http://127.0.0.1:{_closed_port()}",
            None,
            [],
            http=http,
            model="other",
            processes=lambda: [],
        )
    assert caught.value.field == "metrics_url"
    assert "pass --metrics-url URL" in str(caught.value)
    assert "8002/metrics (Triton's default port:" in str(caught.value)

    with requests.Session() as http, pytest.raises(ConfigError) as caught:
        find_metrics_target(
            "http://127.0.0.1:18000",
            f"http://127.0.0.1:{metrics_port}/metrics",
            [],
            http=http,
            model="other",
        )
    message = str(caught.value)
    assert "check --metrics-url" in message and "no series of model 'other'" in message


def test_the_demo_prints_an_apply_line_that_works_from_any_directory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    line = apply_command("http://127.0.0.1:41000", "sqlite:///b s.db", "unbatched")
    assert line == (
        "batchscope apply --triton http://127.0.0.1:41000 "
        f"--db 'sqlite:///{tmp_path}/b s.db' --model unbatched"
    )
    hidden = apply_command("http://h:1", "postgresql://u:secret@db/x", "m")
    assert "secret" not in hidden and "postgresql://u:***@db/x" in hidden
