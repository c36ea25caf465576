"""The bundled dashboards and Prometheus rules on a real Prometheus scraping a real
Triton under load and batchscope's exporter beside it.

One CPU testbed (a dynamically batched model, an unbatched one and one serving a
trickle; Triton's latency summaries switched on), ``batchscope exporter`` watching it,
one ``batchscope collect`` at a 1 s interval into SQLite, and one Debian
``prometheus`` scraping Triton (job=triton) and the exporter (job=batchscope) every
second with ``deploy/prometheus/triton-rules.yml`` loaded.  All three models are driven
for a little over the rules' one-minute window.  Then:

* the recording rules, read at the evaluation that ends just before the load does,
  agree with ``build_status`` over the same 60 s (average batch size, queue share,
  throughput, queue seconds per request, within 5 %);
* every panel and annotation query of every bundled dashboard, its template variables
  filled from their own ``label_values`` queries as Grafana would, runs through
  ``/api/v1/query_range`` over the loaded window without an error or warning and
  returns data, except where it needs a GPU (evaluated, may be empty);
* the live exporter's ``/metrics``, findings and a recommendation in it, passes
  ``promtool check metrics``;
* fleet mode: a collector reading this Prometheus's HTTP API (the ``prometheus``
  source) at the same 1 s gives, over the same 60 s, the same average batch size and
  queue share as ``batchscope collect`` scraping Triton directly (within 5 %), and
  Prometheus's ``up`` makes the Triton up in the fleet store.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from collector.analysis.health import HealthState
from collector.analysis.status import build_status
from collector.config import Settings
from collector.records import ModelRates
from collector.scheduler import CollectorService
from collector.sources.prometheus import PrometheusSource
from collector.store import Store
from collector.testbed.load import LoadResult, run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED, ModelSpec
from collector.testbed.server import TritonServer
from grafana.dashgen import DASHBOARDS, Need, panel_queries, substitute
from grafana.dashgen.spec import Dashboard
from tests.integration.prometheus_server import (
    PrometheusQueryError,
    PrometheusServer,
    ScrapeJob,
    answers_200,
    host_port,
)
from tests.support import free_port, start_process, stop_process, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "triton-rules.yml"
BATCHED = "batched"
# A third model that serves a trickle: its instance idles, which is the idle-capacity
# finding the GPU dashboard's panel shows (on the CPU, by the instances' busy share).
IDLE = ModelSpec("idle", fixed_ms=4.0, per_sample_ms=0.5, max_batch_size=32)
MODELS = (*BATCHED_AND_UNBATCHED, IDLE)
# Closed-loop clients for the batcher to form batches well over 1 and for the unbatched
# model to queue, little enough for a 2-core machine; a few requests a second for IDLE.
LOADS: dict[str, dict[str, float]] = {
    "batched": {"concurrency": 8},
    "unbatched": {"concurrency": 4},
    IDLE.name: {"rate": 5.0},
}
RULE_WINDOW_S = 60.0  # the recording rules' rate[1m]
# The load covers the rule's window plus a few seconds' start-up on either side.
LOAD_S = RULE_WINDOW_S + 6.0
SCRAPE_S = 1.0
# The exporter's analysis at a pace a one-minute test sees: detectors every 5 s over a
# 20 s window, a finding opening after two evaluations (10 s apart at the least), and a
# recommendation every 15 s. The defaults (a minute's window, three evaluations) need
# minutes before the first finding.
EXPORTER_SETTINGS = {
    "analysis_every_s": 5,
    "recommend_every_s": 15,
    "analysis": {"window_s": 20, "sustain": 2},
}
# Grafana's $__rate_interval at a 1 s scrape: four scrapes.
RATE_INTERVAL = "4s"
# What this testbed cannot give a panel: it has no NVIDIA GPU.
NOT_HERE = frozenset({Need.GPU, Need.MIG})
TOLERANCE = 0.05
BATCH_RULE = "instance_model:nv_inference_batch_size:ratio_rate1m"
QUEUE_RULE = "instance_model:nv_inference_queue_duration:ratio_rate1m"
THROUGHPUT_RULE = "instance_model:nv_inference_request_success:rate1m"
QUEUE_SECONDS_RULE = "instance_model:nv_inference_queue_seconds_per_request:ratio_rate1m"


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
        proc = start_process(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    store = Store(db_url)
    try:
        wait_until(lambda: store.latest_collected_at() is not None, 30, "batchscope's first scrape")
        yield db_url
    finally:
        store.close()
        stop_process(proc)


@pytest.fixture(scope="module")
def exporter_url(server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``batchscope exporter`` against the testbed, ready (``/readyz`` 200); yields its URL."""
    workdir = tmp_path_factory.mktemp("exporter")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    settings = workdir / "batchscope.yml"
    settings.write_text(yaml.safe_dump(EXPORTER_SETTINGS))
    command = [
        sys.executable,
        "-m",
        "collector.cli",
        "exporter",
        *("--triton", server.http_url, "--metrics-url", server.metrics_url),
        *("--listen", f"127.0.0.1:{port}", "--interval", str(SCRAPE_S)),
        *("--config", str(settings)),
    ]
    url = f"http://127.0.0.1:{port}"
    with (workdir / "exporter.log").open("wb") as log:
        proc = start_process(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    try:
        wait_until(
            lambda: proc.poll() is not None or answers_200(f"{url}/readyz"),
            30,
            "the exporter's /readyz",
        )
        assert proc.poll() is None, (workdir / "exporter.log").read_text()[-3000:]
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def prometheus(
    server: TritonServer, exporter_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    jobs = [
        ScrapeJob("triton", (host_port(server.metrics_url),)),
        ScrapeJob("batchscope", (host_port(exporter_url),)),
    ]
    prom = PrometheusServer(
        tmp_path_factory.mktemp("prometheus"), jobs, rule_files=[RULES], interval_s=SCRAPE_S
    )
    with prom:
        yield prom


@pytest.fixture(scope="module")
def fleet_db(
    prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A collector in fleet mode, reading Prometheus's HTTP API every SCRAPE_S into its
    own SQLite store; yields the store's URL once it holds a first sample."""
    db_url = f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleet.db'}"
    settings = Settings(db_url=db_url, interval_s=SCRAPE_S, jitter_s=0.0)
    store = Store(db_url)
    store.open()
    source = PrometheusSource(prometheus.url, interval_s=SCRAPE_S, timeout_s=2.0)
    service = CollectorService(settings, store, [source])
    service.start()
    try:
        wait_until(lambda: store.latest_collected_at() is not None, 30, "a fleet-mode sample")
        yield db_url
    finally:
        service.shutdown()
        store.close()


@pytest.fixture(scope="module")
def loaded(
    server: TritonServer, collector_db: str, fleet_db: str, prometheus: PrometheusServer
) -> LoadedWindow:
    """Every model under its steady load at once, for LOAD_S seconds."""
    start = time.time()
    with ThreadPoolExecutor(len(LOADS)) as pool:
        futures = {
            model: pool.submit(
                run_load,
                server.grpc_url,
                model,
                concurrency=int(load["concurrency"]) if "concurrency" in load else None,
                rate=load.get("rate"),
                duration_s=LOAD_S,
            )
            for model, load in LOADS.items()
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
        QUEUE_SECONDS_RULE: (
            "queue seconds per request",
            None if ours.queue_us_per_request is None else ours.queue_us_per_request / 1e6,
        ),
    }
    lines = []
    pairs = []
    for record, (name, batchscope) in compared.items():
        assert batchscope is not None, f"batchscope has no {name}"
        rule = _rule_value(prometheus, record, selector, at)
        pairs.append((rule, batchscope))
        lines.append(
            f"{name}: rule {rule:.5g}, batchscope {batchscope:.5g}, "
            f"difference {abs(rule - batchscope) / batchscope:.2%}"
        )
    report = f"t={at:.0f}, window {RULE_WINDOW_S:g} s\n" + "\n".join(lines)
    print("\n" + report)
    assert pairs[0][0] > 2, f"the batcher formed no batches, nothing to compare\n{report}"
    for rule, batchscope in pairs:
        assert rule == pytest.approx(batchscope, rel=TOLERANCE), report


def test_fleet_mode_gives_the_figures_of_direct_scraping(
    server: TritonServer, collector_db: str, fleet_db: str, loaded: LoadedWindow
) -> None:
    # The window ends an interval before the load does: Prometheus's newest sample lags
    # its scrape by up to an interval.
    at = loaded.end - SCRAPE_S
    ours = _batchscope_rates(collector_db, BATCHED, at)
    theirs = _batchscope_rates(fleet_db, BATCHED, at)
    compared = {
        "average batch size": (ours.avg_batch_size, theirs.avg_batch_size),
        "queue share": (ours.queue_share, theirs.queue_share),
        "requests/s": (ours.requests_per_s, theirs.requests_per_s),
    }
    lines = [f"fleet mode, t={at:.0f}, window {RULE_WINDOW_S:g} s"]
    for name, (direct, fleet) in compared.items():
        assert direct is not None and fleet is not None, f"{name}: direct {direct}, fleet {fleet}"
        lines.append(
            f"{name}: direct {direct:.5g}, fleet {fleet:.5g}, "
            f"difference {abs(direct - fleet) / direct:.2%}"
        )
    report = "\n".join(lines)
    print("\n" + report)
    store = Store(fleet_db)
    try:
        healths = {t.name: t.health for t in build_status(store, now=at).targets}
    finally:
        store.close()
    fleet_target = host_port(server.metrics_url)
    # Prometheus's up says the Triton is up; the Prometheus itself is a target too.
    assert healths[fleet_target].state is HealthState.UP, healths
    assert healths["prometheus"].state is HealthState.UP, healths
    assert ours.avg_batch_size is not None and ours.avg_batch_size > 2, report
    for name in ("average batch size", "queue share"):
        direct, fleet = compared[name]
        assert fleet == pytest.approx(direct, rel=TOLERANCE), report


def test_the_exporters_metrics_pass_promtool_check_metrics(
    server: TritonServer, exporter_url: str, loaded: LoadedWindow
) -> None:
    with urllib.request.urlopen(f"{exporter_url}/metrics", timeout=10) as response:
        exposition = response.read()
    # Not a vacuous pass: after the load it holds the loaded model's batch-size counters,
    # active findings and a recommendation, the families with the most labels.
    samples = [
        sample
        for family in text_string_to_metric_families(exposition.decode())
        for sample in family.samples
    ]
    target = host_port(server.http_url)
    for name in (
        "batchscope_model_executions_total",
        "batchscope_finding",
        "batchscope_recommendation_info",
    ):
        assert any(s.name == name and s.labels.get("target") == target for s in samples), (
            f"no {name}{{target={target!r}}} in the exporter's /metrics"
        )
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make system-deps` installs Debian's prometheus"
    out = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=30
    )
    problems = (out.stdout + out.stderr).decode(errors="replace")
    assert out.returncode == 0 and not problems.strip(), problems


def _variable_choices(
    prom: PrometheusServer, dashboard: Dashboard, loaded: LoadedWindow
) -> list[dict[str, str]]:
    """The ways a user can fill ``dashboard``'s template variables, as Grafana fills
    them: from each variable's ``label_values`` query (over the loaded window), every
    value at once for a multi-value variable (Grafana sends ``(a|b)``, regex-escaped
    inside a PromQL string), one value for a single-value one -- the batched model
    first, then the others (a finding may open on one model and not another)."""
    choices: list[dict[str, str]] = [{}]
    for variable in dashboard.variables:
        filled: list[dict[str, str]] = []
        for values in choices:
            # A variable's selector may name the ones before it ($model names $instance).
            match = substitute(variable.selector, values=values)
            found = prom.label_values(variable.label_name, [match], loaded.start, loaded.end)
            assert found, f"{dashboard.uid}: ${variable.name} ({variable.query}) has no values"
            if variable.multi:
                escaped = (re.escape(v).replace("\\", "\\\\") for v in found)
                filled.append({**values, variable.name: "(" + "|".join(escaped) + ")"})
            else:
                ordered = sorted(found, key=lambda v: v != BATCHED)
                filled.extend({**values, variable.name: v} for v in ordered)
        choices = filled
    return choices


def test_every_dashboard_query_runs_and_returns_data(
    prometheus: PrometheusServer, loaded: LoadedWindow
) -> None:
    """A query returns data when it does for some way of filling its dashboard's
    variables (a user picks the model that has what the panel shows)."""
    choices = {d.uid: _variable_choices(prometheus, d, loaded) for d in DASHBOARDS}
    failed, empty, gpu_only = [], [], []
    queries = panel_queries()
    for query in queries:
        has_data = errored = False
        for values in choices[query.dashboard_uid]:
            expr = substitute(query.expr, rate_interval=RATE_INTERVAL, values=values)
            where = f"{query.dashboard_uid} / {query.panel_title} / {query.ref_id}: {expr}"
            try:
                series = prometheus.query_range(expr, loaded.start, loaded.end, SCRAPE_S)
            except PrometheusQueryError as exc:
                failed.append(f"{where}\n    {exc}")
                errored = True
                break
            has_data = any(math.isfinite(v) for s in series for _, v in s.points)
            if has_data:
                break
        if errored:
            continue
        if query.needs & NOT_HERE:
            gpu_only.append(f"{'data' if has_data else 'empty'}: {where}")
        elif not has_data:
            empty.append(f"{where}\n    needs: {sorted(query.needs) or 'nothing more'}")
    print(f"\n{len(queries)} queries; {len(gpu_only)} need a GPU:\n" + "\n".join(gpu_only))
    assert not failed, "queries that failed:\n" + "\n".join(failed)
    assert not empty, "queries without data on the loaded testbed:\n" + "\n".join(empty)
