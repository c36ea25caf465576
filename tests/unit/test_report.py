"""The terminal status table reads a status row's composed records by their names."""

from __future__ import annotations

from dataclasses import dataclass

from collector.records import BatcherConfig, ModelRates
from collector.report import render_status


@dataclass(frozen=True)
class Row:  # the shape of collector.analysis.status.ModelStatus
    target: str
    model: str
    version: str
    up: bool
    last_sample_at: float
    rates: ModelRates | None
    pending_request_count: float | None
    config: BatcherConfig | None


@dataclass(frozen=True)
class Report:
    models: list[Row]
    devices: list[object]
    processes: list[object]


def test_model_rows_show_rates_and_config_from_their_records() -> None:
    rates = ModelRates(window_s=60.0, requests_per_s=123.4, inferences_per_s=123.4,
                       executions_per_s=20.0, fail_per_s=0.0, avg_batch_size=6.17,
                       queue_us_per_request=850.0)
    config = BatcherConfig(max_batch_size=32, dynamic_batching=True,
                           preferred_batch_sizes=(8, 16), max_queue_delay_us=2000)
    rows = [Row("t", "m", "1", True, 1.0, rates, 2.0, config),
            Row("t", "idle", "1", True, 1.0, None, None, None)]
    text = render_status(Report(rows, [], []))  # type: ignore[arg-type]
    header, first, second = text.splitlines()
    assert header.split()[:5] == ["target", "model", "version", "qps", "infer/s"]
    cells = first.split()
    assert cells[:4] == ["t", "m", "1", "123"] and "6.17" in cells and "850" in cells
    assert "8,16" in cells and "yes" in cells and "2000" in cells
    assert second.split()[:3] == ["t", "idle", "1"] and set(second.split()[3:]) == {"-"}
