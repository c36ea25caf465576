"""Rollups of raw model and device samples into fixed buckets, and retention.

The arithmetic is ``collector.analysis.rates``': a model bucket's rates are its
scrapes' stored rates merged over time, its peaks their maxima; device readings are
gauges (plain means and maxima).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, Result, Select, delete, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from collector.analysis.rates import gauge_max, gauge_mean, merge_over_time, peak_rates
from collector.records import DeviceSample, ModelRates
from collector.store.engine import Database
from collector.store.mapping import (
    RowValues,
    columns,
    peaks_from,
    peaks_values,
    rates_from,
    rates_values,
)
from collector.store.rows import DeviceRollup, ModelRollup, RetentionReport
from collector.store.schema import (
    DEVICE_MEAN_READINGS,
    DEVICE_PEAK_READINGS,
    RATE_COLUMNS,
    DeviceRollupRow,
    DeviceSampleRow,
    ModelRollupRow,
    ModelRow,
    ModelSampleRow,
    ProcessSampleRow,
    RollupMarkRow,
    ServerSampleRow,
    TargetRow,
)

__all__ = ["RollupsMixin"]

_RATE_COLUMN_NAMES = tuple(RATE_COLUMNS.get(f, f) for f in ModelRates.__dataclass_fields__)


class RollupsMixin(Database):
    """``Store`` methods that roll samples up, read rollups and apply retention."""

    def rollup(self, now: float, *, bucket_s: float) -> int:
        """Aggregate raw model and device samples into ``bucket_s``-long buckets
        aligned to multiples of ``bucket_s``; a bucket is closed once its end is
        ``<= now``. Returns the number of rollup rows written.

        Idempotent: each (kind, bucket size) keeps a mark of how far it has rolled up,
        so a re-run writes nothing new, and a bucket is written once. A raw sample
        that arrives after its bucket was rolled up (its ``collected_at`` already
        below the mark) stays out of the rollup; callers that write late should roll
        up with ``now`` lagging by their lateness.
        """
        if not bucket_s > 0 or not math.isfinite(bucket_s):
            raise ValueError(f"bucket_s must be a positive number, got {bucket_s!r}")
        cutoff = math.floor(now / bucket_s) * bucket_s
        with self._write() as session:
            return self._rollup_models(session, cutoff, bucket_s) + self._rollup_devices(
                session, cutoff, bucket_s
            )

    def model_rollups(
        self,
        *,
        target: str | None = None,
        model: str | None = None,
        version: str | None = None,
        bucket_s: float | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[ModelRollup]:
        """Model rollups with ``since <= bucket_start <= until``, oldest first."""
        stmt = (
            select(
                *columns(ModelRollupRow),
                TargetRow.name.label("target_name"),
                ModelRow.name.label("model_name"),
                ModelRow.version.label("model_version"),
            )
            .join(ModelRow, ModelRow.id == ModelRollupRow.model_id)
            .join(TargetRow, TargetRow.id == ModelRow.target_id)
            .order_by(ModelRollupRow.bucket_start, TargetRow.name, ModelRow.name, ModelRow.version)
        )
        stmt = stmt.where(*_rollup_filters(ModelRollupRow, bucket_s, since, until))
        if target is not None:
            stmt = stmt.where(TargetRow.name == target)
        if model is not None:
            stmt = stmt.where(ModelRow.name == model)
        if version is not None:
            stmt = stmt.where(ModelRow.version == version)
        with self._read() as session:
            return [_model_rollup_from(r) for r in session.execute(stmt).mappings()]

    def device_rollups(
        self,
        *,
        target: str | None = None,
        source: str | None = None,
        uuid: str | None = None,
        bucket_s: float | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[DeviceRollup]:
        """Device rollups with ``since <= bucket_start <= until``, oldest first."""
        stmt = (
            select(*columns(DeviceRollupRow), TargetRow.name.label("target_name"))
            .join(TargetRow, TargetRow.id == DeviceRollupRow.target_id)
            .order_by(
                DeviceRollupRow.bucket_start,
                TargetRow.name,
                DeviceRollupRow.source,
                DeviceRollupRow.uuid,
            )
        )
        stmt = stmt.where(*_rollup_filters(DeviceRollupRow, bucket_s, since, until))
        if target is not None:
            stmt = stmt.where(TargetRow.name == target)
        if source is not None:
            stmt = stmt.where(DeviceRollupRow.source == source)
        if uuid is not None:
            stmt = stmt.where(DeviceRollupRow.uuid == uuid)
        with self._read() as session:
            return [_device_rollup_from(r) for r in session.execute(stmt).mappings()]

    def apply_retention(
        self, now: float, *, raw_keep_s: float, rollup_keep_s: float
    ) -> RetentionReport:
        """Delete what is too old, in one transaction.

        Raw model and device samples (with the model samples' batch stats, which the
        report counts by entry) go when older than ``raw_keep_s`` *and* already rolled
        up at some bucket size; without any rollup they are kept. Server and process
        samples, which are not rolled up, go when older than ``raw_keep_s``. Rollups go
        once their bucket ended more than ``rollup_keep_s`` ago. Configs, transitions,
        findings, recommendations and host facts are kept.
        """
        raw_cut = now - raw_keep_s
        rollup_cut = now - rollup_keep_s
        counts: dict[str, int] = {}
        with self._write() as session:
            model_cut = _min_or_none(raw_cut, self._rolled_until(session, "model"))
            if model_cut is not None:
                # The batch stats are entries of the samples' rows; counted as before.
                entries = func.json_array_length(ModelSampleRow.batch_stats)
                counts["batch_stats"] = int(
                    session.scalar(
                        select(func.coalesce(func.sum(entries), 0)).where(
                            ModelSampleRow.collected_at < model_cut
                        )
                    )
                    or 0
                )
                counts["model_samples"] = _delete(
                    session, delete(ModelSampleRow).where(ModelSampleRow.collected_at < model_cut)
                )
            device_cut = _min_or_none(raw_cut, self._rolled_until(session, "device"))
            if device_cut is not None:
                counts["device_samples"] = _delete(
                    session,
                    delete(DeviceSampleRow).where(DeviceSampleRow.collected_at < device_cut),
                )
            for name, table in (
                ("server_samples", ServerSampleRow),
                ("process_samples", ProcessSampleRow),
            ):
                counts[name] = _delete(session, delete(table).where(table.collected_at < raw_cut))
            for name, rollups in (
                ("model_rollups", ModelRollupRow),
                ("device_rollups", DeviceRollupRow),
            ):
                ended = rollups.bucket_start + rollups.bucket_s <= rollup_cut
                counts[name] = _delete(session, delete(rollups).where(ended))
        return RetentionReport(**counts)

    # ------------------------------------------------------------------ internals

    def _rolled_until(self, session: Session, kind: str) -> float | None:
        """How far raw samples of ``kind`` are rolled up at any bucket size."""
        return session.scalar(
            select(func.max(RollupMarkRow.rolled_until)).where(RollupMarkRow.kind == kind)
        )

    def _advance_mark(
        self, session: Session, kind: str, bucket_s: float, cutoff: float
    ) -> tuple[float | None, bool]:
        """Return (previous mark, whether there is anything to roll up) and move the
        mark to ``cutoff``; the mark row is locked on PostgreSQL so concurrent
        rollups of one kind serialise."""
        mark = session.get(RollupMarkRow, (kind, bucket_s), with_for_update=True)
        if mark is None:
            session.add(RollupMarkRow(kind=kind, bucket_s=bucket_s, rolled_until=cutoff))
            return None, True
        previous = mark.rolled_until
        if cutoff <= previous:
            return previous, False
        mark.rolled_until = cutoff
        return previous, True

    def _rollup_models(self, session: Session, cutoff: float, bucket_s: float) -> int:
        since, todo = self._advance_mark(session, "model", bucket_s, cutoff)
        if not todo:
            return 0
        written = 0
        at = ModelSampleRow.collected_at
        for start, end in _filled_buckets(session, at, since, cutoff, bucket_s):
            stmt = (
                select(
                    ModelSampleRow.model_id,
                    ModelSampleRow.pending_request_count,
                    *(getattr(ModelSampleRow, name) for name in _RATE_COLUMN_NAMES),
                )
                .where(at >= start, at < end)
                .order_by(ModelSampleRow.model_id, at)
            )
            rows = [
                _model_rollup_values(model_id, start, bucket_s, list(samples))
                for model_id, samples in groupby(
                    _streamed(session, stmt).mappings(), key=itemgetter("model_id")
                )
            ]
            self._insert_ignoring_duplicates(
                session, ModelRollupRow, rows, ["bucket_s", "bucket_start", "model_id"]
            )
            written += len(rows)
        return written

    def _rollup_devices(self, session: Session, cutoff: float, bucket_s: float) -> int:
        since, todo = self._advance_mark(session, "device", bucket_s, cutoff)
        if not todo:
            return 0
        written = 0
        at = DeviceSampleRow.collected_at
        device = (DeviceSampleRow.target_id, DeviceSampleRow.source, DeviceSampleRow.uuid)
        for start, end in _filled_buckets(session, at, since, cutoff, bucket_s):
            stmt = (
                select(
                    *device,
                    DeviceSampleRow.kind,
                    *(getattr(DeviceSampleRow, f) for f in DEVICE_MEAN_READINGS),
                )
                .where(at >= start, at < end)
                .order_by(*device, at, DeviceSampleRow.id)
            )
            rows = [
                _device_rollup_values(target_id, source, uuid, start, bucket_s, list(samples))
                for (target_id, source, uuid), samples in groupby(
                    _streamed(session, stmt), key=itemgetter(0, 1, 2)
                )
            ]
            self._insert_ignoring_duplicates(
                session,
                DeviceRollupRow,
                rows,
                ["bucket_s", "bucket_start", "target_id", "source", "uuid"],
            )
            written += len(rows)
        return written


# --------------------------------------------------------------------------- helpers


def _bucket_start(at: float, bucket_s: float) -> float:
    return math.floor(at / bucket_s) * bucket_s


# Rows a rollup reads from the database at a time; one model's or device's bucket is
# what it holds in Python.
_ROLLUP_FETCH_ROWS = 1000


def _filled_buckets(
    session: Session,
    at: InstrumentedAttribute[float],
    since: float | None,
    cutoff: float,
    bucket_s: float,
) -> Iterator[tuple[float, float]]:
    """The ``[start, end)`` buckets below ``cutoff`` (a bucket boundary) that hold a
    sample, oldest first, from ``since`` on. A rollup reads one bucket at a time, so a
    backlog of days (a store rolled up for the first time, a long outage of the
    housekeeping) costs the memory of one bucket, not of the backlog; the index on
    ``at`` skips empty stretches."""
    while since is None or since < cutoff:
        first = select(func.min(at)).where(at < cutoff)
        if since is not None:
            first = first.where(at >= since)
        earliest = session.scalar(first)
        if earliest is None:
            return
        # ``since`` and ``cutoff`` are bucket boundaries; max() and min() keep a sample
        # a hair from one (rounded into the neighbouring bucket) inside them.
        start = _bucket_start(earliest, bucket_s)
        if since is not None:
            start = max(start, since)
        since = min(start + bucket_s, cutoff)
        yield start, since


def _streamed(session: Session, stmt: Select[Any]) -> Result[Any]:
    """``stmt``'s rows fetched in batches (a server-side cursor on PostgreSQL)."""
    return session.execute(stmt.execution_options(yield_per=_ROLLUP_FETCH_ROWS))


def _model_rollup_values(
    model_id: int, bucket_start: float, bucket_s: float, samples: Sequence[RowValues]
) -> dict[str, Any]:
    rates = [r for r in (rates_from(s) for s in samples) if r is not None]
    pending = [s["pending_request_count"] for s in samples]
    return {
        "model_id": model_id,
        "bucket_start": bucket_start,
        "bucket_s": bucket_s,
        "sample_count": len(samples),
        "pending_request_count": gauge_mean(pending),
        "pending_request_count_max": gauge_max(pending),
        **rates_values(merge_over_time(rates)),
        **peaks_values(peak_rates(rates)),
    }


def _model_rollup_from(row: RowValues) -> ModelRollup:
    return ModelRollup(
        target=row["target_name"],
        model=row["model_name"],
        version=row["model_version"],
        bucket_start=row["bucket_start"],
        bucket_s=row["bucket_s"],
        sample_count=row["sample_count"],
        rates=rates_from(row),
        peaks=peaks_from(row),
        pending_request_count=row["pending_request_count"],
        pending_request_count_max=row["pending_request_count_max"],
    )


def _device_rollup_values(
    target_id: int,
    source: str,
    uuid: str,
    bucket_start: float,
    bucket_s: float,
    samples: Sequence[Any],
) -> dict[str, Any]:
    """Device readings are gauges sampled once per tick: plain means and maxima."""
    values: dict[str, Any] = {
        "target_id": target_id,
        "source": source,
        "uuid": uuid,
        "kind": samples[-1].kind,  # the latest, should a device be re-partitioned
        "bucket_start": bucket_start,
        "bucket_s": bucket_s,
        "sample_count": len(samples),
    }
    for name in DEVICE_MEAN_READINGS:
        values[name] = gauge_mean(getattr(s, name) for s in samples)
    for name in DEVICE_PEAK_READINGS:
        values[f"{name}_max"] = gauge_max(getattr(s, name) for s in samples)
    return values


def _device_rollup_from(row: RowValues) -> DeviceRollup:
    device = {"source": row["source"], "uuid": row["uuid"], "kind": row["kind"]}
    mean = {name: row[name] for name in DEVICE_MEAN_READINGS}
    peak = {name: row[f"{name}_max"] for name in DEVICE_PEAK_READINGS}
    return DeviceRollup(
        target=row["target_name"],
        bucket_start=row["bucket_start"],
        bucket_s=row["bucket_s"],
        sample_count=row["sample_count"],
        mean=DeviceSample(**device, **mean),
        peak=DeviceSample(**device, **peak),
    )


def _rollup_filters(
    table: type[ModelRollupRow] | type[DeviceRollupRow],
    bucket_s: float | None,
    since: float | None,
    until: float | None,
) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if bucket_s is not None:
        where.append(table.bucket_s == bucket_s)
    if since is not None:
        where.append(table.bucket_start >= since)
    if until is not None:
        where.append(table.bucket_start <= until)
    return where


def _delete(session: Session, stmt: Any) -> int:
    """Run a bulk DELETE and return how many rows it removed. The session holds no
    objects of these tables, so there is nothing to synchronise."""
    result = session.execute(stmt.execution_options(synchronize_session=False))
    return cast(CursorResult[Any], result).rowcount


def _min_or_none(a: float, b: float | None) -> float | None:
    return None if b is None else min(a, b)
