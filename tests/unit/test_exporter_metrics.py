"""The exporter's /metrics from a real store: every family of the contract with its
type and label names, values that are the stored and analysed figures (batch_stats
counters, window gauges, findings, the latest recommendation, targets judged from
now), and an exposition that ``promtool check metrics`` passes."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sqlalchemy.exc import OperationalError

from alerts.engine import evaluate_alerts
from collector import records
from collector.analysis.capacity import idle_instance_equivalents
from collector.analysis.status import build_status
from collector.config import AlertSettings, Settings
from collector.exporter.collectors import SnapshotCollector
from collector.exporter.families import FAMILIES, Kind
from collector.exporter.snapshot import ExporterSnapshot, take_snapshot
from collector.store import Store
from collector.store.buffer import WriteBuffer
from collector.synthetic import Load, model_config, scrape_ok, steady_load, store_recommendation
from tests.support import wait_until

T0 = 1_700_000_000.0
TARGET = "triton-a"
WINDOW_S = 60.0
NOW = T0 + 120.0  # the last scrape of the load below

BATCHED = model_config("batched", batching=True, preferred=(4, 8), delay_us=500, instances=2)
UNBATCHED = model_config("unbatched", batching=False)
LOADS = [
    Load(
        config=BATCHED,
        qps=80.0,
        request_ms=12.0,
        queue_share=0.4,
        batch_mix={4: 0.5, 8: 0.5},
        cost_ms=lambda b: 2.0 + 0.5 * b,
    ),
    Load(
        config=UNBATCHED,
        qps=20.0,
        request_ms=6.0,
        queue_share=0.1,
        batch_mix={1: 1.0},
        cost_ms=lambda b: 5.0,
    ),
]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """Two minutes of steady load on two models, scraped every 5 s; a GPU and its
    processes on the host; a finding on a model, one on a device, one resolved; two
    recommendations for ``unbatched`` (the later one counts); the alerts of the active
    findings, firing."""
    s = Store(f"sqlite:///{tmp_path / 'exporter.db'}")
    steady_load(s, LOADS, target=TARGET, start=T0, seconds=120, step=5)
    for i in range(25):
        scrape_ok(s, TARGET, T0 + 5 * i)
    _seed_host(s)
    s.add_finding(
        kind="queue_saturation",
        severity="warning",
        target=TARGET,
        subject="batched",
        summary="queue dominates",
        window_start=NOW - 60,
        window_end=NOW,
    )
    s.add_finding(
        kind="idle_capacity",
        severity="info",
        target="host-1",
        subject="GPU-A",
        summary="idle GPU",
        window_start=NOW - 60,
        window_end=NOW,
        evidence={"device_kind": "gpu", "idle_devices": 0.8},
    )
    resolved = s.add_finding(
        kind="batching_off",
        severity="warning",
        target=TARGET,
        subject="unbatched",
        summary="no batching",
        window_start=NOW - 60,
        window_end=NOW,
    )
    s.resolve_finding(resolved, NOW - 1)
    for created_at, qps in ((NOW - 60, 10.0), (NOW - 1, 20.0)):
        store_recommendation(
            s, target=TARGET, config=UNBATCHED, qps=qps, p95_ms=8.0, created_at=created_at
        )
    # The active findings fire alerts, with a notification each in the outbox.
    hook = {"name": "hook", "webhook": {"url": "http://127.0.0.1:9/hook"}}
    evaluate_alerts(s, Settings(alerts=AlertSettings(receivers=[hook])), now=NOW)
    try:
        yield s
    finally:
        s.close()


def _seed_host(s: Store) -> None:
    for i in range(3):
        at = NOW - 10 + 5 * i
        s.write_devices(
            "host-1",
            at,
            [
                records.DeviceSample(
                    source="nvml",
                    uuid="GPU-A",
                    name="H200",
                    utilization_gpu_pct=20.0,
                    sm_active_pct=15.0,
                    memory_used_bytes=2 * 1024**3,
                ),
            ],
        )
        s.write_processes(
            "host-1",
            at,
            [
                records.ProcessSample(
                    source="nvml",
                    pid=77,
                    role="gpu",
                    gpu_uuid="GPU-A",
                    sm_util_pct=12.0,
                    gpu_memory_bytes=1024**3,
                )
            ],
        )
        s.write_processes(
            TARGET,
            at,
            [records.ProcessSample(source="host", pid=4242, role="server", cpu_pct=150.0)],
        )
        s.record_scrape(
            "host-1",
            "nvml",
            kind="host",
            started_at=at,
            duration_s=0.02,
            error_kind=None,
            error=None,
            interval_s=5.0,
        )


def _exposition(store: Store, now: float = NOW, *, openmetrics: bool = False) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SnapshotCollector(
            lambda: take_snapshot(store, window_s=WINDOW_S, now=now, version="t"),
            store_writes=WriteBuffer(max_writes=10, max_bytes=10_000).counts,
        )
    )
    generate = generate_openmetrics if openmetrics else generate_latest
    return generate(registry).decode()


def _samples(text: str) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _value(samples: dict[str, list[Sample]], metric: str, /, **labels: str) -> float:
    found = [s.value for s in samples.get(metric, []) if labels.items() <= s.labels.items()]
    assert len(found) == 1, f"{metric}{labels}: {found}"
    return found[0]


@pytest.mark.parametrize("openmetrics", [False, True])
def test_every_family_has_its_contract_type_and_labels(store: Store, openmetrics: bool) -> None:
    """In Prometheus's text format an info family is a gauge named ``..._info``; in
    OpenMetrics (what Prometheus asks for first) it is an ``info`` family."""
    if openmetrics:
        families = {f.name: f for f in openmetrics_families(_exposition(store, openmetrics=True))}
    else:
        families = {f.name: f for f in text_string_to_metric_families(_exposition(store))}
    for spec in FAMILIES:
        base, kind = spec.name, str(spec.kind)
        if spec.kind is Kind.COUNTER:
            base = spec.name.removesuffix("_total")
        elif spec.kind is Kind.INFO and openmetrics:
            base = spec.name.removesuffix("_info")
        elif spec.kind is Kind.INFO:
            kind = "gauge"
        assert base in families, f"{spec.name} is missing"
        fam = families[base]
        assert (fam.type, fam.documentation) == (kind, spec.help), spec.name
        # None is empty: the host has a GPU reading too.
        assert fam.samples, f"{spec.name} has no sample"
        for sample in fam.samples:
            if sample.name.endswith("_created"):  # OpenMetrics's counter creation time
                continue
            assert sample.name == spec.name
            assert sorted(sample.labels) == sorted(spec.labels), spec.name


def test_batch_stats_counters_are_the_latest_stored_statistics(store: Store) -> None:
    samples = _samples(_exposition(store))
    latest = store.model_samples(model="batched", since=NOW, until=NOW)[0]
    assert latest.stats is not None
    assert {b.batch_size for b in latest.stats.batch_stats} == {4, 8}
    for b in latest.stats.batch_stats:
        labels = {"target": TARGET, "model": "batched", "version": "1"}
        labels["batch_size"] = str(b.batch_size)
        assert b.exec_count > 0
        assert _value(samples, "batchscope_model_executions_total", **labels) == b.exec_count
        assert _value(
            samples, "batchscope_model_execution_compute_seconds_total", **labels
        ) == pytest.approx(b.compute_ns / 1e9)


def test_window_gauges_are_the_status_figures(store: Store) -> None:
    samples = _samples(_exposition(store))
    status = {m.model: m for m in build_status(store, window_s=WINDOW_S, now=NOW).models}
    rates = status["batched"].rates
    assert rates is not None and rates.busy_share is not None
    labels = {"target": TARGET, "model": "batched", "version": "1"}
    assert _value(samples, "batchscope_model_average_batch_size", **labels) == pytest.approx(
        rates.avg_batch_size
    )
    assert _value(samples, "batchscope_model_average_batch_size", **labels) == pytest.approx(6.0)
    assert _value(samples, "batchscope_model_queue_ratio", **labels) == pytest.approx(0.4)
    assert _value(samples, "batchscope_model_instance_busy_ratio", **labels) == pytest.approx(
        rates.busy_share
    )
    assert _value(samples, "batchscope_model_idle_instances", **labels) == pytest.approx(
        idle_instance_equivalents(2, rates.busy_share)
    )
    assert _value(samples, "batchscope_analysis_window_seconds") == WINDOW_S


def test_the_effective_config(store: Store) -> None:
    samples = _samples(_exposition(store))
    info = _value(
        samples,
        "batchscope_model_config_info",
        model="batched",
        dynamic_batching="true",
        preferred_batch_sizes="4,8",
    )
    assert info == 1.0
    model = {"target": TARGET, "model": "batched"}
    assert _value(samples, "batchscope_model_max_batch_size", **model) == 32
    assert _value(samples, "batchscope_model_preferred_batch_size", **model, position="1") == 8
    assert _value(samples, "batchscope_model_max_queue_delay_seconds", **model) == 0.0005
    assert _value(samples, "batchscope_model_instances", **model) == 2
    assert _value(samples, "batchscope_model_config_info", model="unbatched") == 1.0


def test_active_findings_are_one_and_resolved_ones_are_gone(store: Store) -> None:
    samples = _samples(_exposition(store))
    findings = {
        (s.labels["kind"], s.labels["model"], s.labels["device"]): s.value
        for s in samples["batchscope_finding"]
    }
    assert findings == {
        ("queue_saturation", "batched", ""): 1.0,
        ("idle_capacity", "", "GPU-A"): 1.0,
    }


def test_the_latest_recommendation_per_model(store: Store) -> None:
    samples = _samples(_exposition(store))
    (info,) = samples["batchscope_recommendation_info"]
    assert info.labels == {
        "target": TARGET,
        "model": "unbatched",
        "kind": "probe",
        "change": "dynamic_batching",
    }
    model = {"model": "unbatched"}
    # The later of the two recommendations; a probe claims no gain (predicted = current).
    assert _value(samples, "batchscope_recommendation_current_requests_per_second", **model) == 20
    assert _value(samples, "batchscope_recommendation_predicted_requests_per_second", **model) == 20
    assert _value(samples, "batchscope_recommendation_current_p95_seconds", **model) == 0.008
    assert _value(
        samples, "batchscope_recommendation_predicted_p95_seconds", **model
    ) == pytest.approx(0.0072)
    assert _value(samples, "batchscope_recommendation_confidence_ratio", **model) == 0.3


def test_sources_devices_and_processes(store: Store) -> None:
    samples = _samples(_exposition(store))
    assert _value(samples, "batchscope_source_up", source="triton", target=TARGET) == 1
    assert _value(samples, "batchscope_source_up", source="nvml", target="host-1") == 1
    duration = "batchscope_source_scrape_duration_seconds"
    assert _value(samples, duration, source="triton", target=TARGET) == 0.01
    gpu = {"uuid": "GPU-A", "kind": "gpu", "parent_uuid": "", "name": "H200"}
    assert _value(samples, "batchscope_device_utilization_ratio", **gpu) == 0.2
    assert _value(samples, "batchscope_device_sm_active_ratio", **gpu) == 0.15
    assert _value(samples, "batchscope_device_memory_used_bytes", **gpu) == 2 * 1024**3
    process = {"pid": "77", "gpu_uuid": "GPU-A", "model": "", "model_instance": ""}
    assert _value(samples, "batchscope_process_sm_utilization_ratio", **process) == 0.12
    assert _value(samples, "batchscope_process_gpu_memory_bytes", **process) == 1024**3
    server = {"target": TARGET, "pid": "4242", "role": "server"}
    assert _value(samples, "batchscope_process_cpu_cores", **server) == 1.5


def test_a_stale_target_is_down_and_exports_no_counters(store: Store) -> None:
    # Ten minutes after the last scrape nothing is fresh: the one rule says stale.
    samples = _samples(_exposition(store, now=NOW + 600))
    assert _value(samples, "batchscope_source_up", source="triton", target=TARGET) == 0
    assert _value(samples, "batchscope_source_up", source="nvml", target="host-1") == 0
    assert "batchscope_model_executions_total" not in samples
    assert "batchscope_model_average_batch_size" not in samples


def test_a_failed_scrape_is_down(store: Store) -> None:
    scrape_ok(store, TARGET, NOW + 1, ok=False)
    samples = _samples(_exposition(store, now=NOW + 1))
    assert _value(samples, "batchscope_source_up", source="triton", target=TARGET) == 0


@pytest.mark.parametrize("filled", [True, False])
def test_promtool_check_metrics_is_clean(filled: bool, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (make system-deps installs Debian's prometheus)"
    s = Store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        if filled:
            quoted = replace(UNBATCHED, model='we"ird\\name')
            steady_load(
                s,
                [*LOADS, replace(LOADS[1], config=quoted)],
                target=TARGET,
                start=T0,
                seconds=30,
                step=5,
            )
            scrape_ok(s, TARGET, T0 + 30)
        text = _exposition(s, now=T0 + 30)
    finally:
        s.close()
    assert ('we\\"ird' in text) is filled
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_latest_recommendations_reads_one_per_model(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The exporter reads the latest recommendation per model, not the whole history
    the recommender stores (one a minute): the last that ``recommendations`` lists."""
    url = (
        f"sqlite:///{tmp_path / 'r.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    s = Store(url)
    try:
        # Out of order, and a tie in created_at that the later id breaks.
        for model, created_at, qps in [
            ("a", T0 + 60, 2.0),
            ("a", T0, 1.0),
            ("b", T0, 3.0),
            ("b", T0, 4.0),
        ]:
            config = model_config(model, batching=False)
            store_recommendation(
                s, target=TARGET, config=config, qps=qps, p95_ms=5, created_at=created_at
            )
        latest = s.latest_recommendations()
        assert [(r.model, r.recommendation.current.qps) for r in latest] == [("a", 2.0), ("b", 4.0)]
        by_model = {r.model: r for r in s.recommendations()}  # oldest first: the last wins
        assert [r.id for r in latest] == [by_model["a"].id, by_model["b"].id]
    finally:
        s.close()


# ----------------------------------------------------------- the store's own families

_LOCKER = "CREATE TABLE IF NOT EXISTS t (x INTEGER)"


def _write_one(db: Path) -> None:
    """One real write to ``db``, failing at once (no busy wait) while it is locked."""
    conn = sqlite3.connect(db, timeout=0.0, isolation_level=None)
    try:
        conn.execute("INSERT INTO t VALUES (1)")
    except sqlite3.OperationalError as exc:  # as SQLAlchemy raises it to the buffer
        raise OperationalError("INSERT", None, exc) from exc
    finally:
        conn.close()


def _read_store(db: Path) -> ExporterSnapshot:
    """A snapshot that needs the store: reading ``db`` fails while it is locked."""
    conn = sqlite3.connect(db, timeout=0.0)
    try:
        conn.execute("SELECT count(*) FROM t").fetchone()
    except sqlite3.OperationalError as exc:
        raise OperationalError("SELECT", None, exc) from exc
    finally:
        conn.close()
    raise AssertionError("the store was expected to be locked")


def test_while_the_store_is_out_metrics_says_so_and_counts_what_was_lost(
    store: Store, tmp_path: Path
) -> None:
    """SQLite locked by another connection (its rollback journal: readers wait too):
    the buffer holds writes up to its bound and drops the oldest; /metrics serves the
    store's families alone, then the counts once the store is back."""
    db = tmp_path / "out.db"
    other = sqlite3.connect(db, isolation_level=None)
    other.execute(_LOCKER)
    buffer = WriteBuffer(max_writes=3, max_bytes=1_000_000, retry_s=0.05, retry_max_s=0.1)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SnapshotCollector(lambda: _read_store(db), store_writes=buffer.counts, version="t")
    )
    try:
        other.execute("BEGIN EXCLUSIVE")
        for _ in range(5):
            buffer.submit(lambda: _write_one(db), what="a row", size=lambda: 100)
        out = _samples(generate_latest(registry).decode())
        assert _value(out, "batchscope_store_up") == 0.0
        assert _value(out, "batchscope_store_writes_held") == 3.0
        assert _value(out, "batchscope_store_writes_held_bytes") == 300.0
        assert _value(out, "batchscope_store_writes_lost_total", reason="dropped") == 2.0
        assert _value(out, "batchscope_store_writes_lost_total", reason="rejected") == 0.0
        assert _value(out, "batchscope_store_outages_total") == 1.0
        assert _value(out, "batchscope_build_info", version="t") == 1.0
        assert "batchscope_source_up" not in out  # the store could not be read
        buffer.start()  # only now a write is retried (and in flight): the counts above hold still
        other.execute("COMMIT")
        wait_until(lambda: buffer.counts().held == 0, 10, "the held writes written")
    finally:
        buffer.stop(5.0)
        other.close()
    # The store back: the snapshot's families and the counts since start, side by side.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SnapshotCollector(
            lambda: take_snapshot(store, window_s=WINDOW_S, now=NOW), store_writes=buffer.counts
        )
    )
    out = _samples(generate_latest(registry).decode())
    assert "batchscope_source_up" in out
    assert _value(out, "batchscope_store_up") == 1.0
    assert _value(out, "batchscope_store_writes_held") == 0.0
    assert _value(out, "batchscope_store_writes_lost_total", reason="dropped") == 2.0
    assert _value(out, "batchscope_store_outages_total") == 1.0
    assert sqlite3.connect(db).execute("SELECT count(*) FROM t").fetchone() == (3,)


def test_a_snapshot_that_fails_while_the_store_takes_writes_fails_the_scrape() -> None:
    """Only a store outage explains a missing snapshot; anything else is not hidden."""

    def broken() -> ExporterSnapshot:
        raise RuntimeError("a bug in the snapshot")

    buffer = WriteBuffer(max_writes=3, max_bytes=1_000_000)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(broken, store_writes=buffer.counts))
    with pytest.raises(RuntimeError, match="a bug in the snapshot"):
        generate_latest(registry)
