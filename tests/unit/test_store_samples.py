"""Model samples in the store: batch stats kept in the sample's row, compact, read
back exactly, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from dataclasses import replace

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from collector.records import BatchStat, Duration, ModelStats, TritonSnapshot
from collector.store import Store
from tests.unit.test_store import full_metrics, full_rates, full_stats

T0 = 1_700_000_000.0


def _stored_batch_stats(db_url: str) -> list[str | None]:
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn:
        sql = "SELECT CAST(s.batch_stats AS TEXT) FROM model_samples s ORDER BY s.id"
        values = [r[0] for r in conn.execute(text(sql))]
    engine.dispose()
    return values


def test_batch_stats_round_trip_in_the_sample_row(store: Store, db_url: str) -> None:
    many = replace(
        full_stats("big"),
        batch_stats=tuple(
            BatchStat(size, Duration(size, 2**40 + size), Duration(3 * size, 2**50), Duration())
            for size in range(1, 17)
        ),
    )
    snapshot = TritonSnapshot(
        target="triton-a",
        collected_at=T0,
        model_metrics=(
            full_metrics("resnet"),
            full_metrics("no-stats"),
            full_metrics("no-batches"),
            full_metrics("big"),
        ),
        model_stats=(
            full_stats("resnet"),
            replace(full_stats("no-batches"), batch_stats=()),
            many,
        ),
    )
    store.write_triton(snapshot, {("resnet", "1"): full_rates()})

    by_model = {s.model: s for s in store.model_samples()}
    assert by_model["resnet"].stats == full_stats("resnet")
    assert by_model["no-stats"].stats is None
    assert by_model["no-batches"].stats == replace(full_stats("no-batches"), batch_stats=())
    assert by_model["big"].stats == many
    # One compact array per batch size; NULL without a statistics entry, [] without
    # batch stats.
    assert _stored_batch_stats(db_url)[:3] == [
        "[[8,40,800000,40,80000000000,40,1600000],[1,11,200000,10,10000000000,9,400000]]",
        None,
        "[]",
    ]


def test_retention_counts_the_batch_stats_of_deleted_samples(store: Store) -> None:
    for i in range(3):
        stats = (full_stats("resnet"), ModelStats("mlp", "1", inference_count=1))
        metrics = (full_metrics("resnet"), full_metrics("mlp"), full_metrics("bare"))
        store.write_triton(
            TritonSnapshot("triton-a", T0 + 60 * i, model_metrics=metrics, model_stats=stats)
        )
    store.rollup(T0 + 120, bucket_s=60)
    report = store.apply_retention(T0 + 1000, raw_keep_s=900, rollup_keep_s=10_000)
    # Two samples of each model go; only resnet's have batch stats (two each).
    assert (report.model_samples, report.batch_stats) == (6, 4)
    [kept] = [s for s in store.model_samples() if s.model == "resnet"]
    assert kept.stats == full_stats("resnet")


def test_non_finite_values_in_json_documents_read_back(store: Store) -> None:
    """A summary without observations has NaN quantiles: PostgreSQL's json refuses the
    NaN token, so the sample must still be stored and read back as NaN."""
    metrics = replace(
        full_metrics(),
        summary_quantiles_us={"nv_inference_queue_summary_us": {0.5: math.nan, 0.9: math.inf}},
        histogram_buckets={"h": {1.0: 2.0, math.inf: 3.0}},
    )
    rates = replace(full_rates(), fail_per_s_by_reason={"REJECTED": -math.inf})
    snapshot = TritonSnapshot("triton-a", T0, model_metrics=(metrics,))
    store.write_triton(snapshot, {("resnet", "1"): rates})

    [sample] = store.model_samples()
    quantiles = sample.metrics.summary_quantiles_us["nv_inference_queue_summary_us"]
    assert math.isnan(quantiles[0.5]) and quantiles[0.9] == math.inf
    assert sample.metrics.histogram_buckets == {"h": {1.0: 2.0, math.inf: 3.0}}
    assert sample.rates is not None
    assert sample.rates.fail_per_s_by_reason == {"REJECTED": -math.inf}
