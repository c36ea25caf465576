"""Load on the dashboard and the exporter's ``/metrics`` (``bench.load``), on 127.0.0.1
only, over a store holding a week of 20 models: users view every page as Dash's
renderer does (the page, its layout and dependencies, and the callback POSTs of its
data and what the data feeds) and read ``/metrics``. No answer is a 5xx, none is
missing, and none is refused. The short run is part of every test run; the full one
(50 users for 2 minutes, samples every 60 s) only of ``make reliability``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.load import PAGES, LoadResult, percentile, render, run_load, seed, serve
from tests.reliability.conftest import FaultLedger


def _load(
    tmp_path: Path, *, users: int, duration_s: float, step_s: float
) -> tuple[LoadResult, float]:
    db = tmp_path / "week.db"
    seeded_s = seed(f"sqlite:///{db}", days=7, step=step_s, models=20)
    with serve(db, tmp_path) as services:
        result = run_load(
            services.dashboard_url, services.metrics_url, users=users, duration_s=duration_s
        )
        # Both servers outlived the load.
        assert services.dashboard.poll() is None and services.exporter.poll() is None
    print(render(result))
    return result, seeded_s


def _check(result: LoadResult) -> None:
    table = render(result)
    assert result.total("status_5xx") == 0, table
    assert result.total("no_answer") == 0, table
    assert result.total("status_4xx") == 0, table  # a browser's requests, all allowed
    # Every page was viewed through to its data callback, and /metrics was read.
    names = set(result.endpoints)
    for page in PAGES:
        assert f"GET {page.partition('?')[0]}" in names, table
    for data in ("overview", "model", "recs", "findings", "alerts", "devices"):
        assert f"POST callback {data}-data" in names, table
    assert result.endpoints["GET /metrics"].requests > 0, table


def _figures(result: LoadResult) -> str:
    everything = [s for e in result.endpoints.values() for s in e.latencies_s]
    worst = max(result.endpoints.items(), key=lambda kv: percentile(kv[1].latencies_s, 0.95))
    metrics = result.endpoints["GET /metrics"].latencies_s
    return (
        f"{result.total('requests')} requests ({result.page_views} page views) in "
        f"{result.duration_s:.0f} s: all requests p50 {percentile(everything, 0.5) * 1000:.0f} ms, "
        f"p95 {percentile(everything, 0.95) * 1000:.0f} ms, max {max(everything) * 1000:.0f} ms; "
        f"slowest endpoint {worst[0]} p95 {percentile(worst[1].latencies_s, 0.95) * 1000:.0f} ms; "
        f"/metrics p95 {percentile(metrics, 0.95) * 1000:.0f} ms; 0 5xx, 0 4xx, 0 without answer"
    )


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s"


@pytest.mark.parametrize(
    ("users", "duration_s", "step_s"),
    [
        pytest.param(10, 10.0, 1800.0, id="10-users-10s"),
        pytest.param(50, 120.0, 60.0, id="50-users-2min", marks=pytest.mark.long),
    ],
)
def test_load_on_dashboard_and_metrics(
    users: int, duration_s: float, step_s: float, tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    result, seeded_s = _load(tmp_path, users=users, duration_s=duration_s, step_s=step_s)
    _check(result)
    fault_ledger.record(
        area="load",
        fault=f"{users} users for {_span(duration_s)} on every dashboard page and /metrics "
        f"(a week of 20 models sampled every {_span(step_s)})",
        tries=result.total("requests"),
        outcome=_figures(result) + f"; store seeded in {seeded_s:.1f} s",
    )
