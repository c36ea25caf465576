"""Benchmarks, each a ratio of two things measured side by side in one run.

1. scrape overhead on Triton: closed-loop QPS of the testbed's ``batched`` model with
   the collector scraping every 0.5 s, over QPS with no collector (rounds alternate, so
   drift hits both sides alike). Near 1.0 means watching costs the server nothing.
2. parse and map cost: ``parse_metrics`` (prometheus_client's parser + our mapper) on a
   20-model exposition, over prometheus_client's parser alone: what the mapping adds.
3. store write cost: one scrape's ``write_triton`` on PostgreSQL over SQLite (when the
   PostgreSQL named by BATCHSCOPE_TEST_PG_URL answers).

Usage: ``make bench`` (or ``python -m bench.run [--rounds N] [--seconds S]``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector.config import Settings, target_from_url
from collector.records import ModelMetrics, TritonSnapshot
from collector.scheduler import CollectorService, build_sources
from collector.sources.triton import parse_metrics
from collector.store import Store
from collector.testbed.load import run_load
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "triton"
FIXTURE = FIXTURES / "metrics_gpu.txt"


def exposition_with_models(n_models: int) -> str:
    """The recorded GPU exposition with its model series repeated for ``n_models``."""
    lines = FIXTURE.read_text().splitlines()
    out: list[str] = []
    for line in lines:
        if 'model="resnet50"' in line:
            out.extend(line.replace('model="resnet50"', f'model="m{i}"') for i in range(n_models))
        elif 'model="text_encoder"' not in line:
            out.append(line)
    return "\n".join(out) + "\n"


def best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_parse() -> None:
    text = exposition_with_models(20)
    ours = best_of(lambda: parse_metrics(text), 30)
    bare = best_of(lambda: list(text_string_to_metric_families(text)), 30)
    print(
        f"parse+map 20 models: {ours * 1e3:.2f} ms; parser alone {bare * 1e3:.2f} ms; "
        f"ratio {ours / bare:.2f}"
    )


def bench_store() -> None:
    snapshot = TritonSnapshot(
        target="bench",
        collected_at=0.0,
        model_metrics=tuple(
            ModelMetrics(model=f"m{i}", version="1", request_success=float(i)) for i in range(20)
        ),
    )
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = Store(f"sqlite:///{tmp}/bench.db")
        t_sqlite = _write_cost(sqlite, snapshot)
        sqlite.close()
    pg_url = os.environ.get(
        "BATCHSCOPE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    try:
        pg = Store(pg_url)
    except Exception as exc:  # noqa: BLE001 - a missing server only skips this ratio
        print(
            f"store write, 20 models: sqlite {t_sqlite * 1e3:.1f} ms; postgres unavailable "
            f"({type(exc).__name__})"
        )
        return
    t_pg = _write_cost(pg, snapshot)
    pg.close()
    print(
        f"store write, 20 models: sqlite {t_sqlite * 1e3:.1f} ms, postgres {t_pg * 1e3:.1f} ms; "
        f"ratio postgres/sqlite {t_pg / t_sqlite:.2f}"
    )


def _write_cost(store: Store, snapshot: TritonSnapshot) -> float:
    times = []
    base = time.time()
    for i in range(20):
        snap = TritonSnapshot(
            target=f"bench-{base:.0f}", collected_at=base + i, model_metrics=snapshot.model_metrics
        )
        t0 = time.perf_counter()
        store.write_triton(snap, {})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_scrape_overhead(rounds: int, seconds: float) -> None:
    spec = ModelSpec(
        "batched", dynamic_batching=True, preferred_batch_sizes=(8, 16), max_queue_delay_us=2000
    )
    with TritonServer([spec]) as server, tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            targets=(target_from_url(server.http_url, server.metrics_url),),
            db_url=f"sqlite:///{tmp}/bench.db",
            interval_s=0.5,
            jitter_s=0.0,
            sources=("triton", "host"),
        )
        run_load(server.grpc_url, "batched", concurrency=16, duration_s=1.0)  # warm up
        with_qps: list[float] = []
        without_qps: list[float] = []
        for _ in range(rounds):
            without_qps.append(
                run_load(server.grpc_url, "batched", concurrency=16, duration_s=seconds).qps
            )
            store = Store(settings.db_url)
            service = CollectorService(settings, store, build_sources(settings))
            stop = threading.Event()
            runner = threading.Thread(target=service.run, args=(None, stop))
            runner.start()
            with_qps.append(
                run_load(server.grpc_url, "batched", concurrency=16, duration_s=seconds).qps
            )
            stop.set()
            runner.join()
            store.close()
        w, wo = statistics.median(with_qps), statistics.median(without_qps)
        print(
            f"Triton QPS with collector (0.5 s scrapes) {w:.0f}, without {wo:.0f}; "
            f"ratio {w / wo:.3f}  (rounds: with {[round(q) for q in with_qps]}, "
            f"without {[round(q) for q in without_qps]})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    bench_parse()
    bench_store()
    bench_scrape_overhead(args.rounds, args.seconds)


if __name__ == "__main__":
    main()
