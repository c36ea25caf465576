"""Store size: bytes per target per day, and the bounded size under default retention.

From a window of collection on a simulated fleet: the store's growth over the window
(``BenchStore.size_bytes``) divided by the target-scrapes done in it is the cost of one
target-scrape; times the scrapes of a day at the default interval it is the raw bytes
per target per day. Then the collector is stopped and the window's raw samples are
rolled up into short buckets, which measures one rollup row (a row is the same size
whatever its bucket). The bounded size per target under the default retention
(``RetentionSettings``): ``raw_keep_s`` of raw samples plus ``rollup_keep_s`` of one
rollup row per model per ``rollup_bucket_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.fleet_run import BenchStore, rollup_now
from collector.config import RetentionSettings, Settings

__all__ = ["StoreSize", "measure_rollup_row", "store_size"]

DAY_S = 86400.0
DEFAULT_INTERVAL_S = float(Settings.model_fields["interval_s"].default)
RETENTION = RetentionSettings()
# Buckets short enough that a one-minute window makes many rollup rows to average.
_MEASURE_BUCKET_S = 10.0


@dataclass(frozen=True)
class StoreSize:
    kind: str
    models: int
    scrapes: int  # target-scrapes in the window
    growth_bytes: int
    rollup_rows: int
    rollup_bytes: int
    file_bytes: int  # SQLite: file + WAL on disk at the end

    @property
    def bytes_per_target_scrape(self) -> float | None:
        return self.growth_bytes / self.scrapes if self.scrapes else None

    @property
    def raw_per_target_day(self) -> float | None:
        """Raw bytes per target per day at the default interval."""
        per_scrape = self.bytes_per_target_scrape
        return None if per_scrape is None else per_scrape * DAY_S / DEFAULT_INTERVAL_S

    @property
    def bytes_per_rollup_row(self) -> float | None:
        return self.rollup_bytes / self.rollup_rows if self.rollup_rows else None

    @property
    def rollup_rows_per_target(self) -> float:
        """Rollup rows one target keeps under the default retention."""
        return self.models * RETENTION.rollup_keep_s / RETENTION.rollup_bucket_s

    @property
    def steady_per_target(self) -> float | None:
        """Bounded bytes per target: raw samples of ``raw_keep_s`` and rollups of
        ``rollup_keep_s``."""
        raw, row = self.raw_per_target_day, self.bytes_per_rollup_row
        if raw is None or row is None:
            return None
        return raw * RETENTION.raw_keep_s / DAY_S + row * self.rollup_rows_per_target


def measure_rollup_row(store: BenchStore, source_root: Path | None) -> tuple[int, int]:
    """Roll the stored raw samples up into short buckets (the collector stopped);
    returns the rollup rows written and the bytes the store grew by."""
    before = store.size_bytes()
    rows = rollup_now(store.url, _MEASURE_BUCKET_S, source_root)
    return rows, store.size_bytes() - before


def store_size(
    store: BenchStore,
    models: int,
    scrapes: int,
    growth_bytes: int,
    source_root: Path | None = None,
) -> StoreSize:
    """After a window of ``scrapes`` target-scrapes that grew the store by
    ``growth_bytes``, with the collector stopped."""
    try:
        rows, rollup_bytes = measure_rollup_row(store, source_root)
    except Exception as exc:  # noqa: BLE001 - reported; the raw figures still stand
        print(f"  rollup measurement failed: {type(exc).__name__}: {exc}")
        rows, rollup_bytes = 0, 0
    return StoreSize(
        kind=store.kind,
        models=models,
        scrapes=scrapes,
        growth_bytes=growth_bytes,
        rollup_rows=rows,
        rollup_bytes=rollup_bytes,
        file_bytes=store.file_bytes(),
    )


def human(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
