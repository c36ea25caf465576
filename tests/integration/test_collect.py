"""The collector against a real Triton: `batchscope collect` runs as its own process while
the load generator drives two models; then Triton is killed and restarted under it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collector.analysis.rates import window_rates
from collector.store import Store
from collector.testbed.load import run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TritonServer
from tests.support import running_collector, wait_until

pytestmark = pytest.mark.integration

MODELS = BATCHED_AND_UNBATCHED
INTERVAL_S = 0.5
LOAD_S = 6.0


@pytest.fixture(scope="module")
def server(module_triton_factory: Callable[..., TritonServer]) -> TritonServer:
    return module_triton_factory(MODELS)


@pytest.fixture(scope="module")
def collector_run(
    server: TritonServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    workdir = tmp_path_factory.mktemp("collect")
    db_url = f"sqlite:///{workdir / 'bs.db'}"
    args = ["--triton", server.http_url, "--metrics-url", server.metrics_url, "--db", db_url]
    args += ["--interval", str(INTERVAL_S), "--duration", "600", "--sources", "triton,nvml,host"]
    env = {"BATCHSCOPE_BACKOFF_MAX_S": "1"}
    with running_collector(workdir, args=args, env=env) as collector, Store(db_url) as store:
        wait_until(lambda: store.latest_collected_at() is not None, 30, "the first scrape")
        yield collector.proc, db_url, collector.log_path


@pytest.fixture(scope="module")
def loads(server: TritonServer, collector_run: tuple) -> dict[str, dict[str, float]]:
    """Each model in turn at concurrency 16; the collector scrapes throughout."""
    out: dict[str, dict[str, float]] = {}
    for spec in MODELS:
        started = time.time()
        result = run_load(server.grpc_url, spec.name, concurrency=16, duration_s=LOAD_S)
        ended = time.time()
        assert result.errors == 0, result.error_samples
        out[spec.name] = {"qps": result.qps, "start": started, "end": ended}
    return out


def test_stored_qps_and_batch_sizes_match_the_load(
    collector_run: tuple, loads: dict[str, dict[str, float]]
) -> None:
    _, db_url, _ = collector_run
    store = Store(db_url)
    try:
        wait_until(
            lambda: (store.latest_collected_at() or 0) > loads["unbatched"]["end"] + 0.5,
            15,
            "a scrape after the load",
        )
        for model, load in loads.items():
            # Samples well inside the load span: the steady-state rate of that run.
            samples = store.model_samples(
                model=model, since=load["start"] + 0.5, until=load["end"] - 0.2
            )
            assert len(samples) >= 5, f"{model}: only {len(samples)} samples during load"
            rates = window_rates(samples)
            assert rates is not None
            assert rates.requests_per_s == pytest.approx(load["qps"], rel=0.10), model
            # The statistics are read every statistics_interval_s (5 s), the metrics
            # every scrape: the newest reading of them in the span.
            read = [s.stats for s in samples if s.stats is not None]
            assert read and len(read) < len(samples), f"{model}: {len(read)} of {len(samples)}"
            if model == "batched":
                assert rates.avg_batch_size is not None and rates.avg_batch_size > 2
                sizes = {b.batch_size for b in read[-1].batch_stats}
                assert max(sizes) > 2, sizes
            else:
                assert rates.avg_batch_size == 1.0
                assert {b.batch_size for b in read[-1].batch_stats} == {1}
            # Per-scrape rates were stored too, and agree with the window.
            stored = [s.rates.requests_per_s for s in samples[1:] if s.rates is not None]
            assert stored and sum(stored) / len(stored) == pytest.approx(load["qps"], rel=0.2)
    finally:
        store.close()


def test_status_json_reports_models_and_instance_processes(
    collector_run: tuple, loads: dict
) -> None:
    _, db_url, _ = collector_run
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "status",
            "--db",
            db_url,
            "--window",
            "600",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    data = json.loads(out.stdout)
    assert set(data) == {"targets", "models", "devices", "processes"}
    rows = {m["model"]: m for m in data["models"]}
    assert set(rows) == {"batched", "unbatched"}
    # The nested shape (README, status --json): the model's ``rates`` and ``config``
    # under the records' own field names; a process's latest reading under ``sample``.
    batched = rows["batched"]
    for field in ("target", "model", "version", "pending_request_count"):
        assert field in batched, field
    for field in (
        "requests_per_s",
        "inferences_per_s",
        "executions_per_s",
        "avg_batch_size",
        "queue_us_per_request",
        "compute_infer_us_per_request",
        "request_us_per_request",
        "queue_share",
        "fail_per_s",
    ):
        assert field in batched["rates"], field
    for field in (
        "dynamic_batching",
        "max_queue_delay_us",
        "preferred_batch_sizes",
        "max_batch_size",
        "instance_count",
    ):
        assert field in batched["config"], field
    assert batched["config"]["dynamic_batching"] is True
    assert batched["config"]["preferred_batch_sizes"] == [8, 16]
    assert batched["config"]["max_queue_delay_us"] == 2000
    assert rows["unbatched"]["config"]["dynamic_batching"] is False
    assert batched["config"]["max_batch_size"] == 32 and batched["config"]["instance_count"] == 1
    stubs = {p["sample"]["model"]: p for p in data["processes"] if p["sample"]["role"] == "stub"}
    assert set(stubs) == {"batched", "unbatched"}
    assert all(p["sample"]["instance_name"] for p in stubs.values())
    # The CPU share averaged over the window (the latest tick's reading may be idle).
    cpu_pct_mean = stubs["batched"]["cpu_pct_mean"]
    assert cpu_pct_mean is not None and cpu_pct_mean > 0
    assert [p for p in data["processes"] if p["sample"]["role"] == "server"]


def test_restart_marks_target_down_then_up_without_negative_rates(
    server: TritonServer, collector_run: tuple, loads: dict
) -> None:
    proc, db_url, log_path = collector_run
    store = Store(db_url)
    target = store.targets()[0].name if store.targets() else None
    try:
        assert target is not None
        killed_at = time.time()
        server.kill()
        wait_until(
            lambda: not {t.name: t for t in store.targets()}[target].up,
            20,
            "the target to be marked down",
        )
        server.start()
        result = run_load(server.grpc_url, "batched", concurrency=16, duration_s=2.0)
        assert result.errors == 0
        wait_until(
            lambda: bool({t.name: t for t in store.targets()}[target].up),
            30,
            "the target to be marked up again",
        )
        wait_until(
            lambda: any(
                s.rates is not None and s.rates.requests_per_s > 0
                for s in store.model_samples(model="batched", since=killed_at)
            ),
            20,
            "rates after the restart",
        )
        assert proc.poll() is None, log_path.read_text()[-2000:]

        triton = [t for t in store.transitions(target) if t.source == "triton"]
        ups = [t.up for t in triton]
        assert ups[0] is True and False in ups and ups[-1] is True, ups
        down = next(t for t in triton if not t.up)
        assert down.error_kind in ("down", "timeout"), down

        peak = max(load["qps"] for load in loads.values()) * 1.5
        for s in store.model_samples():
            if s.rates is None:
                continue
            r = s.rates
            for value in (r.requests_per_s, r.inferences_per_s, r.executions_per_s, r.fail_per_s):
                assert 0 <= value <= peak * 32, (s.model, s.collected_at, r)
            assert r.requests_per_s <= peak, (s.model, s.collected_at, r)
        # The first pair across the restart is a reset, counted as such.
        after = [s for s in store.model_samples(model="batched", since=killed_at) if s.rates]
        assert sum(s.rates.resets for s in after) == 1, [s.rates for s in after]
    finally:
        store.close()


def test_nvml_absence_is_a_quiet_host_fact_and_collection_runs_on(
    collector_run: tuple, loads: dict
) -> None:
    """On a host without NVIDIA GPU the NVML source's scrapes succeed: the host target
    is up with the fact recorded, and the log holds no warning about it."""
    proc, db_url, log_path = collector_run
    store = Store(db_url)
    try:
        states = {t.name: t for t in store.targets()}
        nvml_host = [t for t in states.values() if t.kind == "host"]
        assert nvml_host and nvml_host[0].sources.get("nvml") is True
        assert nvml_host[0].up is True and nvml_host[0].consecutive_failures == 0
        facts = store.host_facts(nvml_host[0].name)
        assert facts is not None and facts.nvml_absent
    finally:
        store.close()
    assert proc.poll() is None
    warnings = [
        line for line in log_path.read_text().splitlines() if "WARNING" in line and "nvml" in line
    ]
    assert warnings == []
