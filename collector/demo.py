"""``batchscope demo``: the main job on the embedded default, end to end.

Starts the CPU testbed (a real Triton with a ``batched`` and an ``unbatched`` model),
runs the collector into SQLite, drives both models at the same concurrency at the same
time, and prints what the load generator measured beside what batchscope stored, then
a recommendation per model.
"""

from __future__ import annotations

import argparse
import threading
import time

from collector.analysis.recommend import recommend_model
from collector.analysis.status import build_status
from collector.config import Settings, target_from_url
from collector.report import render_recommendation, render_status
from collector.scheduler import CollectorService, build_sources
from collector.store import Store
from collector.testbed.load import LoadResult, run_load
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer

__all__ = ["DEMO_MODELS", "add_demo_command", "run_demo"]

DEMO_MODELS = (
    ModelSpec("batched", fixed_ms=4.0, per_sample_ms=0.5, max_batch_size=32,
              dynamic_batching=True, preferred_batch_sizes=(8, 16), max_queue_delay_us=2000),
    ModelSpec("unbatched", fixed_ms=4.0, per_sample_ms=0.5, max_batch_size=32),
)


def _wait_for_scrape_after(store: Store, moment: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        latest = store.latest_collected_at()
        if latest is not None and latest > moment:
            return
        time.sleep(0.1)


def run_demo(*, duration_s: float = 20.0, db_url: str = "sqlite:///batchscope.db",
             concurrency: int = 16, interval_s: float = 1.0) -> int:
    print(f"starting a CPU Triton testbed with models: {', '.join(m.name for m in DEMO_MODELS)}")
    with TritonServer(DEMO_MODELS) as server:
        print(f"  HTTP {server.http_url}   gRPC {server.grpc_url}   metrics {server.metrics_url}")
        settings = Settings(targets=(target_from_url(server.http_url, server.metrics_url),),
                            db_url=db_url, interval_s=interval_s, jitter_s=0.0)
        store = Store(settings.db_url)
        service = CollectorService(settings, store, build_sources(settings))
        service.start()
        try:
            print(f"collecting every {interval_s:g} s into {db_url}; driving both models at "
                  f"concurrency {concurrency} for {duration_s:g} s ...")
            results: dict[str, LoadResult] = {}

            def drive(model: str) -> None:
                results[model] = run_load(server.grpc_url, model, concurrency=concurrency,
                                          duration_s=duration_s)

            started = time.time()
            threads = [threading.Thread(target=drive, args=(m.name,)) for m in DEMO_MODELS]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ended = time.time()
            _wait_for_scrape_after(store, ended, timeout_s=5 * interval_s + 5)
        finally:
            service.shutdown()
        print()
        print("load generator:")
        for model, r in sorted(results.items()):
            print(f"  {model:10s} qps {r.qps:7.1f}  p50 {r.p50_ms:6.1f} ms  p95 {r.p95_ms:6.1f} ms"
                  f"  p99 {r.p99_ms:6.1f} ms  errors {r.errors}")
        print()
        print(f"batchscope status (window {ended - started:.0f} s):")
        report = build_status(store, window_s=ended - started, now=ended)
        print(render_status(report))
        print()
        for spec in DEMO_MODELS:
            rec = recommend_model(store, settings.targets[0].name, spec.name,
                                  window_s=ended - started, now=ended)
            if rec is not None:
                print(render_recommendation(rec))
                print()
        store.close()
    return 0


def add_demo_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    demo = sub.add_parser("demo", help="start the CPU testbed, collect while driving load, "
                                       "print status")
    demo.add_argument("--duration", type=float, default=20.0, metavar="S",
                      help="seconds of load (default 20)")
    demo.add_argument("--concurrency", type=int, default=16, metavar="N")
    demo.add_argument("--db", dest="db_url", default="sqlite:///batchscope.db", metavar="URL")
    demo.set_defaults(func=lambda a: run_demo(duration_s=a.duration, db_url=a.db_url,
                                              concurrency=a.concurrency))
