"""The overview judged from now: a target not scraped lately is not up and its rows
are greyed without live figures; a host without NVIDIA GPU is up, with one quiet
note and no alert."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.records import HostFacts
from collector.store import Store
from collector.synthetic import Load, model_config, scrape_ok, steady_load
from dashboard import components
from dashboard.queries import DashboardQueries

T0 = 1_000_000.0
LOAD = Load(
    config=model_config("m", batching=False),
    qps=50.0,
    request_ms=10.0,
    queue_share=0.2,
    batch_mix={1: 1.0},
    cost_ms=lambda b: 4.0,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path}/o.db")
    steady_load(s, [LOAD], target="triton", start=T0, seconds=60, step=1.0)
    scrape_ok(s, "triton", T0 + 60)
    try:
        yield s
    finally:
        s.close()


def _texts(node: object) -> list[str]:
    out: list[str] = []
    children = getattr(node, "children", node)
    if isinstance(children, str):
        return [children]
    for child in children if isinstance(children, list) else [children] if children else []:
        out += _texts(child)
    return out


def _row(store: Store, now: float) -> tuple[str, list[str]]:
    data = DashboardQueries(store, clock=lambda: now).overview(window_s=60.0)
    table = components.models_table(data.models)
    (row,) = table.children[1].children
    return row.className, _texts(row)


def test_a_live_target_shows_its_figures(store: Store) -> None:
    cls, texts = _row(store, T0 + 61)
    assert cls == "" and "50.0" in texts


def test_a_target_not_scraped_lately_is_greyed_without_live_figures(store: Store) -> None:
    now = T0 + 60 + 157
    cls, texts = _row(store, now)
    assert "50.0" not in texts
    assert "row-not-live" in cls and "stale" in texts
    data = DashboardQueries(store, clock=lambda: now).overview(window_s=60.0)
    summary = " ".join(_texts(components.overview_summary(data)))
    assert "0/1" in summary
    (tile,) = data.targets
    assert tile.now == "stale"
    assert data.stale and any("not live" in m for m in components.overview_messages(data))


def test_a_host_without_nvidia_gpu_is_up_with_one_quiet_note(store: Store) -> None:
    from dashboard.components.overview import NO_GPU_TEXT, host_notes

    for at in (T0 + 59, T0 + 60):
        store.write_host_facts(
            "cpu-vm",
            HostFacts(target="cpu-vm", collected_at=at, cpu_count=4, nvml_absent="no library"),
        )
        store.record_scrape(
            "cpu-vm",
            "nvml",
            kind="host",
            started_at=at,
            duration_s=0.01,
            error_kind=None,
            error=None,
            interval_s=1.0,
        )
    data = DashboardQueries(store, clock=lambda: T0 + 61).overview(window_s=60.0)
    assert components.overview_messages(data) == []
    assert "2/2" in " ".join(_texts(components.overview_summary(data)))
    (note,) = host_notes(data)
    assert NO_GPU_TEXT in note.children and "cpu-vm" in note.children
    assert "banner" not in note.className
    view = DashboardQueries(store, clock=lambda: T0 + 61).devices(range_name="5m")
    assert view.no_gpu_hosts == {"cpu-vm": "no library"}


def test_the_overview_shows_p95_where_triton_publishes_it(tmp_path: Path) -> None:
    """Triton's request summary (``summary_latencies=true``) gives the p95 column."""
    from collector.records import ModelMetrics, TritonSnapshot
    from collector.sources.triton_metrics import REQUEST_SUMMARY

    s = Store(f"sqlite:///{tmp_path}/p95.db")
    try:
        for i in range(5):
            n = 100.0 * i
            metrics = ModelMetrics(
                model="m",
                version="1",
                request_success=n,
                inference_count=n,
                exec_count=n,
                request_duration_us=20_000 * n,
                summary_quantiles_us={REQUEST_SUMMARY: {0.5: 18_000.0, 0.95: 48_250.0}},
            )
            s.write_triton(
                TritonSnapshot(target="triton", collected_at=T0 + i, model_metrics=(metrics,))
            )
        scrape_ok(s, "triton", T0 + 4)
        data = DashboardQueries(s, clock=lambda: T0 + 5).overview(window_s=60.0)
        table = components.models_table(data.models)
        header = _texts(table.children[0])
        (row,) = table.children[1].children
        cells = dict(zip(header, [" ".join(_texts(td)) for td in row.children], strict=True))
        assert cells["p95 ms"] == "48.2"
        assert cells["QPS"] == "100.0"
    finally:
        s.close()
