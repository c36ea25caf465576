"""Everything is judged from *now*: a target's state (``health.target_health``), the
status window (it ends at now, and a series without a fresh sample has no rates), the
scrape interval the store keeps, and a failure count that starts from zero each run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.analysis import health
from collector.analysis.status import build_status
from collector.config import Settings
from collector.errors import CollectError
from collector.records import DeviceSample, ModelMetrics, ProcessSample, TritonSnapshot
from collector.scheduler import CollectorService
from collector.store import Store, TargetState

T0 = 1_700_000_000.0


def _state(
    *,
    up: bool | None = True,
    seen: float | None = T0,
    scraped: float | None = T0,
    interval: float | None = 1.0,
) -> TargetState:
    return TargetState(
        name="t",
        kind="triton",
        up=up,
        last_seen_at=seen,
        last_scrape_at=scraped,
        interval_s=interval,
    )


def test_a_target_is_up_only_while_its_last_good_scrape_is_fresh() -> None:
    fresh = _state()
    # One-second interval: stale after the five-second floor.
    assert health.target_health(fresh, T0 + 4.9, collector_runs=True).state is health.HealthState.UP
    late = health.target_health(fresh, T0 + 5.1, collector_runs=True)
    assert late.state is health.HealthState.DOWN and not late.up
    assert "no successful scrape for 5 s" in late.reason
    # Ten-second interval: three intervals.
    slow = _state(interval=10.0)
    assert health.target_health(slow, T0 + 29, collector_runs=True).state is health.HealthState.UP
    assert health.target_health(slow, T0 + 31, collector_runs=True).state is health.HealthState.DOWN


def test_a_failed_latest_scrape_is_down_and_never_scraped_is_unknown() -> None:
    failed = _state(up=False, seen=T0 - 1, scraped=T0)
    assert (
        health.target_health(failed, T0 + 1, collector_runs=True).state is health.HealthState.DOWN
    )
    never = _state(up=None, seen=None, scraped=None)
    assert health.target_health(never, T0, collector_runs=True).state is health.HealthState.UNKNOWN


def test_with_no_collector_running_every_target_is_stale_not_up() -> None:
    # Both targets were last scraped 157 s ago, the newest of them up: nothing runs.
    a, b = _state(), _state(up=False, seen=T0 - 30)
    healths = health.target_healths([a, b], T0 + 157)
    assert [h.state for h in healths] == [health.HealthState.STALE, health.HealthState.STALE]
    assert "no collector has scraped it for 3 min" in healths[0].reason
    assert healths[0].last_seen_at == T0
    # While another target is scraped, the old one is down instead.
    live = _state(seen=T0 + 156, scraped=T0 + 156)
    assert [h.state for h in health.target_healths([a, live], T0 + 157)] == [
        health.HealthState.DOWN,
        health.HealthState.UP,
    ]


# --------------------------------------------------------------------------- the store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path}/now.db")
    try:
        yield s
    finally:
        s.close()


def _scrape(store: Store, at: float, *, ok: bool = True, first: bool = False) -> TargetState:
    return store.record_scrape(
        "triton",
        "triton",
        kind="triton",
        started_at=at,
        duration_s=0.01,
        error_kind=None if ok else "connect",
        error=None if ok else "connection refused",
        interval_s=0.5,
        first_in_run=first,
    )


def test_the_store_keeps_the_interval_a_target_is_scraped_at(store: Store) -> None:
    _scrape(store, T0)
    (state,) = store.targets()
    assert state.interval_s == 0.5
    assert health.target_healths([state], T0 + 4)[0].up
    assert not health.target_healths([state], T0 + 6)[0].up


def test_the_failures_in_a_row_start_from_zero_in_a_new_run(store: Store) -> None:
    for i in range(5):
        _scrape(store, T0 + i, ok=False, first=i == 0)
    assert _scrape(store, T0 + 5, ok=False).consecutive_failures == 6
    # A collector starts again: its first failed scrape is the first in a row.
    assert _scrape(store, T0 + 100, ok=False, first=True).consecutive_failures == 1


class _Failing:
    name = "nvml"
    target = "host-a"

    def collect(self) -> list[object]:
        raise CollectError("NVML initialisation failed: Unknown Error (error 999)")

    def close(self) -> None:
        pass


def test_a_collector_run_counts_its_source_failures_from_zero(store: Store, tmp_path: Path) -> None:
    """The failed-scrape count a host shows is this run's, not every run's so far."""
    settings = Settings(db_url=f"sqlite:///{tmp_path}/now.db", interval_s=0.5)
    for run in range(2):
        ticks = iter(T0 + 100 * run + t for t in range(100))
        service = CollectorService(
            settings, store, [_Failing()], clock=lambda ticks=ticks: next(ticks)
        )
        for _ in range(3):
            service.run_source(_Failing())  # type: ignore[arg-type]
            service._health[("nvml", "host-a")].next_attempt_at = 0.0  # no backoff wait
        (state,) = store.targets()
        assert state.consecutive_failures == 3, f"run {run}"
    assert state.interval_s == 0.5


# --------------------------------------------------------------------------- status


def _metrics(requests: float) -> ModelMetrics:
    return ModelMetrics(
        model="m",
        version="1",
        request_success=requests,
        inference_count=requests,
        exec_count=requests,
        request_duration_us=1000 * requests,
        pending_request_count=2.0,
    )


def _seed_until(store: Store, last: float) -> None:
    """Scrapes every 5 s from T0 to ``last``: 20 requests/s until T0+75, 40/s after;
    a device and a process each tick; the target's last good scrape at ``last``."""
    requests = 0.0
    t = T0
    while t <= last:
        store.write_triton(
            TritonSnapshot(target="triton", collected_at=t, model_metrics=(_metrics(requests),))
        )
        store.write_devices(
            "triton", t, [DeviceSample(source="triton", uuid="GPU-A", utilization_gpu_pct=50.0)]
        )
        store.write_processes(
            "triton", t, [ProcessSample(source="host", pid=7, role="server", cpu_pct=10.0)]
        )
        requests += 5 * (20.0 if t < T0 + 75 else 40.0)
        t += 5
    store.record_scrape(
        "triton",
        "triton",
        kind="triton",
        started_at=last,
        duration_s=0.01,
        error_kind=None,
        error=None,
    )  # no interval kept: the default five seconds


def test_the_status_window_ends_now_not_at_the_newest_sample(store: Store) -> None:
    _seed_until(store, T0 + 100)
    # At T0+110 the newest sample (T0+100) is still fresh (three 5 s intervals); the
    # 30 s window is [T0+80, T0+110]: only the 40/s part.
    report = build_status(store, window_s=30.0, now=T0 + 110)
    (m,) = report.models
    assert m.up and m.rates is not None
    assert m.rates.requests_per_s == pytest.approx(40.0)


def test_a_series_without_a_fresh_sample_has_no_rates_and_is_not_up(store: Store) -> None:
    _seed_until(store, T0 + 100)
    report = build_status(store, window_s=60.0, now=T0 + 100 + 157)
    (m,) = report.models
    assert not m.up
    assert (m.rates, m.pending_request_count) == (None, None)
    assert report.devices == [] and report.processes == []
    assert m.state == "stale"  # nothing scraped any target since
    (target,) = report.targets
    assert target.health.state is health.HealthState.STALE
    document = report.to_json_dict()
    assert document["models"][0]["up"] is False  # type: ignore[index]
    assert document["models"][0]["rates"] is None  # type: ignore[index]
