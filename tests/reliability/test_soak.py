"""A soak: ``batchscope serve`` (collector, analysis, recommender, alerts and the UI in
one process) watching the CPU testbed Triton under a load that keeps changing —
closed-loop clients, an open-loop rate, idle — while two users view the dashboard's
pages, for 15 minutes. The serve process's RSS, open file descriptors and threads are
read every few seconds (psutil) and kept as one sample a minute, RSS the median of
that minute's readings; after the warm-up none of them grows: the slope of a
least-squares line through the samples stays under a bound, and the last sample is
within a margin of the first one after warm-up.

The store starts with ``HISTORY_S`` of synthetic history of the same target and models
(one scrape a second, the host's readings of its processes alongside), so every window
serve reads (the recommender's 15-minute look-back, the pages' default 15-minute range)
is full from the first minute, and rolled up as serve's housekeeping would have done:
a long-running serve's steady state. On an empty store those windows fill during the
soak, and what each pass reads grows with them.

The duration and the sampling interval are ``$BATCHSCOPE_SOAK_S`` (900) and
``$BATCHSCOPE_SOAK_SAMPLE_S`` (60), read when the module loads, so a short run
(``BATCHSCOPE_SOAK_S=120 BATCHSCOPE_SOAK_SAMPLE_S=10``) shows the harness works; it
judges RSS while the heaps still grow to their high-water mark (see ``WARMUP_S``) and
descriptors while pools still open (18 -> 19 in a 60 s run), so its bounds may fail
where the full run's do not.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import yaml

from bench.load import LoadResult as PageLoad
from bench.load import run_load as view_pages
from collector.config import RetentionSettings, Settings
from collector.records import ProcessSample, ServerMetrics
from collector.store import Store
from collector.synthetic import Load, model_config, steady_load
from collector.testbed.load import LoadResult, run_load
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer
from tests.alert_support import Receiver
from tests.integration.conftest import TritonFactory, triton_available, triton_factory
from tests.integration.prometheus_server import answers_200
from tests.reliability.conftest import FaultLedger
from tests.support import free_port, start_process, stop_process, wait_until

# The Triton fixtures of the integration tests, used here too.
__all__ = ["triton_available", "triton_factory"]

SOAK_S = float(os.environ.get("BATCHSCOPE_SOAK_S", "900"))
SAMPLE_EVERY_S = float(os.environ.get("BATCHSCOPE_SOAK_SAMPLE_S", "60"))
# Each sample's RSS is the median of readings this far apart, not one reading. serve
# collects its garbage and hands free pages back once a minute (``process_control``):
# RSS then dips, by 1.1-1.7 MiB in one run read every 10 s inside serve, and is back
# within about 10 s. The collection's minute is 60 s plus the collection (78-135 ms),
# so one reading a minute sits at a point of that cycle that moves by about 0.1 s a
# minute. In that run the test's readings of minutes 2-8 were 1.1-2.5 MiB below the
# median of serve's own, and those of minutes 9-15 were not: a 2.6 MiB step in the
# test's table where serve's median rose 0.9 MiB. The median also passes over a
# moment's peak, 3.3 MiB above the minute before in the last minute of another run.
READ_EVERY_S = min(5.0, SAMPLE_EVERY_S)
# The first half of the run (at most 7.5 minutes) is warm-up. Caches, pools and the
# first analyses and rollups fill in the first 3 minutes, but the allocators' heaps
# reach their high-water mark later: in one 15-minute run, glibc's second heap went
# from 5.0 MiB at 30 s to 9.6 MiB at 120 s and 11.3 MiB at 360 s, and stayed there to
# the end; RSS rose 0.25 MiB a minute over minutes 3-20 of a 20-minute run, and 0.04
# over minutes 7-20. The slope from minute 3 (``SETTLING_S``) is reported beside the
# judged one.
WARMUP_S = min(SOAK_S / 2, 450.0)
SETTLING_S = min(SOAK_S / 3, 180.0)
# Bounds after warm-up. RSS: a slope under 0.25 % of the warm RSS per minute (0.4 MiB
# at 160 MiB: four times the steepest of the four runs it was set from, 0.10 MiB a
# minute after minute 7.5; a leak of 24 MiB an hour fails it, and so does one step of
# about 3 MiB inside the judged minutes, as it did once at 0.43), and the last sample
# within 3 % of the first; descriptors and threads: a slope under 0.5 a minute (one
# more pooled connection opened once is a step, not a trend), the last at most 4 above
# the first (a connection or a worker in flight).
RSS_SLOPE_SHARE_PER_MIN = 0.0025
RSS_FINAL_SHARE = 0.03
COUNT_SLOPE_PER_MIN = 0.5
COUNT_FINAL_EXTRA = 4

MODELS = (
    ModelSpec("solo", fixed_ms=4.0, per_sample_ms=0.5, max_batch_size=32),
    ModelSpec(
        "batched",
        fixed_ms=4.0,
        per_sample_ms=0.5,
        max_batch_size=32,
        dynamic_batching=True,
        max_queue_delay_us=2000,
    ),
)
# Synthetic history written before serve starts: more than any window serve reads
# (the recommender's look-back and the pages' default range are 15 minutes).
HISTORY_S = 1200.0

# (model, closed-loop clients or None, open-loop rate or None, seconds); repeated.
PHASES: tuple[tuple[str | None, int | None, float | None, float], ...] = (
    ("solo", 8, None, 20.0),
    ("batched", None, 60.0, 20.0),
    (None, None, None, 10.0),  # idle
    ("batched", 4, None, 20.0),
    ("solo", None, 20.0, 20.0),
)


@dataclass(frozen=True)
class Sample:
    """One sampling interval: the median of its RSS readings (the lowest and highest
    beside, to show the dip and the peaks), descriptors and threads at its end (``at``,
    seconds since the soak started)."""

    at: float
    rss: int
    fds: int
    threads: int
    rss_low: int
    rss_high: int
    # Descriptors open on the store's database file: one a connection, and those SQLite
    # keeps from closed ones while others lock the file (reused by the next it opens).
    store_files: int


def slope_per_min(samples: Sequence[Sample], value: str) -> float:
    """The least-squares slope of ``value`` over time, per minute."""
    xs = [s.at / 60.0 for s in samples]
    ys = [float(getattr(s, value)) for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


@dataclass(frozen=True)
class Reading:
    rss: int
    fds: int
    threads: int
    store_files: int


def read(process: psutil.Process, database: Path) -> Reading:
    """RSS, open file descriptors, threads and descriptors on the store's database
    file, now."""
    with process.oneshot():
        store_files = sum(1 for f in process.open_files() if Path(f.path) == database)
        return Reading(
            process.memory_info().rss, process.num_fds(), process.num_threads(), store_files
        )


def sample(readings: Sequence[Reading], at: float) -> Sample:
    """The median, lowest and highest RSS of ``readings``, and the last one's
    descriptors and threads (counts have no such dip)."""
    rss = [r.rss for r in readings]
    last = readings[-1]
    return Sample(
        at,
        int(statistics.median(rss)),
        last.fds,
        last.threads,
        min(rss),
        max(rss),
        last.store_files,
    )


def seed_history(db_url: str, target: str, *, seconds: float, end: float) -> None:
    """``seconds`` of one scrape a second of ``MODELS`` on ``target`` up to ``end``,
    with the server's readings and the host's readings of Triton and its stubs, rolled
    up."""
    loads = [
        Load(
            config=model_config(
                spec.name,
                batching=spec.dynamic_batching,
                delay_us=spec.max_queue_delay_us or 0,
                max_batch_size=spec.max_batch_size,
            ),
            qps=40.0,
            request_ms=10.0,
            queue_share=0.3 if spec.dynamic_batching else 0.6,
            batch_mix=(
                {1: 0.3, 2: 0.2, 3: 0.1, 4: 0.3, 5: 0.1} if spec.dynamic_batching else {1: 1.0}
            ),
            cost_ms=lambda b: 4.0 + 0.5 * b,
            # Shaped as serve's own records of the testbed: the failure reasons Triton
            # 2.52 lists, input and output times, statistics every fifth scrape.
            failure_reasons=("BACKEND", "CANCELED", "REJECTED", "OTHER"),
            io_ms=0.05,
        )
        for spec in MODELS
    ]
    start = end - seconds
    server = ServerMetrics(cpu_utilization=0.5, cpu_memory_used_bytes=1.3e9)
    processes = [ProcessSample(source="host", pid=1, role="server", cpu_pct=3.0)] + [
        ProcessSample(
            source="host",
            pid=2 + i,
            role="stub",
            model=spec.name,
            instance_name=f"{spec.name}_0_0",
            cpu_pct=5.0,
            rss_bytes=47 * 2**20,
        )
        for i, spec in enumerate(MODELS)
    ]
    with Store(db_url) as store:
        steady_load(
            store,
            loads,
            target=target,
            start=start,
            seconds=seconds,
            server=server,
            # serve scrapes every second and reads the statistics every statistics_interval_s.
            stats_every=int(Settings.model_fields["statistics_interval_s"].default),
        )
        for i in range(int(seconds) + 1):
            store.write_processes(target, start + i, processes)
        # Rolled up as serve's housekeeping would have done by now, so its first pass
        # rolls up one bucket, as every later one does, not the whole history.
        store.rollup(end, bucket_s=RetentionSettings().rollup_bucket_s)


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    ui_url: str
    db_url: str
    database: Path
    log: Path


@pytest.fixture
def served(
    triton_factory: TritonFactory,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> Iterator[tuple[TritonServer, Serve, Receiver]]:
    server = triton_factory(list(MODELS))
    port = free_port()
    ui_url = f"http://127.0.0.1:{port}"
    database = tmp_path / "soak.db"
    db_url = f"sqlite:///{database}"
    # serve names a Triton target by its address, as these rows do.
    seed_history(db_url, urlsplit(server.http_url).netloc, seconds=HISTORY_S, end=time.time())
    with Receiver() as receiver:
        config = tmp_path / "batchscope.yml"
        settings = {
            "analysis_every_s": 5,
            "recommend_every_s": 15,
            "analysis": {"window_s": 10, "sustain": 2, "clear_after": 2},
            "alerts": {
                "receivers": [{"name": "hook", "webhook": {"url": receiver.url + "/hook"}}],
                "dashboard_url": ui_url,
            },
        }
        config.write_text(yaml.safe_dump(settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
        command = [sys.executable, "-m", "collector.cli", "serve"]
        command += ["--triton", server.http_url, "--metrics-url", server.metrics_url]
        command += ["--db", db_url, "--interval", "1", "--sources", "triton,host"]
        command += ["--port", str(port), "--config", str(config)]
        log = tmp_path / "serve.log"
        with log.open("wb") as out:
            proc = start_process(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until(
                lambda: proc.poll() is not None or answers_200(ui_url + "/"), 60, "serve's UI"
            )
            assert proc.poll() is None, log.read_text()[-3000:]
            yield server, Serve(proc, ui_url, db_url, database, log), receiver
        finally:
            stop_process(proc)


def drive(server: TritonServer, stop: threading.Event, results: list[LoadResult]) -> None:
    """The phases in turn until ``stop``; each phase ends within its seconds."""
    i = 0
    while not stop.is_set():
        model, clients, rate, seconds = PHASES[i % len(PHASES)]
        i += 1
        if model is None:
            stop.wait(seconds)
            continue
        results.append(
            run_load(server.grpc_url, model, concurrency=clients, rate=rate, duration_s=seconds)
        )


@pytest.mark.long
def test_serve_soak_has_no_growth(
    served: tuple[TritonServer, Serve, Receiver], fault_ledger: FaultLedger
) -> None:
    server, serve, receiver = served
    process = psutil.Process(serve.process.pid)
    stop = threading.Event()
    loads: list[LoadResult] = []
    driver = threading.Thread(target=drive, args=(server, stop, loads))
    ui_load: list[PageLoad] = []
    viewer = threading.Thread(
        target=lambda: ui_load.append(
            view_pages(serve.ui_url, None, users=2, duration_s=SOAK_S, think_s=5.0)
        )
    )
    started = time.monotonic()
    samples = [sample([read(process, serve.database)], 0.0)]
    driver.start()
    viewer.start()
    try:
        readings: list[Reading] = []
        next_sample = SAMPLE_EVERY_S
        while (elapsed := time.monotonic() - started) < SOAK_S:
            stop.wait(min(READ_EVERY_S, SOAK_S - elapsed))
            assert serve.process.poll() is None, serve.log.read_text()[-3000:]
            readings.append(read(process, serve.database))
            read_at = time.monotonic() - started
            if read_at >= min(next_sample, SOAK_S):
                samples.append(sample(readings, read_at))
                readings = []
                next_sample += SAMPLE_EVERY_S
    finally:
        stop.set()
        driver.join(timeout=60)
        viewer.join(timeout=180)
    assert not driver.is_alive() and not viewer.is_alive()

    # It kept working all along: every request of the load answered, the store filled.
    sent = sum(r.requests + r.errors for r in loads)
    failed = sum(r.errors for r in loads)
    assert sent > 0 and failed == 0, [r.error_samples for r in loads if r.errors]
    [pages] = ui_load
    assert pages.total("status_5xx") == 0 and pages.total("no_answer") == 0
    with Store(serve.db_url) as store:
        latest = store.latest_collected_at()
        targets = {t.name for t in store.targets() if t.kind == "triton"}
    assert latest is not None and time.time() - latest < 30, "collection stopped"
    # serve went on with the seeded target, so its windows held the seeded history.
    assert targets == {urlsplit(server.http_url).netloc}, targets

    warm = [s for s in samples if s.at >= WARMUP_S]
    assert len(warm) >= 3, samples
    first, last = warm[0], warm[-1]
    rss_slope = slope_per_min(warm, "rss")
    settling_slope = slope_per_min([s for s in samples if s.at >= SETTLING_S], "rss")
    fd_slope = slope_per_min(warm, "fds")
    thread_slope = slope_per_min(warm, "threads")
    table = "\n".join(
        f"{s.at:6.0f} s  rss {s.rss / 2**20:7.1f} MiB ({s.rss_low / 2**20:5.1f}-"
        f"{s.rss_high / 2**20:5.1f})  "
        f"fds {s.fds:4d}  threads {s.threads:3d}  on the store {s.store_files:2d}"
        for s in samples
    )
    print(table)
    assert fd_slope < COUNT_SLOPE_PER_MIN and last.fds <= first.fds + COUNT_FINAL_EXTRA, table
    assert thread_slope < COUNT_SLOPE_PER_MIN, table
    assert last.threads <= first.threads + COUNT_FINAL_EXTRA, table
    rss_bound = RSS_SLOPE_SHARE_PER_MIN * first.rss
    assert rss_slope < rss_bound, (
        f"RSS grows {rss_slope / 1024:.0f} KiB/min after warm-up (bound "
        f"{rss_bound / 1024:.0f})\n{table}"
    )
    assert last.rss <= first.rss * (1 + RSS_FINAL_SHARE), table
    mib = 2**20
    fault_ledger.record(
        area="soak",
        fault=f"batchscope serve for {SOAK_S / 60:g} min on the CPU testbed under changing "
        f"load (8 clients, 60 req/s, idle, 4 clients, 20 req/s in turn) and 2 UI users",
        tries=len(samples),
        outcome=f"{sent} inferences, 0 failed; {pages.total('requests')} UI requests, 0 5xx; "
        f"RSS (each minute's median of readings every {READ_EVERY_S:g} s) "
        f"{samples[0].rss / mib:.0f} -> {first.rss / mib:.0f} MiB after "
        f"{WARMUP_S:g} s warm-up -> {last.rss / mib:.0f} MiB at the end (slope "
        f"{rss_slope / 1024:.0f} KiB/min over {len(warm)} samples; "
        f"{settling_slope / 1024:.0f} KiB/min from {SETTLING_S:g} s); fds {first.fds} -> "
        f"{last.fds} ({fd_slope:+.2f}/min); threads {first.threads} -> {last.threads} "
        f"({thread_slope:+.2f}/min); {len(receiver.received)} alert posts received",
    )
