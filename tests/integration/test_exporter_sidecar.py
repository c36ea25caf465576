"""`batchscope exporter` next to a real Triton on the CPU: it becomes ready once Triton
is scraped, and after a load its /metrics carries the batch-size counters Triton's
statistics API reports, the average batch size and the source's up gauge, passes
`promtool check metrics`, and SIGTERM stops it within seconds."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from collector.testbed.load import run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TritonServer
from tests.support import free_port, start_process, wait_until

pytestmark = pytest.mark.integration

BATCHED = BATCHED_AND_UNBATCHED[0]  # dynamic batching, preferred sizes 8 and 16
INTERVAL_S = 0.5
LOAD_S = 4.0


@pytest.fixture(scope="module")
def server(module_triton_factory: Callable[..., TritonServer]) -> TritonServer:
    return module_triton_factory([BATCHED])


@pytest.fixture(scope="module")
def exporter(server: TritonServer) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    base = f"http://127.0.0.1:{free_port()}/"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    proc = start_process(
        [sys.executable, "-m", "collector.cli", "exporter", "--triton", server.http_url]
        + ["--metrics-url", server.metrics_url, "--interval", str(INTERVAL_S)]
        + ["--listen", base.removeprefix("http://").rstrip("/")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _samples(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = requests.get(base + "metrics", timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _executions(base: str) -> dict[int, float]:
    """The exporter's executions per batch size of the batched model."""
    return {
        int(labels["batch_size"]): value
        for labels, value in _samples(base).get("batchscope_model_executions_total", [])
        if labels["model"] == BATCHED.name
    }


def _triton_executions(server: TritonServer) -> dict[int, float]:
    """Triton's own statistics API: executions per batch size."""
    doc = requests.get(f"{server.http_url}/v2/models/{BATCHED.name}/stats", timeout=5).json()
    return {
        int(b["batch_size"]): float(b["compute_infer"]["count"])
        for stats in doc["model_stats"]
        for b in stats.get("batch_stats", [])
    }


def test_the_sidecar_exports_what_triton_does_not(
    server: TritonServer, exporter: tuple[subprocess.Popen[bytes], str]
) -> None:
    proc, base = exporter
    wait_until(lambda: requests.get(base + "healthz", timeout=2).ok, 30, "/healthz")
    wait_until(lambda: requests.get(base + "readyz", timeout=2).ok, 30, "/readyz 200")

    result = run_load(server.grpc_url, BATCHED.name, concurrency=16, duration_s=LOAD_S)
    assert result.errors == 0, result.error_samples
    # The load is over: once a scrape has seen all of it, the counters are Triton's.
    triton = _triton_executions(server)
    assert max(triton) > 1, triton  # the batcher formed batches
    wait_until(lambda: _executions(base) == triton, 10, f"the exporter's counters = {triton}")

    samples = _samples(base)
    compute = {
        int(labels["batch_size"]): value
        for labels, value in samples["batchscope_model_execution_compute_seconds_total"]
        if labels["model"] == BATCHED.name
    }
    assert set(compute) == set(triton) and all(v > 0 for v in compute.values())
    (avg,) = [v for lb, v in samples["batchscope_model_average_batch_size"] if lb["model"]]
    assert avg > 1.5, avg
    up = {lb["source"]: v for lb, v in samples["batchscope_source_up"] if lb["target"]}
    assert up["triton"] == 1.0, up
    assert requests.get(base + "readyz", timeout=5).status_code == 200
    assert requests.get(base + "healthz", timeout=5).status_code == 200
    assert server.http_url in requests.get(base, timeout=5).text

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (make system-deps installs Debian's prometheus)"
    live = requests.get(base + "metrics", timeout=5).text
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=live, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    proc.send_signal(signal.SIGTERM)
    stopping = time.monotonic()
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - stopping < 5
