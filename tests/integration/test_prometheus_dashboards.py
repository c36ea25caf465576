"""The bundled Prometheus rules, on a real Prometheus scraping a real Triton under load,
agree with batchscope's own figures for the same window.

One CPU testbed (a dynamically batched model and an unbatched one, Triton's latency
summaries switched on), one ``batchscope collect`` at a 1 s interval into SQLite, and
one Debian ``prometheus`` scraping Triton every second with
``deploy/prometheus/triton-rules.yml`` loaded.  Both models are driven for a little over
the rules' one-minute window; the recording rules, read at the evaluation that ends
just before the load does, are compared with ``build_status`` over the same 60 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_server import PrometheusServer, ScrapeJob, host_port

from collector.analysis.status import build_status
from collector.records import ModelRates
from collector.store import Store
from collector.testbed.load import LoadResult, run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TritonServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "triton-rules.yml"
MODELS = BATCHED_AND_UNBATCHED
BATCHED = "batched"
# Closed-loop clients per model: enough for the batcher to form batches well over 1
# and for the unbatched model to queue, little enough for a 2-core machine.
CONCURRENCY = {"batched": 8, "unbatched": 4}
RULE_WINDOW_S = 60.0  # the recording rules' rate[1m]
# The load covers the rule's window plus a few seconds' start-up on either side.
LOAD_S = RULE_WINDOW_S + 6.0
SCRAPE_S = 1.0
TOLERANCE = 0.05
BATCH_RULE = "instance_model:nv_inference_batch_size:ratio_rate1m"
QUEUE_RULE = "instance_model:nv_inference_queue_duration:ratio_rate1m"
THROUGHPUT_RULE = "instance_model:nv_inference_request_success:rate1m"


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


@dataclass(frozen=True)
class LoadedWindow:
    """When the load ran (unix times) and what each model's load measured."""

    start: float
    end: float
    results: dict[str, LoadResult]


@pytest.fixture(scope="module")
def server(module_triton_factory: Callable[..., TritonServer]) -> TritonServer:
    # Summaries give the p95/p99 panels data (Triton exports none by default).
    return module_triton_factory(MODELS, extra_args=["--metrics-config=summary_latencies=true"])


@pytest.fixture(scope="module")
def collector_db(server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``batchscope collect`` at the scrape interval Prometheus uses; yields its DB URL."""
    db_path = tmp_path_factory.mktemp("collect") / "bs.db"
    db_url = f"sqlite:///{db_path}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    command = [
        sys.executable,
        "-m",
        "collector.cli",
        "collect",
        *("--triton", server.http_url, "--metrics-url", server.metrics_url),
        *("--db", db_url, "--interval", str(SCRAPE_S), "--sources", "triton"),
        *("--duration", "600"),
    ]
    with db_path.with_suffix(".log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    store = Store(db_url)
    try:
        wait_until(lambda: store.latest_collected_at() is not None, 30, "batchscope's first scrape")
        yield db_url
    finally:
        store.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def prometheus(
    server: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    jobs = [ScrapeJob("triton", (host_port(server.metrics_url),))]
    prom = PrometheusServer(
        tmp_path_factory.mktemp("prometheus"), jobs, rule_files=[RULES], interval_s=SCRAPE_S
    )
    with prom:
        yield prom


@pytest.fixture(scope="module")
def loaded(server: TritonServer, collector_db: str, prometheus: PrometheusServer) -> LoadedWindow:
    """Both models under steady closed-loop load at once, for LOAD_S seconds."""
    start = time.time()
    with ThreadPoolExecutor(len(CONCURRENCY)) as pool:
        futures = {
            model: pool.submit(
                run_load, server.grpc_url, model, concurrency=clients, duration_s=LOAD_S
            )
            for model, clients in CONCURRENCY.items()
        }
        results = {model: f.result() for model, f in futures.items()}
    end = time.time()
    for model, result in results.items():
        assert result.errors == 0, (model, result.error_samples)
    return LoadedWindow(start, end, results)


def _rule_value(prom: PrometheusServer, record: str, selector: str, at: float) -> float:
    found = prom.query(f"{record}{{{selector}}}", at)
    assert len(found) == 1, f"{record}{{{selector}}} at {at}: {found}"
    return float(found[0].value)


def _batchscope_rates(db_url: str, model: str, now: float) -> ModelRates:
    store = Store(db_url)
    try:
        wait_until(
            lambda: (store.latest_collected_at() or 0) > now, 10, "batchscope's scrape after t"
        )
        report = build_status(store, window_s=RULE_WINDOW_S, now=now)
    finally:
        store.close()
    (status,) = [m for m in report.models if m.model == model]
    assert status.rates is not None, f"batchscope has no rates for {model} at {now}"
    return status.rates


def test_recording_rules_match_batchscopes_figures_for_the_same_window(
    server: TritonServer, collector_db: str, prometheus: PrometheusServer, loaded: LoadedWindow
) -> None:
    selector = f'instance="{host_port(server.metrics_url)}",model="{BATCHED}"'
    # The rule's last evaluation before the load ended: its 1m window lies within the load.
    evaluated = prometheus.query(f"timestamp({BATCH_RULE}{{{selector}}})", loaded.end - 1.0)
    assert len(evaluated) == 1, evaluated
    at = evaluated[0].value
    assert at - RULE_WINDOW_S > loaded.start, "the rule's window is not all under load"

    ours = _batchscope_rates(collector_db, BATCHED, at)
    # Each recording rule beside batchscope's figure for the same quantity.
    compared = {
        BATCH_RULE: ("average batch size", ours.avg_batch_size),
        QUEUE_RULE: ("queue share", ours.queue_share),
        THROUGHPUT_RULE: ("requests/s", ours.requests_per_s),
    }
    lines = []
    pairs = []
    for record, (name, batchscope) in compared.items():
        assert batchscope is not None, f"batchscope has no {name}"
        rule = _rule_value(prometheus, record, selector, at)
        pairs.append((rule, batchscope))
        lines.append(
            f"{name}: rule {rule:.4f}, batchscope {batchscope:.4f}, "
            f"difference {abs(rule - batchscope) / batchscope:.2%}"
        )
    report = f"t={at:.0f}, window {RULE_WINDOW_S:g} s\n" + "\n".join(lines)
    print("\n" + report)
    assert pairs[0][0] > 2, f"the batcher formed no batches, nothing to compare\n{report}"
    for rule, batchscope in pairs:
        assert rule == pytest.approx(batchscope, rel=TOLERANCE), report
