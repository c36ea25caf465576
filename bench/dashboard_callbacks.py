"""How long the dashboard's callbacks take over a week of data for 20 models.

Fills a SQLite store (or ``--db URL``) the way a week of collection leaves it: 20
models scraped every 5 s for 7 days through ``Store.write_triton``, with the
housekeeping's rollups every simulated hour, an episode (a finding resolved after ten
minutes) per model and hour, plus an open finding and a recommendation per model; two
GPUs (one split into two MIG instances) every 5 s for the week, and one model-instance
process per model for the last 6 h. Then it times what each page's
callbacks do — the query module's read and the figure/component builds, serialised as
Dash would send them — ``--repeat`` times each, and prints the p50, p95 and max per
callback against the 1 s target.

Filling takes minutes (about 121 000 scrapes of 20 models); ``--keep FILE`` keeps the
store so ``--reuse FILE`` can time again without filling.

Usage: ``python -m bench.dashboard_callbacks [--days 7] [--step 5] [--models 20]
[--repeat 20] [--keep FILE | --reuse FILE]``. (Not ``bench/dashboard.py``: a script of
that name would shadow the ``dashboard`` package it times.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.io

from collector.records import DeviceSample, ProcessSample
from collector.store import Store
from collector.synthetic import Load, model_config, scrape_ok, steady_load, store_recommendation
from dashboard import components, figures
from dashboard.queries import DashboardQueries, to_json

TARGET = "triton-a"
HOST = "gpu-host"
GIB = 2**30
TARGET_S = 1.0  # each callback's p95 must stay below this


def _loads(models: int) -> list[Load]:
    out = []
    for i in range(models):
        batching = i % 2 == 0
        config = model_config(
            f"model_{i:02d}",
            batching=batching,
            preferred=(8, 16) if batching else (),
            delay_us=2000,
        )
        out.append(
            Load(
                config=config,
                qps=50.0 + 10 * i,
                request_ms=20.0 + i,
                queue_share=0.3 if batching else 0.8,
                batch_mix={4: 0.3, 8: 0.4, 16: 0.3} if batching else {1: 1.0},
                cost_ms=lambda b: 4.0 + 0.5 * b,
                pending=3.0,
            )
        )
    return out


def _gpu_tick(i: int) -> list[DeviceSample]:
    """Two GPUs, the second split into two MIG instances, with a daily rhythm."""
    wave = (i % 17280) / 17280.0  # one day of 5 s ticks
    busy = 20.0 + 60.0 * abs(0.5 - wave)
    return [
        DeviceSample(
            source="nvml",
            uuid="GPU-00000000-0000-0000-0000-000000000000",
            index=0,
            name="NVIDIA H200",
            utilization_gpu_pct=busy,
            memory_used_bytes=40 * GIB,
            memory_total_bytes=140 * GIB,
            power_w=300.0,
        ),
        DeviceSample(
            source="nvml",
            uuid="GPU-00000000-0000-0000-0000-000000000001",
            index=1,
            name="NVIDIA H200",
            memory_used_bytes=30 * GIB,
            memory_total_bytes=140 * GIB,
            power_w=250.0,
        ),
        *(
            DeviceSample(
                source="nvml",
                uuid=f"MIG-00000000-0000-0000-0000-00000000000{j}",
                kind="mig",
                name="NVIDIA H200 MIG 3g.70gb",
                parent_uuid="GPU-00000000-0000-0000-0000-000000000001",
                gpu_instance_id=j,
                compute_instance_id=0,
                sm_active_pct=busy / j,
                memory_used_bytes=15 * GIB,
                memory_total_bytes=70 * GIB,
            )
            for j in (1, 2)
        ),
    ]


def _process_tick(models: int) -> list[ProcessSample]:
    """One Python-backend stub per model (the CPU testbed's model instances)."""
    return [
        ProcessSample(
            source="host",
            pid=1000 + i,
            role="stub",
            model=f"model_{i:02d}",
            instance_name=f"model_{i:02d}_0_0",
            cpu_pct=10.0 + i,
        )
        for i in range(models)
    ]


def _past_findings(store: Store, loads: Sequence[Load], hour_start: float) -> None:
    """An episode per model in the hour from ``hour_start``, resolved after ten minutes:
    a week of them is what the findings page reads over (3,360 for 20 models)."""
    for i, load in enumerate(loads):
        created = hour_start + (i * 163) % 3000
        finding = store.add_finding(
            kind=("queue_saturation", "idle_capacity", "batching_off")[i % 3],
            severity="critical" if i % 5 == 0 else "warning",
            target=TARGET,
            subject=load.config.model,
            summary="synthetic episode",
            window_start=created - 60,
            window_end=created,
            evidence={"queue_share": 0.6, "p95_ms": 40.0},
            created_at=created,
        )
        store.resolve_finding(finding, created + 600)


def fill(url: str, *, days: float, step: float, models: int, end: float) -> None:
    store = Store(url)
    try:
        loads = _loads(models)
        start = end - days * 86400.0
        hour = 3600.0
        t0 = time.monotonic()
        chunk = start
        while chunk < end:
            # One simulated hour at a time; each starts its counters at 0 again (as
            # after a restart), which the rates treat as a new segment.
            seconds = min(hour, end - chunk)
            steady_load(store, loads, target=TARGET, start=chunk, seconds=seconds, step=step)
            for i in range(int(seconds / step) + 1):
                at = chunk + i * step
                store.write_devices(HOST, at, _gpu_tick(int((at - start) / step)))
                if end - at <= 6 * hour:  # the devices page reads processes that far back
                    store.write_processes(HOST, at, _process_tick(models))
            store.rollup(chunk + seconds, bucket_s=300.0)
            _past_findings(store, loads, chunk)
            chunk += seconds + step
            done = (chunk - start) / (end - start)
            print(
                f"\r  filled {done:5.1%} in {time.monotonic() - t0:6.0f} s",
                end="",
                file=sys.stderr,
                flush=True,
            )
        print(file=sys.stderr)
        scrape_ok(store, TARGET, end)
        for i, load in enumerate(loads):
            store.add_finding(
                kind="batching_off" if i % 2 else "batch_below_preferred",
                severity="warning",
                target=TARGET,
                subject=load.config.model,
                summary="synthetic",
                window_start=end - 600,
                window_end=end,
                evidence={"avg_batch_size": 1.0},
                created_at=end - 60,
            )
            store_recommendation(
                store,
                target=TARGET,
                config=load.config,
                qps=load.qps,
                p95_ms=load.request_ms * 2,
                created_at=end - 30,
            )
    finally:
        store.close()


def _serialised(value: Any) -> int:
    """Bytes of the JSON Dash would send (figures through plotly's encoder)."""
    return len(plotly.io.json.to_json_plotly(value))


def callbacks(queries: DashboardQueries, model: str) -> dict[str, Callable[[], int]]:
    """What each page's callbacks do per refresh, end to end but for the network."""

    def overview() -> int:
        data = queries.overview(window_s=60.0)
        rows = components.sort_rows(components.filter_rows(data.models, None), "name")
        return _serialised(to_json(data)) + _serialised(components.models_table(rows))

    def model_page(range_name: str) -> Callable[[], int]:
        def run() -> int:
            d = queries.model_detail(TARGET, model, range_name=range_name)
            figs = [
                figures.qps_figure(d.series, "dark"),
                figures.batch_size_figure(d.series, "dark", preferred=[8, 16], max_batch_size=32),
                figures.latency_figure(d.series, "dark"),
                figures.pending_figure(d.series, "dark"),
                figures.failures_figure(d.series, "dark"),
                figures.distribution_figure(d.distribution, "dark", preferred=[8, 16]),
                figures.service_time_figure(d.service_time, "dark"),
            ]
            return _serialised(to_json(d)) + sum(_serialised(f) for f in figs)

        return run

    def recommendations() -> int:
        recs, _ = queries.recommendations()
        return _serialised([to_json(r) for r in recs])

    def findings() -> int:
        return _serialised(to_json(queries.events(state="all")))

    def devices(range_name: str) -> Callable[[], int]:
        def run() -> int:
            v = queries.devices(range_name=range_name)
            figs = [
                figures.heatmap_figure(v.devices, v.t, "dark", title="devices"),
                figures.heatmap_figure(v.processes, v.t, "dark", title="processes"),
                figures.rows_figure(v.memory_used_gb, v.t, "dark", title="memory", y_title="GB"),
                figures.rows_figure(v.power_w, v.t, "dark", title="power", y_title="W"),
            ]
            return _serialised(to_json(v)) + sum(_serialised(f) for f in figs)

        return run

    return {
        "overview": overview,
        "model 1h": model_page("1h"),
        "model 24h": model_page("24h"),
        "model 7d": model_page("7d"),
        "recommendations": recommendations,
        "findings": findings,
        "devices 6h": devices("6h"),
        "devices 7d": devices("7d"),
    }


def time_callbacks(url: str, *, repeat: int, model: str) -> dict[str, list[float]]:
    store = Store(url)
    queries = DashboardQueries(store)
    try:
        out: dict[str, list[float]] = {}
        for name, run in callbacks(queries, model).items():
            run()  # first call: connections, imports
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                run()
                samples.append(time.perf_counter() - t0)
            out[name] = samples
        return out
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(prog="bench/dashboard_callbacks.py", description=__doc__)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--step", type=float, default=5.0, help="seconds between scrapes")
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", metavar="FILE", help="fill into FILE and keep it")
    parser.add_argument("--reuse", metavar="FILE", help="time an existing FILE, no fill")
    parser.add_argument("--json", metavar="FILE", help="write the timings as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="batchscope-dash-bench-") as tmp:
        path = Path(args.reuse or args.keep or Path(tmp) / "week.db")
        url = f"sqlite:///{path}"
        if not args.reuse:
            path.unlink(missing_ok=True)
            print(
                f"filling {args.days:g} days x {args.models} models every {args.step:g} s "
                f"into {path.name} ...",
                file=sys.stderr,
            )
            t0 = time.monotonic()
            fill(url, days=args.days, step=args.step, models=args.models, end=time.time())
            print(
                f"  filled in {time.monotonic() - t0:.0f} s, {path.stat().st_size / 1e6:.0f} MB",
                file=sys.stderr,
            )
        timings = time_callbacks(url, repeat=args.repeat, model="model_00")
    print(
        f"{'callback':<16} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  target p95 < "
        f"{TARGET_S * 1000:.0f} ms"
    )
    worst = 0.0
    for name, samples in timings.items():
        ordered = sorted(samples)
        p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
        worst = max(worst, p95)
        print(
            f"{name:<16} {statistics.median(samples) * 1000:8.1f} {p95 * 1000:8.1f} "
            f"{max(samples) * 1000:8.1f}  {'ok' if p95 < TARGET_S else 'SLOW'}"
        )
    print(f"worst p95 {worst * 1000:.0f} ms: target {'met' if worst < TARGET_S else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(timings, indent=2))
    return timings


if __name__ == "__main__":
    main()
