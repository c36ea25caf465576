"""The terminal status table reads a status row's composed records by their names."""

from __future__ import annotations

from collector.analysis.status import ModelStatus, ProcessStatus, StatusReport
from collector.records import BatcherConfig, ModelRates, ProcessSample
from collector.report import render_status


def test_model_rows_show_rates_and_config_from_their_records() -> None:
    rates = ModelRates(
        window_s=60.0,
        requests_per_s=123.4,
        inferences_per_s=123.4,
        executions_per_s=20.0,
        fail_per_s=0.0,
        avg_batch_size=6.17,
        queue_us_per_request=850.0,
    )
    config = BatcherConfig(
        max_batch_size=32,
        dynamic_batching=True,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=2000,
    )
    rows = [
        ModelStatus("t", "m", "1", True, 1.0, rates, 2.0, config),
        ModelStatus("t", "idle", "1", True, 1.0, None, None, None),
    ]
    text = render_status(StatusReport(generated_at=1.0, window_s=60.0, models=rows))
    header, first, second = text.splitlines()
    assert header.split()[:5] == ["target", "model", "version", "qps", "infer/s"]
    cells = first.split()
    assert cells[:4] == ["t", "m", "1", "123"] and "6.17" in cells and "850" in cells
    assert "8,16" in cells and "yes" in cells and "2000" in cells
    assert second.split()[:3] == ["t", "idle", "1"] and set(second.split()[3:]) == {"-"}


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
