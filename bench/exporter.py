"""Benchmark: the exporter's /metrics with 50 models, beside Triton's own /metrics.

1. A store with 50 models as the exporter keeps it: 15 minutes of scrapes every 5 s
   (counters, statistics with three batch sizes per model, configs), a few active
   findings and recommendations. Its newest samples run a little past the start, so
   every model stays fresh (rates, counters) for the whole run.
2. ``batchscope exporter --db`` serving that store (its collector pointed at a port
   nothing answers on, its analyses not due during the run, so the process does
   nothing but serve): ``--scrapes`` GETs of /metrics over one keep-alive connection,
   timed on the client (median, p95), and the CPU the exporter process spent (user +
   system from /proc, via psutil) per scrape.
3. The snapshot a scrape reads is built ahead, once per collector interval
   (``SnapshotKeeper``): its build (``take_snapshot`` on the same store, in this
   process, median of 5) is printed too, as the background cost per interval.
4. The CPU testbed's Triton (two Python-backend models, idle): the same count of GETs
   of its /metrics and the CPU the tritonserver process spent per scrape. Triton also
   works in the background (its own metric polling), so the CPU of an equally long
   idle stretch is measured first and subtracted; both are printed.

Target: a scrape of the exporter with 50 models under 50 ms.
Usage: ``python -m bench.exporter [--models 50] [--scrapes 50]``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests

from collector.analysis.detect import DetectorSettings
from collector.exporter.snapshot import take_snapshot
from collector.records import Finding, ModelConfig
from collector.store import Store
from collector.synthetic import Load, model_config, scrape_ok, steady_load, store_recommendation
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TritonServer

TARGET = "triton-bench"
HISTORY_S = 900.0  # what the exporter's own store keeps
AHEAD_S = 300.0  # samples written past "now", so the models stay fresh during the run
STEP_S = 5.0
TARGET_MS = 50.0


@dataclass(frozen=True)
class ScrapeCost:
    """``scrapes`` GETs of one /metrics: client-side wall time and the server
    process's CPU per scrape (``idle_cpu_ms`` over an equally long idle stretch)."""

    scrapes: int
    median_ms: float
    p95_ms: float
    cpu_ms_per_scrape: float
    idle_cpu_ms: float
    body_bytes: int


def _loads(n_models: int) -> list[Load]:
    loads = []
    for i in range(n_models):
        batching = i % 2 == 0
        config = model_config(
            f"model_{i:02d}", batching=batching, preferred=(4, 8) if batching else (), delay_us=500
        )
        loads.append(
            Load(
                config=config,
                qps=20.0 + i,
                request_ms=8.0,
                queue_share=0.3,
                batch_mix={1: 0.2, 4: 0.4, 8: 0.4} if batching else {1: 1.0},
                cost_ms=lambda b: 2.0 + 0.5 * b,
            )
        )
    return loads


def fill_store(db_url: str, n_models: int, now: float) -> None:
    """The store described in the module's docstring."""
    store = Store(db_url)
    try:
        loads = _loads(n_models)
        start = now - HISTORY_S
        steady_load(store, loads, target=TARGET, start=start, seconds=HISTORY_S + AHEAD_S, step=5)
        for i in range(int((HISTORY_S + AHEAD_S) / STEP_S) + 1):
            scrape_ok(store, TARGET, start + i * STEP_S)
        for load in loads[:5]:
            store.add_finding(_finding(load.config, now))
        for load in loads[:10]:
            for minutes_ago in (3, 2, 1):
                store_recommendation(
                    store,
                    target=TARGET,
                    config=load.config,
                    qps=load.qps,
                    p95_ms=12.0,
                    created_at=now - 60 * minutes_ago,
                )
    finally:
        store.close()


def _finding(config: ModelConfig, now: float) -> Finding:
    return Finding(
        kind="batching_off",
        severity="warning",
        target=TARGET,
        subject=config.model,
        summary="requests wait one at a time",
        window_start=now - 60,
        window_end=now,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def measure_scrapes(url: str, pid: int, scrapes: int) -> ScrapeCost:
    """Time ``scrapes`` GETs of ``url`` and the CPU process ``pid`` spent on them."""
    with requests.Session() as http:
        http.trust_env = False
        body = http.get(url, timeout=30).content  # warm: first imports, connection
        idle_from = _cpu_s(pid)
        walls = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            http.get(url, timeout=30).raise_for_status()
            walls.append(time.perf_counter() - t0)
        spent = _cpu_s(pid) - idle_from
        # The same stretch with no scrape: what the process spends on its own.
        idle_at = _cpu_s(pid)
        time.sleep(sum(walls))
        idle = _cpu_s(pid) - idle_at
    walls.sort()
    return ScrapeCost(
        scrapes=scrapes,
        median_ms=statistics.median(walls) * 1e3,
        p95_ms=walls[min(int(0.95 * len(walls)), len(walls) - 1)] * 1e3,
        cpu_ms_per_scrape=max(spent - idle, 0.0) / scrapes * 1e3,
        idle_cpu_ms=idle * 1e3,
        body_bytes=len(body),
    )


def bench_snapshot_build(db_url: str, builds: int = 5) -> tuple[float, float]:
    """Median wall and CPU milliseconds of one snapshot build on the store."""
    store = Store(db_url)
    walls, cpus = [], []
    try:
        for _ in range(builds):
            w0, c0 = time.perf_counter(), time.process_time()
            take_snapshot(store, window_s=DetectorSettings().window_s)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    finally:
        store.close()
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3


def bench_exporter(workdir: Path, n_models: int, scrapes: int) -> tuple[ScrapeCost, float, float]:
    db_url = f"sqlite:///{workdir / 'exporter.db'}"
    fill_store(db_url, n_models, time.time())
    build_ms, build_cpu_ms = bench_snapshot_build(db_url)
    config = workdir / "exporter.yaml"
    # Analyses not due during the run: the process only serves.
    config.write_text("analysis_every_s: 86400\nrecommend_every_s: 86400\n")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "exporter", "--triton", "http://127.0.0.1:9"]
        + ["--db", db_url, "--config", str(config), "--sources", "triton"]
        + ["--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        _wait_for(url)
        return measure_scrapes(url, proc.pid, scrapes), build_ms, build_cpu_ms
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def bench_triton(scrapes: int) -> ScrapeCost:
    with TritonServer(BATCHED_AND_UNBATCHED) as server:
        return measure_scrapes(server.metrics_url, server.pid, scrapes)


def _wait_for(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=5).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {timeout_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--scrapes", type=int, default=50, help="GETs of the exporter")
    # Triton's scrape costs a fraction of a CPU tick (10 ms): many more to measure it.
    parser.add_argument("--triton-scrapes", type=int, default=1000, help="GETs of Triton")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-exporter-") as tmp:
        exporter, build_ms, build_cpu_ms = bench_exporter(Path(tmp), args.models, args.scrapes)
    triton = bench_triton(args.triton_scrapes)
    print(f"/metrics on {os.cpu_count()} CPUs; wall times on the client, CPU of the server process")
    print(
        f"{'what':<50} {'GETs':>5} {'median ms':>9} {'p95 ms':>7} {'CPU ms':>7} "
        f"{'idle CPU ms':>11} {'bytes':>7}"
    )
    rows = [
        (f"exporter, {args.models} models: serve a built snapshot", exporter),
        (f"Triton, {len(BATCHED_AND_UNBATCHED)} models (CPU testbed, idle)", triton),
    ]
    for name, c in rows:
        print(
            f"{name:<50} {c.scrapes:>5} {c.median_ms:>9.1f} {c.p95_ms:>7.1f} "
            f"{c.cpu_ms_per_scrape:>7.2f} {c.idle_cpu_ms:>11.0f} {c.body_bytes:>7}"
        )
    print(
        f"{'exporter: build one snapshot (ahead of a scrape)':<50} {5:>5} {build_ms:>9.1f} "
        f"{'':>7} {build_cpu_ms:>7.2f}"
    )
    per_scrape = exporter.cpu_ms_per_scrape + build_cpu_ms
    print(
        f"{'exporter: CPU per Prometheus scrape (build+serve)':<50} {'':>5} {'':>9} {'':>7} "
        f"{per_scrape:>7.2f}"
    )
    verdict = "under" if exporter.median_ms < TARGET_MS else "OVER"
    ratio = per_scrape / triton.cpu_ms_per_scrape if triton.cpu_ms_per_scrape > 0 else math.inf
    print(
        f"a scrape of the exporter takes {exporter.median_ms:.1f} ms (median, p95 "
        f"{exporter.p95_ms:.1f}): {verdict} the {TARGET_MS:.0f} ms target; with its snapshot "
        f"build the exporter spends {per_scrape:.0f} ms CPU per scrape, {ratio:.0f}x "
        f"Triton's {triton.cpu_ms_per_scrape:.2f} ms"
    )


if __name__ == "__main__":
    main()
