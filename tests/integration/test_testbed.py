"""The testbed against a real tritonserver: batching pays, reloads apply, nothing leaks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.testbed.cli import main
from collector.testbed.config import DEFAULT_CONFIG, load_testbed_config
from collector.testbed.load import run_load
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer, stub_processes_under
from tests.support import start_process

# triton_factory / module_triton_factory (conftest.py): start(specs, **kwargs) -> server.
TritonFactory = Callable[..., TritonServer]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def testbed(module_triton_factory: TritonFactory) -> Iterator[TritonServer]:
    """The two models of the packaged default.yaml: ``batched`` and ``unbatched``."""
    yield module_triton_factory(load_testbed_config(DEFAULT_CONFIG).models)


def _batch_sizes(server: TritonServer, model: str) -> dict[int, int]:
    stats = server.get_json(f"/v2/models/{model}/stats")["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_dynamic_batching_raises_qps_and_shows_in_batch_stats(testbed: TritonServer) -> None:
    batched = run_load(testbed.grpc_url, "batched", concurrency=16, duration_s=3.0)
    unbatched = run_load(testbed.grpc_url, "unbatched", concurrency=16, duration_s=3.0)
    print(f"\nbatched: {batched.to_json()}\nunbatched: {unbatched.to_json()}")

    assert batched.errors == 0, batched.error_samples
    assert unbatched.errors == 0, unbatched.error_samples
    # Unbatched, one instance: at most 1000 / (4 + 0.5) ≈ 220 QPS.  Batched at 16
    # clients: batches of 8-16 cost 8-12 ms, several times that.  Measured here on
    # 2 cores: about 640 against 150.
    assert batched.qps > 2.0 * unbatched.qps
    assert unbatched.qps < 260

    sizes = _batch_sizes(testbed, "batched")
    assert max(sizes) > 1, sizes
    assert sum(n for b, n in sizes.items() if b > 1) > sizes.get(1, 0)
    assert set(_batch_sizes(testbed, "unbatched")) == {1}


def test_open_loop_rate_is_kept(testbed: TritonServer) -> None:
    constant = run_load(testbed.grpc_url, "batched", rate=100, duration_s=3.0, arrivals="constant")
    # A fixed seed makes the Poisson arrival count repeatable, so this cannot flake on
    # an unlucky draw; the spacing is still random.
    poisson = run_load(testbed.grpc_url, "unbatched", rate=80, duration_s=3.0, seed=7)
    print(f"\nconstant 100/s: {constant.to_json()}\npoisson 80/s: {poisson.to_json()}")
    for result, rate in ((constant, 100), (poisson, 80)):
        assert result.errors == 0, result.error_samples
        assert abs(result.qps - rate) <= 0.15 * rate, result


def test_load_command_prints_json(
    testbed: TritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # --triton with the HTTP URL: the testbed keeps gRPC on HTTP + 1, like 8000/8001.
    argv = ["load", "--triton", testbed.http_url, "--model", "batched"]
    code = main([*argv, "--concurrency", "4", "--duration", "1", "--batch", "2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["requests"] > 0 and result["errors"] == 0
    assert set(result) == {
        "requests",
        "errors",
        "duration_s",
        "qps",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "error_samples",
    }


def test_live_reload_turns_on_batching_with_two_instances(triton_factory: TritonFactory) -> None:
    server = triton_factory([ModelSpec("reloadable", fixed_ms=1.0, per_sample_ms=0.1)])
    config: dict[str, Any] = server.get_json("/v2/models/reloadable/config")
    assert "dynamic_batching" not in config
    assert set(server.stub_processes()) == {"reloadable_0_0"}

    config["dynamic_batching"] = {"preferred_batch_size": [8], "max_queue_delay_microseconds": 500}
    config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
    server.load_model("reloadable", config)

    live = server.get_json("/v2/models/reloadable/config")
    assert live["dynamic_batching"]["preferred_batch_size"] == [8]
    assert live["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert [(g["kind"], g["count"]) for g in live["instance_group"]] == [("KIND_CPU", 2)]
    # The cost parameters travelled with the config, so the model still works.
    assert live["parameters"]["fixed_ms"]["string_value"] == "1.0"
    assert set(server.stub_processes()) == {"reloadable_0_0", "reloadable_0_1"}
    assert run_load(server.grpc_url, "reloadable", concurrency=4, duration_s=0.5).errors == 0


def test_kill_restart_stop_leave_no_stubs(triton_factory: TritonFactory) -> None:
    server = triton_factory([ModelSpec("m", fixed_ms=1.0, per_sample_ms=0.1, instance_count=2)])
    urls = (server.http_url, server.grpc_url, server.metrics_url)
    stubs = server.stub_processes()
    assert set(stubs) == {"m_0_0", "m_0_1"}
    assert all(p.ppid() == server.pid for p in stubs.values())

    server.kill()
    assert not any(p.is_running() and p.status() != "zombie" for p in stubs.values())
    assert server.leftover_processes() == []
    # The crashed target answers with errors, promptly, instead of hanging the client.
    started = time.monotonic()
    dead = run_load(server.grpc_url, "m", concurrency=2, duration_s=1.0)
    assert dead.requests == 0 and dead.errors > 0 and dead.error_samples
    assert time.monotonic() - started < 5.0

    server.start()  # same ports: a collector sees the same target come back
    assert (server.http_url, server.grpc_url, server.metrics_url) == urls
    assert run_load(server.grpc_url, "m", concurrency=2, duration_s=0.5).errors == 0
    assert "nv_inference_count" in _get_text(server.metrics_url)

    restarted = server.stub_processes()
    regions = [p.cmdline()[2] for p in restarted.values()]
    server.stop()
    assert server.leftover_processes() == []
    assert not any(p.is_running() and p.status() != "zombie" for p in restarted.values())
    assert not any((Path("/dev/shm") / r).exists() for r in regions)


def test_testbed_up_serves_until_interrupted(tmp_path: Path, triton_available: None) -> None:
    config = tmp_path / "testbed.yaml"
    config.write_text("models:\n  - name: only\n    fixed_ms: 1.0\n")
    proc = start_process(
        [sys.executable, "-m", "collector.testbed", "testbed", "up", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # Reading stdout blocks; should the command never print, the watchdog kills it,
    # which ends the read, so the test fails instead of hanging.
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        lines: dict[str, str] = {}
        for line in proc.stdout:
            key, _, value = line.strip().partition(" ")
            lines[key] = value.strip()
            if line.startswith("Ctrl-C"):
                break
        assert {"http", "grpc", "metrics", "log"} <= set(lines), lines
        workdir = Path(lines["log"]).parent
        assert "nv_inference_count" in _get_text(lines["metrics"])
        assert stub_processes_under([workdir])

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=40) == 0
        assert stub_processes_under([workdir]) == []
        assert not workdir.exists()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _get_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def test_processes_forked_while_load_is_in_flight_start(testbed: TritonServer) -> None:
    """A process started (fork, then exec) while the load generator's gRPC calls are in
    flight runs: gRPC's fork handlers, which crashed such children before their exec,
    are off in every batchscope process (``collector/__init__.py``)."""
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            run_load(testbed.grpc_url, "batched", concurrency=8, duration_s=1.0, stop=stop)

    drivers = [threading.Thread(target=drive, daemon=True) for _ in range(2)]
    for driver in drivers:
        driver.start()
    try:
        outcomes = []
        for _ in range(60):
            child = start_process(
                [sys.executable, "-c", "print('started')"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            out, _ = child.communicate(timeout=30)
            outcomes.append((child.returncode, out.strip()))
    finally:
        stop.set()
        for driver in drivers:
            driver.join(timeout=10)
    assert [o for o in outcomes if o != (0, "started")] == []
