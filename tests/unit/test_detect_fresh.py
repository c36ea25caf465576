"""No finding from a window without fresh samples: detection reads only series and
devices whose newest reading is current at the time of the evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.analysis.detect import DetectorSettings, read_window, run_detectors
from collector.records import DeviceSample
from collector.store import Store
from collector.synthetic import Load, model_config, scrape_ok, steady_load

T0 = 1_000_000.0
SETTINGS = DetectorSettings(window_s=60.0, sustain=1)
# Twelve requests wait on average, yet each runs alone: a "batching off" finding.
UNBATCHED = Load(
    config=model_config("unbatched", batching=False),
    qps=180.0,
    request_ms=85.0,
    queue_share=0.9,
    batch_mix={1: 1.0},
    cost_ms=lambda b: 4.5,
    pending=12.0,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path}/d.db")
    steady_load(s, [UNBATCHED], target="triton", start=T0, seconds=60, step=1.0)
    for i in range(61):
        s.write_devices(
            "triton",
            T0 + i,
            [DeviceSample(source="triton", uuid="GPU-A", utilization_gpu_pct=3.0)],
        )
    scrape_ok(s, "triton", T0 + 60)  # no interval kept: the default five seconds
    try:
        yield s
    finally:
        s.close()


def test_a_fresh_window_is_evaluated(store: Store) -> None:
    window = read_window(store, SETTINGS, now=T0 + 61)
    assert [m.model for m in window.models] == ["unbatched"]
    assert [d.uuid for d in window.devices] == ["GPU-A"]
    assert run_detectors(store, SETTINGS, now=T0 + 61)


def test_a_window_whose_newest_sample_is_stale_gives_no_finding(store: Store) -> None:
    # 20 s after the last scrape the window still holds 40 s of samples, none fresh.
    now = T0 + 80
    window = read_window(store, SETTINGS, now=now)
    assert window.models == () and window.devices == ()
    assert run_detectors(store, SETTINGS, now=now) == []
