"""The simulated Triton fleet (``collector.testbed.fleet``): the real ``TritonSource``
reads every target of it without an error, the metrics and statistics of one target
agree with each other as Triton's do, counters advance, connections are kept alive,
readiness is a line (no polling), and the process dies with its parent."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from collector import records
from collector.analysis.rates import rates_between
from collector.config import target_from_url
from collector.sources.triton import TritonSource
from collector.testbed.fleet import RECORDED_METRICS, RECORDED_MODEL, Fleet
from tests.support import start_process, stop_process, wait_until

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "triton" / "metrics_cpu.txt"


def _source(fleet: Fleet, i: int) -> TritonSource:
    return TritonSource(target_from_url(fleet.urls[i], fleet.metrics_urls[i]))


def _structure(text: str, model: str) -> list[str]:
    """The page's comment lines and the label sets of ``model``'s series, values cut."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
        elif f'model="{model}"' in line:
            out.append(line.rpartition(" ")[0])
    return out


def test_the_recorded_exposition_is_the_cpu_testbeds() -> None:
    recorded = FIXTURE.read_text()
    assert _structure(RECORDED_METRICS, RECORDED_MODEL) == _structure(recorded, RECORDED_MODEL)
    families = set(re.findall(r"^# TYPE (\S+)", recorded, re.M))
    assert set(re.findall(r"^# TYPE (\S+)", RECORDED_METRICS, re.M)) == families


def test_every_target_reads_without_error_and_its_documents_agree() -> None:
    # One tick for the whole test: metrics and statistics are of the same instant.
    with Fleet(3, 4, tick_s=3600.0) as fleet:
        assert len(set(fleet.ports)) == 3
        for i in range(3):
            source = _source(fleet, i)
            try:
                (snapshot,) = source.collect()
            finally:
                source.close()
            assert snapshot.partial_errors == {}
            assert snapshot.server_version == "2.52.0"
            assert sorted(m.model for m in snapshot.model_metrics) == fleet.model_names
            assert sorted(c.model for c in snapshot.model_configs) == fleet.model_names
            assert all(
                c.dynamic_batching and c.max_batch_size == 32 for c in snapshot.model_configs
            )
            stats = {s.model: s for s in snapshot.model_stats}
            for metrics in snapshot.model_metrics:
                s = stats[metrics.model]
                assert metrics.request_success == s.success.count > 0
                assert metrics.inference_count == s.inference_count
                assert metrics.exec_count == s.execution_count
                assert sum(b.compute_infer.count for b in s.batch_stats) == s.execution_count
                assert sum(b.batch_size * b.compute_infer.count for b in s.batch_stats) == (
                    s.inference_count
                )
                assert metrics.queue_duration_us == s.queue.ns // 1000
                assert sum(metrics.request_failure_by_reason.values()) == 0
                assert s.fail.count == 0


def test_counters_advance_into_positive_rates() -> None:
    with Fleet(2, 2, tick_s=0.05) as fleet:
        source = _source(fleet, 1)
        try:
            (first,) = source.collect()
            later: list[records.TritonSnapshot] = []

            def advanced() -> bool:
                (snapshot,) = source.collect()
                later[:] = [snapshot]
                return all(
                    b.exec_count > a.exec_count
                    for a, b in zip(first.model_metrics, snapshot.model_metrics, strict=True)
                )

            wait_until(advanced, 10, "the counters to advance")
        finally:
            source.close()
        (second,) = later
        stats = [{s.model: s for s in snap.model_stats} for snap in (first, second)]
        for a, b in zip(first.model_metrics, second.model_metrics, strict=True):
            rates = rates_between(
                records.ModelSample("t", first.collected_at, a, stats[0][a.model]),
                records.ModelSample("t", second.collected_at, b, stats[1][b.model]),
                instance_count=1,
            )
            assert rates.requests_per_s > 0 and rates.executions_per_s > 0
            assert rates.avg_batch_size is not None and 1 <= rates.avg_batch_size <= 16
            assert rates.queue_share is not None and 0 < rates.queue_share < 1
            assert rates.fail_per_s == 0


def test_connections_are_kept_alive_until_the_client_closes() -> None:
    with Fleet(1, 1) as fleet:
        conn = http.client.HTTPConnection("127.0.0.1", fleet.ports[0], timeout=5)
        try:
            for path in ("/v2", "/metrics", "/v2/models/stats", "/v2/models/model000/config"):
                conn.request("GET", path)
                response = conn.getresponse()
                assert response.status == 200, path
                assert response.read()
                assert not response.will_close
            sock = conn.sock
            conn.request("GET", "/v2/models/nope/config")
            missing = conn.getresponse()
            assert missing.status == 404 and "nope" in json.loads(missing.read())["error"]
            assert conn.sock is sock  # the same connection all along
            conn.request("GET", "/v2/health/ready", headers={"Connection": "close"})
            closing = conn.getresponse()
            assert closing.status == 200 and closing.will_close
        finally:
            conn.close()
        # The server ends a connection asked to close: the client reads to the end.
        with socket.create_connection(("127.0.0.1", fleet.ports[0]), timeout=5) as raw:
            raw.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            received = b""
            while chunk := raw.recv(65536):
                received += chunk
            assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"}")


def test_the_command_announces_its_ports_and_stops_on_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "ports.json"
    proc = start_process(
        [sys.executable, "-m", "collector.testbed.fleet", "--targets", "2", "--models", "1"]
        + ["--port-file", str(port_file)],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())  # the ready line: every port listens
        assert json.loads(port_file.read_text()) == ready
        assert len(ready["ports"]) == 2 and ready["models"] == ["model000"]
        conn = http.client.HTTPConnection("127.0.0.1", ready["ports"][1], timeout=5)
        conn.request("GET", "/v2")
        assert json.loads(conn.getresponse().read())["name"] == "triton"
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        stop_process(proc)  # type: ignore[arg-type]
        if proc.stdout is not None:
            proc.stdout.close()


PARENT = textwrap.dedent("""
    import sys, time
    from collector.testbed.fleet import Fleet
    fleet = Fleet(1, 1).start()
    print(fleet.pid, flush=True)
    time.sleep(60)
""")


def test_the_simulator_dies_with_its_parent() -> None:
    parent = start_process([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        assert child.is_running()
        parent.kill()  # SIGKILL: no handler of the parent's runs
        parent.wait(timeout=10)

        def gone() -> bool:
            try:
                return child.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_until(gone, 10, "the simulator to die with its parent")
    finally:
        stop_process(parent)  # type: ignore[arg-type]
        if parent.stdout is not None:
            parent.stdout.close()


@pytest.mark.parametrize("targets,models", [(0, 1), (1, 0)])
def test_an_empty_fleet_is_refused(targets: int, models: int) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "collector.testbed.fleet", "--targets", str(targets)]
        + ["--models", str(models)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "at least 1" in out.stderr
