"""The store on SQLite (a file) and on the real PostgreSQL: every record type reads
back equal to what was written, and the bookkeeping (up/down, config changes,
rollups, retention) keeps its promises."""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from collector.analysis.rates import merge_over_time, peak_rates
from collector.errors import ConfigError
from collector.records import (
    BatcherConfig,
    BatchStat,
    ConfigChange,
    DeviceSample,
    Duration,
    Finding,
    HostFacts,
    ModelConfig,
    ModelMetrics,
    ModelRates,
    ModelSample,
    ModelStats,
    Prediction,
    ProcessSample,
    QueuePolicy,
    Recommendation,
    ServerMetrics,
    TritonSnapshot,
)
from collector.store import (
    DetectorStreak,
    RetentionReport,
    Store,
    StoredDevice,
    StoredModelConfig,
    StoredProcess,
    StoredServer,
    TargetState,
    TargetTransition,
)

T0 = 1_700_000_040.0  # a multiple of 60, so buckets are easy to reason about
QUEUE_FINDING = Finding(
    "queue_saturation",
    "warning",
    "triton-a",
    "resnet",
    "queue 60% of request time",
    T0,
    T0 + 60,
    {"queue_share": 0.6},
)


# --------------------------------------------------------------------------- records


def full_metrics(model: str = "resnet", version: str = "1", scale: float = 1.0) -> ModelMetrics:
    """Every field set to a distinct value, so a dropped column shows."""
    return ModelMetrics(
        model=model,
        version=version,
        request_success=100.0 * scale,
        request_failure_by_reason={"REJECTED": 2.0 * scale, "BACKEND": 1.0},
        inference_count=400.0 * scale,
        exec_count=50.0 * scale,
        request_duration_us=123_456.5 * scale,
        queue_duration_us=23_456.25 * scale,
        compute_input_duration_us=1_000.0 * scale,
        compute_infer_duration_us=90_000.0 * scale,
        compute_output_duration_us=2_000.0 * scale,
        pending_request_count=3.0,
        cache_hit_count=7.0,
        cache_miss_count=8.0,
        cache_hit_duration_us=9.5,
        cache_miss_duration_us=10.5,
        load_duration_s=1.25,
        summary_quantiles_us={
            "nv_inference_queue_summary_us": {0.5: 10.0, 0.9: 20.0, 0.99: 35.5},
            "nv_inference_request_summary_us": {0.5: 110.0},
        },
        histogram_buckets={
            "nv_inference_first_response_histogram_ms": {100.0: 3.0, 500.0: 4.0, math.inf: 4.0},
        },
    )


def full_stats(model: str = "resnet", version: str = "1", scale: int = 1) -> ModelStats:
    return ModelStats(
        model=model,
        version=version,
        last_inference_ms=1_700_000_039_123,
        inference_count=400 * scale,
        execution_count=50 * scale,
        success=Duration(100 * scale, 123_456_789_012 * scale),
        fail=Duration(3, 4_000),
        queue=Duration(100 * scale, 23_456_000_000),
        compute_input=Duration(50 * scale, 1_000_000),
        compute_infer=Duration(50 * scale, 90_000_000_000),
        compute_output=Duration(50 * scale, 2_000_000),
        cache_hit=Duration(7, 9_500),
        cache_miss=Duration(8, 10_500),
        batch_stats=(
            BatchStat(
                8,
                Duration(40 * scale, 800_000),
                Duration(40 * scale, 80_000_000_000),
                Duration(40 * scale, 1_600_000),
            ),
            BatchStat(
                1, Duration(11, 200_000), Duration(10 * scale, 10_000_000_000), Duration(9, 400_000)
            ),
        ),
    )


def full_rates(window_s: float = 5.0, requests_per_s: float = 20.0) -> ModelRates:
    return ModelRates(
        window_s=window_s,
        requests_per_s=requests_per_s,
        inferences_per_s=4 * requests_per_s,
        executions_per_s=requests_per_s / 2,
        fail_per_s=0.4,
        fail_per_s_by_reason={"REJECTED": 0.4},
        avg_batch_size=8.0,
        queue_us_per_request=234.5,
        compute_input_us_per_request=10.0,
        compute_infer_us_per_request=900.0,
        compute_output_us_per_request=20.0,
        request_us_per_request=1234.5,
        queue_share=0.19,
        busy_share=0.45,
        resets=1,
    )


def full_config(model: str = "resnet", delay_us: int = 100) -> ModelConfig:
    return ModelConfig(
        model=model,
        max_batch_size=32,
        dynamic_batching=True,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=delay_us,
        priority_levels=2,
        default_queue_policy=QueuePolicy("DELAY", 5_000, True, 64),
        instance_count=2,
        instance_kind="KIND_GPU",
        backend="onnxruntime",
        platform="onnxruntime_onnx",
        raw_json=f'{{"name": "{model}", "dynamic_batching": {{"max_queue_delay_microseconds": '
        f"{delay_us}}}}}",
    )


def full_gpu(source: str = "triton", uuid: str = "GPU-aaaa", util: float = 55.5) -> DeviceSample:
    return DeviceSample(
        source=source,
        uuid=uuid,
        kind="gpu",
        index=0,
        name="NVIDIA H200",
        utilization_gpu_pct=util,
        utilization_memory_pct=12.5,
        memory_used_bytes=80 * 2**30,
        memory_total_bytes=141 * 2**30,
        power_w=350.5,
        power_limit_w=700.0,
        energy_j=123_456_789.5,
        sm_clock_mhz=1980,
        sm_active_pct=40.25,
        sm_occupancy_pct=30.5,
        tensor_active_pct=20.75,
    )


def mig_device() -> DeviceSample:
    return DeviceSample(
        source="nvml",
        uuid="MIG-bbbb",
        kind="mig",
        index=1,
        name="NVIDIA H200 MIG 1g.18gb",
        parent_uuid="GPU-aaaa",
        gpu_instance_id=7,
        compute_instance_id=0,
        memory_used_bytes=1024,
        memory_total_bytes=18 * 2**30,
        sm_active_pct=1.5,
        healthy=False,
        error="GPU is lost",
    )


def snapshot(at: float = T0, target: str = "triton-a", **changes: object) -> TritonSnapshot:
    base = TritonSnapshot(
        target=target,
        collected_at=at,
        server_version="2.52.0",
        model_metrics=(full_metrics(), ModelMetrics("mlp", "3")),
        # "orphan" has statistics but no metrics: not stored (a sample is keyed by metrics).
        model_stats=(full_stats(), ModelStats("orphan", "1", inference_count=5)),
        model_configs=(full_config(),),
        gpus=(full_gpu(),),
        server=ServerMetrics(0.25, 64e9, 12e9, 256e6, 1e6),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def scrape(
    store: Store,
    at: float,
    error_kind: str | None = None,
    *,
    source: str = "triton",
    kind: str = "triton",
    target: str = "triton-a",
) -> TargetState:
    return store.record_scrape(
        target,
        source,
        kind=kind,
        started_at=at,
        duration_s=0.05,
        error_kind=error_kind,
        error=None if error_kind is None else f"{error_kind} at {at}",
    )


# --------------------------------------------------------------------------- round trips


def test_empty_store_reads_empty(store: Store) -> None:
    assert store.targets() == []
    assert store.model_samples() == []
    assert store.latest_model_configs() == {}
    assert store.device_samples() == []
    assert store.latest_collected_at() is None
    assert store.model_rollups() == []


def test_triton_snapshot_reads_back_as_written(store: Store) -> None:
    rates = {("resnet", "1"): full_rates()}
    store.write_triton(snapshot(), rates)

    assert store.model_samples() == [
        ModelSample("triton-a", T0, ModelMetrics("mlp", "3")),
        ModelSample("triton-a", T0, full_metrics(), full_stats(), full_rates()),
    ]
    assert store.latest_model_configs() == {
        ("triton-a", "resnet"): StoredModelConfig("triton-a", T0, full_config())
    }
    assert store.device_samples() == [StoredDevice("triton-a", T0, full_gpu())]
    assert store.server_samples() == [
        StoredServer("triton-a", T0, ServerMetrics(0.25, 64e9, 12e9, 256e6, 1e6))
    ]
    [target] = store.targets()
    assert (target.name, target.kind, target.server_version, target.up) == (
        "triton-a",
        "triton",
        "2.52.0",
        None,
    )
    assert store.latest_collected_at() == T0


def test_snapshot_without_optional_parts(store: Store) -> None:
    store.write_triton(
        TritonSnapshot(target="bare", collected_at=T0, model_metrics=(ModelMetrics("m", "1"),))
    )
    assert store.model_samples() == [ModelSample("bare", T0, ModelMetrics("m", "1"))]
    assert store.server_samples() == []
    assert store.device_samples() == []
    assert store.targets()[0].server_version is None


def test_model_samples_filter_and_order(store: Store) -> None:
    for i in range(3):
        store.write_triton(snapshot(T0 + 10 * i))
        store.write_triton(snapshot(T0 + 10 * i + 5, target="triton-b"))

    def keys(samples: list[ModelSample]) -> list[tuple[str, str, float]]:
        return [(s.target, s.model, s.collected_at) for s in samples]

    everything = store.model_samples()
    assert [s.collected_at for s in everything] == sorted(s.collected_at for s in everything)
    assert len(everything) == 12
    assert keys(store.model_samples(target="triton-b", model="resnet")) == [
        ("triton-b", "resnet", T0 + 5),
        ("triton-b", "resnet", T0 + 15),
        ("triton-b", "resnet", T0 + 25),
    ]
    # Both bounds are inclusive.
    assert keys(store.model_samples(model="mlp", since=T0 + 10, until=T0 + 20)) == [
        ("triton-a", "mlp", T0 + 10),
        ("triton-b", "mlp", T0 + 15),
        ("triton-a", "mlp", T0 + 20),
    ]
    assert store.model_samples(model="mlp", version="1") == []
    windowed = store.model_samples(target="triton-a", model="resnet", since=T0 + 10)
    assert [s.stats for s in windowed] == [full_stats(), full_stats()]
    assert store.latest_collected_at("triton-a") == T0 + 20
    assert store.latest_collected_at() == T0 + 25


def test_devices_and_processes_read_back(store: Store) -> None:
    store.write_triton(snapshot())
    store.write_devices("host-1", T0 + 1, [full_gpu("nvml", util=70.0), mig_device()])
    stub = ProcessSample(
        source="host",
        pid=4242,
        role="stub",
        model="mlp",
        instance_name="mlp_0_0",
        cpu_pct=87.5,
        rss_bytes=512 * 2**20,
        gpu_uuid="GPU-aaaa",
        sm_util_pct=3.0,
        mem_util_pct=1.5,
        gpu_memory_bytes=2**30,
    )
    server = ProcessSample(source="host", pid=1, role="server")
    store.write_processes("host-1", T0 + 1, [server, stub])
    store.write_devices("host-1", T0 + 2, [])  # nothing to write is not an error

    assert store.device_samples(source="nvml") == [
        StoredDevice("host-1", T0 + 1, full_gpu("nvml", util=70.0)),
        StoredDevice("host-1", T0 + 1, mig_device()),
    ]
    assert store.device_samples(target="triton-a") == [StoredDevice("triton-a", T0, full_gpu())]
    assert len(store.device_samples(since=T0 + 0.5)) == 2
    assert store.device_samples(until=T0 + 0.5) == [StoredDevice("triton-a", T0, full_gpu())]
    assert store.process_samples() == [
        StoredProcess("host-1", T0 + 1, server),
        StoredProcess("host-1", T0 + 1, stub),
    ]
    assert store.process_samples(model="mlp") == [StoredProcess("host-1", T0 + 1, stub)]
    assert store.process_samples(target="triton-a") == []
    assert {t.name: t.kind for t in store.targets()} == {"host-1": "host", "triton-a": "triton"}


def test_process_buckets_average_per_process_and_bucket(store: Store) -> None:
    """Buckets count from ``since`` (floor, also where the database's CAST would
    round); averages skip missing readings; bounds are inclusive."""
    for i in range(12):  # every 5 s from T0: cpu 10, 20, ..., 120
        store.write_processes(
            "host-1",
            T0 + 5 * i,
            [
                ProcessSample(
                    source="host",
                    pid=7,
                    role="stub",
                    model="m",
                    instance_name="m_0_0",
                    cpu_pct=10.0 * (i + 1),
                ),
                ProcessSample(
                    source="host",
                    pid=8,
                    role="server",
                    cpu_pct=None if i in (3, 9, 10, 11) else 50.0,
                ),
            ],
        )
    cells = store.process_buckets(since=T0 + 5, until=T0 + 50, bucket_s=20.0)
    stub = [(c.bucket, c.sample_count, c.cpu_pct) for c in cells if c.pid == 7]
    # T0+5..T0+20 -> bucket 0 (samples 2..4), T0+25..T0+40 -> 1, T0+45..T0+50 -> 2.
    assert stub == [(0, 4, 35.0), (1, 4, 75.0), (2, 2, 105.0)]
    server = [(c.bucket, c.cpu_pct) for c in cells if c.pid == 8]
    assert server == [(0, 50.0), (1, 50.0), (2, None)]
    assert {(c.target, c.role, c.instance_name) for c in cells if c.pid == 7} == {
        ("host-1", "stub", "m_0_0")
    }
    assert all(c.sm_util_pct is None for c in cells)
    assert {(c.source, c.rss_bytes) for c in cells} == {("host", None)}  # means only
    with pytest.raises(ValueError, match="bucket_s"):
        store.process_buckets(since=T0, until=T0 + 1, bucket_s=0.0)


def test_findings_and_recommendations_read_back(store: Store) -> None:
    idle = replace(
        QUEUE_FINDING,
        kind="idle_capacity",
        subject="GPU-aaaa",
        summary="GPU idle 92% of the last hour",
        window_end=T0 + 3600,
        evidence={"sm_active_pct": 4.5, "samples": 720},
    )
    fid = store.add_finding(idle, created_at=T0 + 3600)
    rid = store.add_recommendation(a_recommendation())
    [finding] = store.findings(target="triton-a")
    assert (finding.id, finding.kind, finding.evidence, finding.resolved_at) == (
        fid,
        "idle_capacity",
        {"sm_active_pct": 4.5, "samples": 720},
        None,
    )
    assert store.findings(kind="queue_saturation") == []
    [rec] = store.recommendations(model="resnet")
    assert (rec.id, rec.recommendation, rec.kind, rec.status, rec.verification) == (
        rid,
        a_recommendation(),
        "tune",
        "open",
        None,
    )
    assert rec.recommendation.config_pbtxt.startswith("dynamic_batching")
    assert store.recommendations(status="kept") == []
    assert [r.id for r in store.recommendations(kind="tune", target="triton-a")] == [rid]


def a_recommendation(kind: str = "tune", created_at: float = T0 + 3600) -> Recommendation:
    """Every field set, nested records and evidence of every JSON type included."""
    current = BatcherConfig(
        max_batch_size=32,
        dynamic_batching=True,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=100,
    )
    proposed = replace(current, max_queue_delay_us=500, instance_count=2)
    return Recommendation(
        target="triton-a",
        model="resnet",
        created_at=created_at,
        kind=kind,
        changes=(
            ConfigChange("max_queue_delay_us", 100, 500),
            ConfigChange("instance_count", 1, 2),
        ),
        current_config=current,
        proposed_config=proposed,
        current=Prediction(
            qps=2000.0, p95_ms=25.0, p50_ms=11.0, avg_batch_size=6.5, busy_share=0.7
        ),
        predicted=Prediction(qps=2450.0, p95_ms=21.0),
        confidence=0.8,
        reason="batches of 8 cost little more than batches of 1",
        slo_p95_ms=30.0,
        config_pbtxt="dynamic_batching { max_queue_delay_microseconds: 500 }",
        config_json='{"name": "resnet"}',
        evidence={
            "fit_points": 4,
            "r2": 0.98,
            "source": "batch_stats",
            "probe": False,
            "slo": None,
        },
    )


def test_recommendation_outcome_is_its_status(store: Store) -> None:
    rid = store.add_recommendation(a_recommendation())
    other = store.add_recommendation(a_recommendation("probe", created_at=T0 + 4000))
    done = store.record_recommendation_outcome(
        rid, outcome="rolled_back", at=T0 + 3700, verification={"verdict": "p95 grew"}
    )
    assert (done.status, done.applied_at, done.verification, done.kind) == (
        "rolled_back",
        T0 + 3700,
        {"verdict": "p95 grew"},
        "tune",
    )
    assert done.recommendation == a_recommendation()
    assert [r.id for r in store.recommendations(status="open")] == [other]
    assert store.recommendations(status="rolled_back") == [done]
    failed = store.record_recommendation_outcome(
        other, outcome="failed", at=T0 + 4100, verification=None
    )
    assert (failed.status, failed.kind, failed.verification) == ("failed", "probe", None)
    with pytest.raises(ValueError, match="outcome"):
        store.record_recommendation_outcome(rid, outcome="probe", at=T0, verification=None)
    with pytest.raises(KeyError):
        store.record_recommendation_outcome(404, outcome="kept", at=T0, verification={})


# --------------------------------------------------------------------------- target health


def test_up_down_transitions(store: Store) -> None:
    first = scrape(store, T0)
    scrape(store, T0 + 5)
    scrape(store, T0 + 10, "timeout")
    down = scrape(store, T0 + 15, "down")
    back = scrape(store, T0 + 20)

    assert store.transitions("triton-a") == [
        TargetTransition("triton-a", "triton", T0, True),
        TargetTransition("triton-a", "triton", T0 + 10, False, "timeout", f"timeout at {T0 + 10}"),
        TargetTransition("triton-a", "triton", T0 + 20, True),
    ]
    assert (first.up, first.consecutive_failures) == (True, 0)
    assert (down.up, down.consecutive_failures, down.last_error_kind) == (False, 2, "down")
    assert down.last_seen_at == T0 + 5
    assert (back.up, back.consecutive_failures, back.last_error_kind, back.last_error) == (
        True,
        0,
        None,
        None,
    )
    [state] = store.targets()
    assert state == back
    assert (state.last_seen_at, state.last_scrape_at, state.last_duration_s) == (
        T0 + 20,
        T0 + 20,
        0.05,
    )


def test_other_sources_do_not_decide_a_triton_target(store: Store) -> None:
    scrape(store, T0)
    state = scrape(store, T0 + 1, "nvml_unavailable", source="nvml")
    assert (state.up, state.consecutive_failures, state.sources) == (
        True,
        0,
        {"nvml": False, "triton": True},
    )
    scrape(store, T0 + 2, "nvml_unavailable", source="nvml")  # still down: no new transition
    assert store.transitions("triton-a", source="nvml") == [
        TargetTransition(
            "triton-a", "nvml", T0 + 1, False, "nvml_unavailable", f"nvml_unavailable at {T0 + 1}"
        )
    ]


def test_host_target_is_up_when_every_source_is(store: Store) -> None:
    host = {"kind": "host", "target": "host-1"}
    assert scrape(store, T0, source="host", **host).up is True
    state = scrape(store, T0 + 1, "parse", source="nvml", **host)
    assert (state.up, state.consecutive_failures) == (False, 1)
    state = scrape(store, T0 + 2, source="host", **host)  # one source fine, the other not
    assert (state.up, state.consecutive_failures, state.last_error_kind) == (False, 1, "parse")
    state = scrape(store, T0 + 3, source="nvml", **host)
    assert (state.up, state.consecutive_failures, state.last_error_kind) == (True, 0, None)


def test_concurrent_scrapes_of_one_target_lose_no_update(store: Store) -> None:
    """Writers of one target serialise (BEGIN IMMEDIATE on SQLite, a row lock on
    PostgreSQL), so read-modify-write of the failure count is exact."""
    scrape(store, T0)
    errors: list[BaseException] = []

    def fail_many(n: int) -> None:
        try:
            for i in range(n):
                scrape(store, T0 + 1 + i, "down")
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=fail_many, args=(15,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    [state] = store.targets()
    assert (state.up, state.consecutive_failures) == (False, 90)
    assert [t.up for t in store.transitions("triton-a")] == [True, False]


# --------------------------------------------------------------------------- configs


def test_config_row_only_when_raw_json_changes(store: Store) -> None:
    store.write_triton(snapshot(T0))
    store.write_triton(snapshot(T0 + 5))
    changed = full_config(delay_us=500)
    store.write_triton(snapshot(T0 + 10, model_configs=(changed, full_config("mlp"))))
    store.write_triton(snapshot(T0 + 15, model_configs=(changed, full_config("mlp"))))
    store.write_triton(snapshot(T0 + 15, target="triton-b"))

    assert store.model_configs(target="triton-a", model="resnet") == [
        StoredModelConfig("triton-a", T0, full_config()),
        StoredModelConfig("triton-a", T0 + 10, changed),
    ]
    assert store.latest_model_configs("triton-a") == {
        ("triton-a", "resnet"): StoredModelConfig("triton-a", T0 + 10, changed),
        ("triton-a", "mlp"): StoredModelConfig("triton-a", T0 + 10, full_config("mlp")),
    }
    assert set(store.latest_model_configs()) == {
        ("triton-a", "resnet"),
        ("triton-a", "mlp"),
        ("triton-b", "resnet"),
    }


# --------------------------------------------------------------------------- rollups, retention


def write_series(store: Store, n: int, step_s: float = 10.0) -> None:
    """``n`` scrapes of resnet every ``step_s`` from T0; the first has no rates; the
    rate windows alternate in length so a weighted mean differs from a plain one."""
    for i in range(n):
        at = T0 + step_s * i
        rates = (
            {}
            if i == 0
            else {("resnet", "1"): full_rates(window_s=2 + 6 * (i % 2), requests_per_s=10.0 * i)}
        )
        store.write_triton(snapshot(at), rates)
        store.write_devices("host-1", at, [full_gpu("nvml", util=10.0 * i)])


def test_rollup_is_idempotent(store: Store) -> None:
    write_series(store, 18)  # T0 .. T0+170
    # Closed buckets at T0+125: [T0, T0+60) and [T0+60, T0+120); per bucket one row
    # for each of resnet, mlp and the nvml GPU and the Triton GPU.
    assert store.rollup(T0 + 125, bucket_s=60) == 8
    first = store.model_rollups()
    assert store.rollup(T0 + 125, bucket_s=60) == 0
    assert store.rollup(T0 + 119, bucket_s=60) == 0
    assert store.model_rollups() == first

    resnet = store.model_rollups(model="resnet", since=T0, until=T0)
    [bucket] = resnet
    assert (bucket.bucket_start, bucket.bucket_s, bucket.sample_count) == (T0, 60.0, 6)
    # Samples 1..5 (the first has no rates): windows 8,2,8,2,8 s at 10,20,30,40,50 req/s.
    windows, rps = [8, 2, 8, 2, 8], [10, 20, 30, 40, 50]
    assert bucket.rates is not None and bucket.peaks is not None
    assert bucket.rates.window_s == sum(windows)
    assert bucket.rates.requests_per_s == pytest.approx(
        sum(w * r for w, r in zip(windows, rps, strict=True)) / sum(windows)
    )
    assert bucket.peaks.requests_per_s == 50
    assert bucket.rates.avg_batch_size == pytest.approx(8.0)
    assert bucket.rates.resets == 5  # one per rated scrape in full_rates
    assert bucket.rates.fail_per_s_by_reason == {"REJECTED": pytest.approx(0.4)}
    assert bucket.pending_request_count == pytest.approx(3.0)
    assert bucket.pending_request_count_max == 3.0
    # The rollup is the merge of the stored per-scrape rates (the one arithmetic).
    raw = store.model_samples(model="resnet", since=T0, until=T0 + 59)
    assert bucket.rates == merge_over_time([s.rates for s in raw if s.rates is not None])
    assert bucket.peaks == peak_rates([s.rates for s in raw if s.rates is not None])
    [mlp] = store.model_rollups(model="mlp", since=T0, until=T0)
    assert (mlp.sample_count, mlp.rates, mlp.peaks) == (6, None, None)

    [gpu] = store.device_rollups(source="nvml", since=T0, until=T0)
    assert (gpu.target, gpu.uuid, gpu.kind, gpu.sample_count) == ("host-1", "GPU-aaaa", "gpu", 6)
    assert gpu.mean.utilization_gpu_pct == pytest.approx(25.0)  # mean of 0..50
    assert gpu.peak.utilization_gpu_pct == 50.0
    assert gpu.peak.memory_used_bytes == 80 * 2**30
    assert (gpu.mean.uuid, gpu.peak.uuid, gpu.mean.power_limit_w) == ("GPU-aaaa", "GPU-aaaa", None)

    assert store.rollup(T0 + 185, bucket_s=60) == 4  # the next bucket only
    assert len(store.model_rollups()) == 6
    assert len(store.device_rollups()) == 6
    # Another bucket size has its own progress.
    assert store.rollup(T0 + 185, bucket_s=180) == 4
    assert len(store.model_rollups(bucket_s=180)) == 2


def test_retention_keeps_what_was_not_rolled_up(store: Store) -> None:
    write_series(store, 18)  # T0 .. T0+170
    store.write_processes("host-1", T0, [ProcessSample("host", 1, "server")])
    scrape(store, T0)
    now = T0 + 10_000

    report = store.apply_retention(now, raw_keep_s=100, rollup_keep_s=100_000)
    # Nothing rolled up yet: raw model/device samples stay, however old.
    assert report == RetentionReport(server_samples=18, process_samples=1)
    assert len(store.model_samples()) == 36

    store.rollup(T0 + 125, bucket_s=60)  # rolls up [T0, T0+120)
    report = store.apply_retention(now, raw_keep_s=100, rollup_keep_s=100_000)
    assert (report.model_samples, report.batch_stats, report.device_samples) == (24, 24, 24)
    remaining = store.model_samples()
    assert min(s.collected_at for s in remaining) == T0 + 120
    assert len(remaining) == 12
    assert all(
        s.stats is not None and len(s.stats.batch_stats) == 2
        for s in remaining
        if s.model == "resnet"
    )
    # Configs and transitions are history, not samples.
    assert ("triton-a", "resnet") in store.latest_model_configs()
    assert len(store.transitions("triton-a")) == 1

    assert store.apply_retention(now, raw_keep_s=100, rollup_keep_s=100_000).total == 0
    report = store.apply_retention(now, raw_keep_s=100_000, rollup_keep_s=100)
    assert (report.model_rollups, report.device_rollups) == (4, 4)
    assert store.model_rollups() == []


def test_rollup_rejects_a_bad_bucket(store: Store) -> None:
    with pytest.raises(ValueError, match="bucket_s"):
        store.rollup(T0, bucket_s=0)


# --------------------------------------------------------------------------- opening


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "nosuchdb://somewhere/db",
        "sqlite:///{tmp}/missing/dir/batchscope.db",
        "postgresql+psycopg://batchscope:s3cret@127.0.0.1:1/nothing?connect_timeout=2",
    ],
)
def test_bad_url_is_a_config_error_naming_db_url(url: str, tmp_path: Path) -> None:
    # A URL that cannot work fails when the store is made, a database that cannot be
    # opened on first use.
    with pytest.raises(ConfigError) as caught:
        Store(url.format(tmp=tmp_path)).targets()
    assert caught.value.field == "db_url"
    assert "db_url" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_an_unreachable_database_fails_on_use_not_when_the_store_is_made(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path}/later/batchscope.db")
    with pytest.raises(ConfigError, match="db_url"):
        store.targets()
    with pytest.raises(ConfigError, match="db_url"):
        store.open()
    (tmp_path / "later").mkdir()  # the database becomes reachable: the same store works
    store.write_triton(snapshot())
    assert len(store.model_samples()) == 2
    store.close()
    with pytest.raises(ConfigError, match="unsupported"):
        Store("nosuchdb://somewhere/db")


def test_host_facts_keep_the_latest_per_target(store: Store) -> None:
    assert store.host_facts("triton-a") is None
    store.write_triton(snapshot())
    store.write_host_facts("triton-a", HostFacts("triton-a", T0, cpu_count=8))
    store.write_host_facts("triton-a", HostFacts("triton-a", T0 + 5, cpu_count=16))
    store.write_host_facts("triton-a", HostFacts("triton-a", T0 + 1, cpu_count=4))  # older
    store.write_host_facts("host-1", HostFacts("host-1", T0, cpu_count=2))
    assert store.host_facts("triton-a") == HostFacts("triton-a", T0 + 5, cpu_count=16)
    assert store.host_facts("host-1") == HostFacts("host-1", T0, cpu_count=2)
    assert {t.name: t.kind for t in store.targets()} == {"host-1": "host", "triton-a": "triton"}


def test_sqlite_file_runs_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "batchscope.db"
    with Store(f"sqlite:///{path}") as store:
        store.write_triton(snapshot())
        assert (tmp_path / "batchscope.db-wal").exists()
    with Store(f"sqlite:///{path}") as reopened:  # tables already there: no error
        assert len(reopened.model_samples()) == 2


def test_in_memory_sqlite_is_shared_between_threads() -> None:
    with Store("sqlite://") as store:
        worker = threading.Thread(target=store.write_triton, args=(snapshot(),))
        worker.start()
        worker.join()
        assert len(store.model_samples()) == 2


# --------------------------------------------------------------------------- findings lifecycle


def add_open_finding(store: Store, kind: str = "queue_saturation", subject: str = "resnet") -> int:
    return store.add_finding(replace(QUEUE_FINDING, kind=kind, subject=subject), created_at=T0 + 60)


def test_finding_is_updated_then_resolved(store: Store) -> None:
    fid = add_open_finding(store)
    other = add_open_finding(store, kind="idle_capacity", subject="GPU-aaaa")
    assert [f.id for f in store.active_findings()] == [fid, other]
    assert [f.id for f in store.active_findings(kind="idle_capacity")] == [other]
    assert store.active_findings(target="triton-b") == []

    updated = store.update_finding(
        fid,
        severity="critical",
        summary="queue 90% of request time",
        window_end=T0 + 120,
        evidence={"queue_share": 0.9, "reasons": "queue_share"},
    )
    assert updated == store.active_findings(kind="queue_saturation")[0]  # as stored
    assert (updated.severity, updated.window_start, updated.window_end, updated.created_at) == (
        "critical",
        T0,
        T0 + 120,
        T0 + 60,
    )
    assert updated.evidence == {"queue_share": 0.9, "reasons": "queue_share"}

    resolved = store.resolve_finding(fid, T0 + 300)
    assert resolved.resolved_at == T0 + 300
    assert store.resolve_finding(fid, T0 + 900).resolved_at == T0 + 300  # the first time stays
    assert [f.id for f in store.active_findings()] == [other]
    assert [f.resolved_at for f in store.findings(kind="queue_saturation")] == [T0 + 300]
    with pytest.raises(ValueError, match="resolved"):
        store.update_finding(fid, severity="info", summary="", window_end=T0, evidence={})
    with pytest.raises(KeyError):
        store.update_finding(404, severity="info", summary="", window_end=T0, evidence={})
    with pytest.raises(KeyError):
        store.resolve_finding(404, T0)


def test_detector_streaks_are_replaced_whole(store: Store) -> None:
    assert store.detector_streaks() == []
    first = [
        DetectorStreak("queue_saturation", "triton-a", "resnet", 2, 0, T0, T0 + 120),
        DetectorStreak("idle_capacity", "host-1", "GPU-aaaa", 0, 1, None, T0 + 120),
    ]
    store.replace_detector_streaks(first)
    assert store.detector_streaks() == sorted(first, key=lambda s: s.key)
    second = [replace(first[0], holding=3, evaluated_at=T0 + 180)]
    store.replace_detector_streaks(second)
    assert store.detector_streaks() == second
    store.replace_detector_streaks([])
    assert store.detector_streaks() == []
