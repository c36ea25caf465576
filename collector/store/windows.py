"""Lean reads of model samples for windowed analyses.

``Store.model_samples`` rebuilds every sample as a full ``ModelSample``: five JSON
documents (summary quantiles, histogram buckets ...), the statistics' durations and a
record per batch size, and the stored rates. A window of counters needs a fraction of
that; over a fleet's window (20 targets x 20 models x a minute of 1 s scrapes) the
full records cost seconds of CPU. ``Store.counter_series`` selects only the columns a
window of counters reads and returns each (target, model, version) as one record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from collector.records import MODEL_COUNTERS
from collector.store.engine import Database
from collector.store.schema import ModelRow, ModelSampleRow, TargetRow

__all__ = ["CounterReading", "CounterSeries", "WindowsMixin"]


@dataclass(frozen=True, slots=True)
class CounterReading:
    """One model sample, reduced to what a window of its counters reads.

    ``counters`` are the ``ModelMetrics`` counters in ``MODEL_COUNTERS`` order;
    ``stats_counts`` the statistics API's ``(execution_count, inference_count)``,
    ``None`` when the sample had no statistics entry (as ``ModelSample.stats``);
    ``batch_stats`` its cumulative batch stats as stored, one entry per batch size in
    ``schema.BATCH_STAT_LAYOUT`` order (empty without statistics or batch stats)."""

    collected_at: float
    counters: tuple[float, ...]
    failure_by_reason: Mapping[str, float]
    pending_request_count: float | None
    stats_counts: tuple[int, int] | None
    batch_stats: Sequence[Sequence[int]]


@dataclass(frozen=True)
class CounterSeries:
    """The readings of one (target, model, version), oldest first."""

    target: str
    model: str
    version: str
    readings: tuple[CounterReading, ...]


_SAMPLE_COLUMNS = (
    ModelSampleRow.model_id,
    ModelSampleRow.collected_at,
    *(getattr(ModelSampleRow, name) for name in MODEL_COUNTERS),
    ModelSampleRow.request_failure_by_reason,
    ModelSampleRow.pending_request_count,
    ModelSampleRow.stats_inference_count,
    ModelSampleRow.stats_execution_count,
    ModelSampleRow.batch_stats,
)
_COUNTERS_END = 2 + len(MODEL_COUNTERS)


class WindowsMixin(Database):
    """``Store`` reads for windows of counters."""

    def counter_series(self, *, since: float, until: float) -> list[CounterSeries]:
        """The samples with ``since <= collected_at <= until`` of every (target, model,
        version) that has any, as lean readings: the same samples, in the same order,
        as ``model_samples(since=since, until=until)`` grouped by series, without the
        documents and records a window of counters does not read. Series are ordered
        by target, model and version."""
        samples_stmt = (
            select(*_SAMPLE_COLUMNS)
            .where(ModelSampleRow.collected_at >= since, ModelSampleRow.collected_at <= until)
            .order_by(ModelSampleRow.model_id, ModelSampleRow.collected_at, ModelSampleRow.id)
        )
        names_stmt = select(ModelRow.id, TargetRow.name, ModelRow.name, ModelRow.version).join(
            TargetRow, TargetRow.id == ModelRow.target_id
        )
        with self._read() as session:
            rows = session.execute(samples_stmt).all()
            names = {row[0]: (row[1], row[2], row[3]) for row in session.execute(names_stmt)}
        by_model: dict[int, list[CounterReading]] = {}
        for row in rows:
            readings = by_model.get(row[0])
            if readings is None:
                readings = by_model[row[0]] = []
            readings.append(_reading(row))
        series = [
            CounterSeries(*names[model_id], tuple(readings))
            for model_id, readings in by_model.items()
        ]
        series.sort(key=lambda s: (s.target, s.model, s.version))
        return series


def _reading(row: Sequence[Any]) -> CounterReading:
    """A reading from a row of ``_SAMPLE_COLUMNS``, its values read as
    ``sample_rows.model_sample_from`` reads them."""
    failures, pending, inference_count, execution_count, batch_stats = row[_COUNTERS_END:]
    return CounterReading(
        collected_at=row[1],
        counters=tuple(row[2:_COUNTERS_END]),
        failure_by_reason=failures,
        pending_request_count=pending,
        stats_counts=None if inference_count is None else (execution_count or 0, inference_count),
        batch_stats=(batch_stats or ()) if inference_count is not None else (),
    )
