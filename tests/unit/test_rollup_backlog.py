"""A rollup over a backlog (a store rolled up for the first time, housekeeping that did
not run for a while) reads one bucket at a time: its memory does not grow with the
backlog, and it writes the rows a bucket-by-bucket rollup writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import rollup_pass
from bench.rollup_pass import measured, model_loads
from collector.records import DeviceSample
from collector.store import Store
from collector.synthetic import steady_load

T0 = 1_700_000_040.0  # a multiple of 60
BUCKET_S = 60.0
MODELS = 3


def fill(store: Store, buckets: int) -> None:
    """``buckets`` buckets of one scrape a second of three models and a GPU."""
    seconds = buckets * BUCKET_S - 1
    steady_load(store, model_loads(MODELS), target="triton-a", start=T0, seconds=seconds)
    for i in range(int(seconds) + 1):
        gpu = DeviceSample("nvml", "GPU-aaaa", utilization_gpu_pct=float(i % 100))
        store.write_devices("triton-a", T0 + i, [gpu])


def test_a_backlog_costs_the_memory_of_one_bucket(store: Store) -> None:
    fill(store, 24)
    # Statements compiled and caches filled by a rollup at another bucket size.
    store.rollup(T0 + 2 * BUCKET_S, bucket_s=2 * BUCKET_S)

    _, one_bucket, _ = measured(lambda: store.rollup(T0 + BUCKET_S, bucket_s=BUCKET_S))
    _, backlog, _ = measured(lambda: store.rollup(T0 + 24 * BUCKET_S, bucket_s=BUCKET_S))

    # 23 buckets in one pass, read whole: 28 times one bucket's peak (3.7 MB).
    assert backlog < 3 * one_bucket, (backlog, one_bucket)
    rollups = store.model_rollups(bucket_s=BUCKET_S)
    assert len(rollups) == 24 * MODELS
    assert {r.sample_count for r in rollups} == {60}
    assert len(store.device_rollups(bucket_s=BUCKET_S)) == 24


def test_a_backlog_rolls_up_as_bucket_by_bucket_passes(store: Store, tmp_path: Path) -> None:
    fill(store, 7)
    # The seventh bucket is still open at the cutoff and stays raw.
    assert store.rollup(T0 + 6 * BUCKET_S, bucket_s=BUCKET_S) == 6 * (MODELS + 1)
    at_once = store.model_rollups(bucket_s=BUCKET_S)
    assert max(r.bucket_start for r in at_once) == T0 + 5 * BUCKET_S

    with Store(f"sqlite:///{tmp_path / 'passes.db'}") as passes:
        fill(passes, 7)
        for n in range(1, 7):
            assert passes.rollup(T0 + n * BUCKET_S, bucket_s=BUCKET_S) == MODELS + 1
        assert passes.model_rollups(bucket_s=BUCKET_S) == at_once
        assert passes.device_rollups(bucket_s=BUCKET_S) == store.device_rollups(bucket_s=BUCKET_S)


def test_the_rollup_bench_computes_what_the_store_writes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rollup_pass.main(["--targets", "2", "--models", "3", "--interval", "1", "--bucket", "60"])
    out = capsys.readouterr().out
    assert "(360 model samples)" in out
    assert "same rollup rows: True" in out
