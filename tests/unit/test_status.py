"""``batchscope status`` and the overview's rows: a status composes the records it
shows (``ModelRates``, ``BatcherConfig``, ``DeviceSample``, ``ProcessSample``), and its
JSON document (``status --json``) is pinned by a golden file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.analysis.status import StatusReport, build_status
from collector.records import (
    BatchStat,
    DeviceSample,
    Duration,
    ModelConfig,
    ModelMetrics,
    ModelStats,
    ProcessSample,
    TritonSnapshot,
)
from collector.store import Store

T0 = 1_700_000_000.0
GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "status_golden.json"


def _config(model: str, *, batching: bool) -> ModelConfig:
    doc = {"name": model, "max_batch_size": 8}
    return ModelConfig(
        model=model,
        max_batch_size=8,
        dynamic_batching=batching,
        preferred_batch_sizes=(4,) if batching else (),
        max_queue_delay_us=100 if batching else 0,
        instance_count=1,
        instance_kind="KIND_GPU",
        raw_json=json.dumps(doc),
    )


def _metrics(model: str, version: str, i: int) -> ModelMetrics:
    """Scrape ``i`` of a steady load: 20 requests/s of 2 samples each, in batches of 4,
    1 ms per request of which 250 µs queued, 0.4 rejections/s."""
    n = 100.0 * i
    return ModelMetrics(
        model=model,
        version=version,
        request_success=n,
        inference_count=2 * n,
        exec_count=n / 2,
        request_duration_us=1000 * n,
        queue_duration_us=250 * n,
        compute_input_duration_us=50 * n,
        compute_infer_duration_us=700 * n,
        request_failure_by_reason={"REJECTED": 2.0 * i},
        pending_request_count=3.0,
    )


def _stats(model: str, version: str, i: int) -> ModelStats:
    """Batches of 4 that keep one instance busy half the time."""
    executions = 50 * i
    return ModelStats(
        model=model,
        version=version,
        inference_count=200 * i,
        execution_count=executions,
        batch_stats=(
            BatchStat(batch_size=4, compute_infer=Duration(executions, 2_500_000_000 * i)),
        ),
    )


def _seed(store: Store) -> None:
    """Two Triton targets on two machines, each with a server of pid 77 (pids repeat
    across machines); host-1's NVML sees GPU-A (which triton-a reports) and two GPU
    processes, one of them triton-a's server; host-2's NVML sees GPU-B (triton-b's)."""
    for i in range(3):
        at = T0 + 5 * i
        store.write_triton(
            TritonSnapshot(
                target="triton-a",
                collected_at=at,
                model_metrics=(_metrics("m", "1", i),)
                + (
                    (ModelMetrics(model="solo", version="1", request_success=5.0),)
                    if i == 2
                    else ()
                ),
                model_stats=(_stats("m", "1", i),),
                model_configs=(_config("m", batching=True),),
                gpus=(
                    DeviceSample(source="triton", uuid="GPU-A", index=0, utilization_gpu_pct=40.0),
                ),
            )
        )
        store.write_triton(
            TritonSnapshot(
                target="triton-b",
                collected_at=at,
                model_metrics=(_metrics("m", "2", i),),
                model_configs=(_config("m", batching=False),),
                gpus=(
                    DeviceSample(source="triton", uuid="GPU-B", index=0, utilization_gpu_pct=90.0),
                ),
            )
        )
        store.write_devices(
            "host-1",
            at,
            [
                DeviceSample(
                    source="nvml",
                    uuid="GPU-A",
                    index=0,
                    name="H200",
                    utilization_gpu_pct=40.0,
                    sm_active_pct=35.0,
                    memory_used_bytes=2**30,
                    memory_total_bytes=2**37,
                    power_w=150.0,
                )
            ],
        )
        store.write_devices(
            "host-2",
            at,
            [
                DeviceSample(
                    source="nvml", uuid="GPU-B", index=0, name="H200", utilization_gpu_pct=90.0
                )
            ],
        )
        store.write_processes(
            "host-1",
            at,
            [
                ProcessSample(
                    source="nvml",
                    pid=77,
                    role="gpu",
                    gpu_uuid="GPU-A",
                    sm_util_pct=30.0,
                    mem_util_pct=10.0,
                    gpu_memory_bytes=2**30,
                ),
                ProcessSample(source="nvml", pid=99, role="gpu", gpu_uuid="GPU-A", sm_util_pct=5.0),
            ],
        )
        store.write_processes(
            "triton-a",
            at,
            [
                ProcessSample(
                    source="host", pid=77, role="server", cpu_pct=10.0 + 10.0 * i, rss_bytes=2**28
                ),
                ProcessSample(
                    source="host",
                    pid=78,
                    role="stub",
                    model="m",
                    instance_name="m_0_0",
                    cpu_pct=50.0,
                    rss_bytes=2**27,
                ),
            ]
            + ([ProcessSample(source="host", pid=60, role="stub", model="gone")] if i == 0 else []),
        )
        store.write_processes(
            "triton-b", at, [ProcessSample(source="host", pid=77, role="server", cpu_pct=5.0)]
        )
    store.record_scrape(
        "triton-a",
        "triton",
        kind="triton",
        started_at=T0 + 10,
        duration_s=0.1,
        error_kind=None,
        error=None,
    )
    store.record_scrape(
        "triton-b",
        "triton",
        kind="triton",
        started_at=T0 + 10,
        duration_s=0.1,
        error_kind="connection",
        error="refused",
    )


@pytest.fixture
def report(tmp_path: Path) -> Iterator[StatusReport]:
    store = Store(f"sqlite:///{tmp_path}/status.db")
    try:
        _seed(store)
        yield build_status(store, window_s=60.0, now=T0 + 12)
    finally:
        store.close()


def test_status_json_is_the_golden_document(report: StatusReport) -> None:
    """The nested shape: a model's ``rates`` and ``config`` under the records' own
    field names, a device's ``sample``, a process's ``sample`` and ``gpu``."""
    document = json.loads(json.dumps(report.to_json_dict()))
    assert document == json.loads(GOLDEN.read_text())


def test_model_status_holds_its_rates_and_config(report: StatusReport) -> None:
    m = next(s for s in report.models if (s.target, s.model) == ("triton-a", "m"))
    assert m.up and m.rates is not None and m.config is not None
    assert m.rates.requests_per_s == pytest.approx(20.0)
    assert m.rates.avg_batch_size == pytest.approx(4.0)
    assert m.rates.queue_share == pytest.approx(0.25)
    assert m.rates.busy_share == pytest.approx(0.5)
    assert m.rates.fail_per_s_by_reason == {"REJECTED": pytest.approx(0.4)}
    assert m.pending_request_count == 3.0
    assert (m.config.dynamic_batching, m.config.preferred_batch_sizes) == (True, (4,))
    # One sample and no config: no rates, no config, still listed.
    solo = next(s for s in report.models if s.model == "solo")
    assert (solo.rates, solo.config) == (None, None)
    assert not next(s for s in report.models if s.target == "triton-b").up


def test_two_targets_with_the_same_pid_do_not_get_each_others_gpu_readings(
    report: StatusReport,
) -> None:
    """NVML's reading of pid 77 on host-1 joins triton-a's server (triton-a reports
    GPU-A, which host-1's NVML sees), never triton-b's pid 77 on another machine."""
    by_key = {(p.target, p.sample.pid): p for p in report.processes}
    a_server, b_server = by_key[("triton-a", 77)], by_key[("triton-b", 77)]
    assert a_server.gpu is not None and a_server.gpu.sm_util_pct == 30.0
    assert b_server.gpu is None
    assert a_server.cpu_pct_mean == pytest.approx(20.0)
    # host-1's pid 77 is triton-a's server, not a process of its own; pid 99 is.
    assert ("host-1", 77) not in by_key
    assert by_key[("host-1", 99)].sample.role == "gpu"
    # A process missing from its target's newest tick has gone.
    assert ("triton-a", 60) not in by_key


def test_devices_hold_their_latest_sample(report: StatusReport) -> None:
    assert [(d.target, d.sample.source, d.sample.uuid) for d in report.devices] == [
        ("host-1", "nvml", "GPU-A"),
        ("host-2", "nvml", "GPU-B"),
        ("triton-a", "triton", "GPU-A"),
        ("triton-b", "triton", "GPU-B"),
    ]
    assert report.devices[0].sample.sm_active_pct == 35.0
    assert report.devices[0].last_sample_at == T0 + 10
