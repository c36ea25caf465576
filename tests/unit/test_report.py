"""The terminal status table reads a status row's composed records by their names,
and fits a 120-column terminal."""

from __future__ import annotations

from collector.analysis.status import DeviceStatus, ModelStatus, ProcessStatus, StatusReport
from collector.records import BatcherConfig, DeviceSample, HostFacts, ModelRates, ProcessSample
from collector.report import render_status
from collector.store import TargetState

TERMINAL_COLUMNS = 120

RATES = ModelRates(
    window_s=60.0,
    requests_per_s=123.4,
    inferences_per_s=123.4,
    executions_per_s=20.0,
    fail_per_s=0.0,
    avg_batch_size=6.17,
    queue_us_per_request=850.0,
    request_us_per_request=21_500.0,
    queue_share=0.25,
    busy_share=0.5,
)
CONFIG = BatcherConfig(
    max_batch_size=32,
    dynamic_batching=True,
    preferred_batch_sizes=(8, 16),
    max_queue_delay_us=2000,
)


def _model(target: str, model: str, *, rates: ModelRates | None, state: str = "up") -> ModelStatus:
    return ModelStatus(
        target=target,
        model=model,
        version="1",
        up=state == "up",
        state=state,
        last_sample_at=1.0,
        rates=rates,
        pending_request_count=2.0 if rates else None,
        config=CONFIG if rates else None,
        request_p95_us=48_000.0 if rates else None,
    )


def test_model_rows_show_rates_and_config_from_their_records() -> None:
    rows = [_model("t", "m", rates=RATES), _model("t", "idle", rates=None, state="stale")]
    text = render_status(StatusReport(generated_at=1.0, window_s=60.0, models=rows))
    table, configs = text.split("\n\n")
    header, first, second = table.splitlines()
    assert header.split()[:6] == ["target", "model", "ver", "state", "qps", "batch"]
    cells = dict(zip(header.split(), first.split(), strict=False))
    assert (cells["model"], cells["state"], cells["qps"], cells["batch"]) == (
        "m",
        "up",
        "123",
        "6.17",
    )
    assert (cells["queue"], cells["busy"], cells["req_ms"], cells["p95_ms"]) == (
        "25%",
        "50%",
        "21.5",
        "48",
    )
    config_header, config_row = configs.splitlines()  # the stale row has no config
    config = dict(zip(config_header.split(), config_row.split(), strict=True))
    assert (config["model"], config["dynamic_batching"], config["preferred"]) == (
        "m",
        "yes",
        "8,16",
    )
    assert (config["max_delay_us"], config["max_batch"]) == ("2000", "32")
    assert second.split()[:4] == ["t", "idle", "1", "stale"] and set(second.split()[4:]) == {"-"}


def test_process_rows_show_the_window_mean_cpu_and_the_nvml_reading() -> None:
    host = ProcessSample(
        source="host", pid=42, role="stub", model="m", cpu_pct=90.0, rss_bytes=1000
    )
    gpu = ProcessSample(source="nvml", pid=42, role="gpu", sm_util_pct=37.0)
    process = ProcessStatus(target="t", last_sample_at=1.0, sample=host, cpu_pct_mean=55.5, gpu=gpu)
    text = render_status(StatusReport(generated_at=1.0, window_s=60.0, processes=[process]))
    header, row = text.splitlines()[-2:]
    cells = dict(zip(header.split(), row.split(), strict=True))
    assert cells["pid"] == "42" and cells["model"] == "m"
    assert cells["cpu_pct"] == "55.5"  # the window's mean, not the latest tick's 90
    assert cells["sm_util_pct"] == "37"


def test_the_demos_status_fits_a_120_column_terminal() -> None:
    """The demo's own target (host:port) and models, every column filled."""
    rows = [
        ModelStatus("127.0.0.1:39821", model, "1", True, 1.0, RATES, 2.0, CONFIG)
        for model in ("batched", "unbatched")
    ]
    text = render_status(StatusReport(generated_at=1.0, window_s=60.0, models=rows))
    assert max(len(line) for line in text.splitlines()) <= TERMINAL_COLUMNS


def _long_named_report() -> StatusReport:
    from collector.analysis.health import Health, HealthState
    from collector.analysis.status import TargetStatus

    now = 1_000.0
    triton = "triton-inference-server-prod-eu-west-1.internal.example.com:8000"
    host = "gpu-node-a100-07.cluster.internal.example.com"
    models = [
        _model(triton, "resnet50_onnx_tensorrt_fp16_dynamic_batching_v2", rates=RATES),
        _model(triton, "bert_large_uncased_whole_word_masking_squad", rates=RATES),
        _model("127.0.0.1:39821", "unbatched", rates=None, state="stale"),
    ]
    targets = [
        TargetStatus(
            target=TargetState(name=triton, kind="triton", up=True, last_seen_at=now - 2),
            health=Health(HealthState.UP, "scraped", now - 2),
        ),
        TargetStatus(
            target=TargetState(
                name="127.0.0.1:39821",
                kind="triton",
                up=False,
                last_error="connection refused by 127.0.0.1:39821 (is Triton running there?)",
            ),
            health=Health(HealthState.DOWN, "its latest scrape failed", now - 157),
        ),
        TargetStatus(
            target=TargetState(name=host, kind="host", up=True, last_seen_at=now - 1),
            health=Health(HealthState.UP, "scraped", now - 1),
            facts=HostFacts(target=host, collected_at=now, cpu_count=16, nvml_absent="no library"),
        ),
    ]
    device = DeviceSample(
        source="nvml",
        uuid="GPU-5d7e3c1a-9b2f-4e6d-8a1c-0f3b2e4d6c8a",
        index=0,
        name="NVIDIA H200 NVL with an unusually long marketing name",
        utilization_gpu_pct=97.0,
        sm_active_pct=88.5,
        memory_used_bytes=80 * 2**30,
        memory_total_bytes=141 * 2**30,
        power_w=612.4,
    )
    stub = ProcessSample(
        source="host",
        pid=4_194_303,
        role="stub",
        model="resnet50_onnx_tensorrt_fp16_dynamic_batching_v2",
        instance_name="resnet50_onnx_tensorrt_fp16_dynamic_batching_v2_0_0",
        rss_bytes=3 * 2**30,
    )
    return StatusReport(
        generated_at=now,
        window_s=60.0,
        targets=targets,
        models=models,
        devices=[DeviceStatus(target=host, last_sample_at=now, sample=device)],
        processes=[
            ProcessStatus(target=triton, last_sample_at=now, sample=stub, cpu_pct_mean=97.2)
        ],
    )


def test_status_fits_a_120_column_terminal_with_long_names() -> None:
    text = render_status(_long_named_report())
    lines = text.splitlines()
    too_long = [line for line in lines if len(line) > TERMINAL_COLUMNS]
    assert too_long == [], "\n".join(too_long)
    # Names are cut, figures are not: every row still shows its figures.
    assert any("resnet50_onnx" in line and "123" in line and "6.17" in line for line in lines)
    assert any("no NVIDIA GPU on this host" in line for line in lines)
    assert any("down" in line and "connection refused" in line for line in lines)
    assert any("88.5" in line and "612" in line for line in lines)
