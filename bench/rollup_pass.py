"""One housekeeping rollup pass over a fleet's bucket, against reading the bucket whole.

Fills a SQLite store (or ``--db URL``, a scratch database the bench may write to) with
two buckets of ``--targets`` x ``--models`` model samples every ``--interval`` seconds,
rolls the first bucket up, then measures, side by side in this process, the rollup of
the second bucket as the store does it (``Store.rollup``: one model's rows of the bucket
at a time, fetched in batches) and the read it replaced (the bucket's rows read whole,
grouped by model in Python, the same rollup values computed). Printed: the peak of
Python memory during each (``tracemalloc``), the CPU seconds, and whether both give the
same rollup rows.

Usage: ``python -m bench.rollup_pass [--targets 20] [--models 20] [--interval 5]
[--bucket 300] [--db URL]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select

from collector.store import Store
from collector.store.mapping import RowValues
from collector.store.rollups import _RATE_COLUMN_NAMES, _model_rollup_values
from collector.store.schema import ModelRollupRow, ModelSampleRow
from collector.synthetic import Load, model_config, steady_load

T0 = 1_700_000_100.0  # a multiple of 300
T = TypeVar("T")


def model_loads(models: int) -> list[Load]:
    """``models`` batching models (m0, m1, ...) under a steady load each."""
    return [
        Load(
            config=model_config(f"m{i}", batching=True, delay_us=100, max_batch_size=8),
            qps=20.0 + i,
            request_ms=10.0,
            queue_share=0.3,
            batch_mix={2: 0.5, 4: 0.5},
            cost_ms=lambda b: 4.0 + 0.5 * b,
        )
        for i in range(models)
    ]


def fill(store: Store, targets: int, models: int, interval_s: float, bucket_s: float) -> None:
    for t in range(targets):
        steady_load(
            store,
            model_loads(models),
            target=f"triton-{t}:8000",
            start=T0,
            seconds=2 * bucket_s - interval_s,
            step=interval_s,
        )


def whole_bucket(store: Store, start: float, bucket_s: float) -> list[dict[str, Any]]:
    """The rollup rows of ``[start, start + bucket_s)`` from its rows read whole."""
    at = ModelSampleRow.collected_at
    stmt = select(
        ModelSampleRow.model_id,
        ModelSampleRow.pending_request_count,
        *(getattr(ModelSampleRow, name) for name in _RATE_COLUMN_NAMES),
    ).where(at >= start, at < start + bucket_s)
    groups: dict[int, list[RowValues]] = defaultdict(list)
    with store._read() as session:
        for r in session.execute(stmt).mappings():
            groups[r["model_id"]].append(r)
    return [
        _model_rollup_values(model_id, start, bucket_s, samples)
        for model_id, samples in sorted(groups.items())
    ]


def stored_bucket(store: Store, start: float, bucket_s: float) -> list[dict[str, Any]]:
    columns = ModelRollupRow.__table__.columns
    stmt = (
        select(*(c for c in columns if c.name != "id"))
        .where(ModelRollupRow.bucket_start == start, ModelRollupRow.bucket_s == bucket_s)
        .order_by(ModelRollupRow.model_id)
    )
    with store._read() as session:
        return [dict(r) for r in session.execute(stmt).mappings()]


def measured(work: Callable[[], T]) -> tuple[T, float, float]:
    """``work()``'s result, its peak of Python memory in MiB and its CPU seconds."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        cpu = time.process_time()
        result = work()
        cpu = time.process_time() - cpu
        return result, (tracemalloc.get_traced_memory()[1] - before) / 2**20, cpu
    finally:
        tracemalloc.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--bucket", type=float, default=300.0)
    parser.add_argument("--db", default="", help="a scratch store URL (default: SQLite)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        url = args.db or f"sqlite:///{Path(scratch) / 'rollup.db'}"
        with Store(url) as store:
            fill(store, args.targets, args.models, args.interval, args.bucket)
            store.rollup(T0 + args.bucket, bucket_s=args.bucket)
            start = T0 + args.bucket
            whole, whole_mib, whole_cpu = measured(lambda: whole_bucket(store, start, args.bucket))
            _, pass_mib, pass_cpu = measured(
                lambda: store.rollup(start + args.bucket, bucket_s=args.bucket)
            )
            same = stored_bucket(store, start, args.bucket) == whole
    samples = args.targets * args.models * round(args.bucket / args.interval)
    print(
        f"one rollup pass, {args.targets} x {args.models} models at {args.interval:g} s, "
        f"a {args.bucket:g} s bucket ({samples} model samples)"
    )
    print(f"  the store's pass:      peak {pass_mib:6.2f} MiB, {pass_cpu:.2f} s CPU")
    print(f"  the bucket read whole: peak {whole_mib:6.2f} MiB, {whole_cpu:.2f} s CPU")
    print(f"  memory ratio {whole_mib / pass_mib:.1f}; same rollup rows: {same}")


if __name__ == "__main__":
    main()
