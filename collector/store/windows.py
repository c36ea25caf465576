"""Lean reads of model samples for windowed analyses.

``Store.model_samples`` rebuilds every sample as a full ``ModelSample``: five JSON
documents (summary quantiles, histogram buckets ...), the statistics' durations and a
record per batch size, and the stored rates. A window of counters needs a fraction of
that; over a fleet's window (20 targets x 20 models x a minute of 1 s scrapes) the
full records cost seconds of CPU. ``Store.counter_series`` selects only the columns a
window of counters reads and returns each (target, model, version) as one record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Text, cast, select

from collector.records import MODEL_COUNTERS
from collector.store.engine import Database
from collector.store.sample_rows import failure_counts
from collector.store.schema import BATCH_STAT_LAYOUT, ModelRow, ModelSampleRow, TargetRow

__all__ = ["BATCH_ENTRY", "BatchEntryLayout", "CounterReading", "CounterSeries", "WindowsMixin"]


@dataclass(frozen=True)
class BatchEntryLayout:
    """Positions in one stored batch stats entry (``CounterReading.batch_stats``)."""

    batch_size: int
    input_ns: int
    infer_count: int
    infer_ns: int
    output_ns: int


BATCH_ENTRY = BatchEntryLayout(
    batch_size=BATCH_STAT_LAYOUT.index("batch_size"),
    input_ns=BATCH_STAT_LAYOUT.index("compute_input.ns"),
    infer_count=BATCH_STAT_LAYOUT.index("compute_infer.count"),
    infer_ns=BATCH_STAT_LAYOUT.index("compute_infer.ns"),
    output_ns=BATCH_STAT_LAYOUT.index("compute_output.ns"),
)


@dataclass(frozen=True, slots=True)
class CounterReading:
    """One model sample, reduced to what a window of its counters reads.

    ``counters`` are the ``ModelMetrics`` counters in ``MODEL_COUNTERS`` order;
    ``stats_counts`` the statistics API's ``(execution_count, inference_count)``,
    ``None`` when the sample had no statistics entry (as ``ModelSample.stats``);
    ``batch_stats_doc`` its stored batch stats document (see ``batch_stats``)."""

    collected_at: float
    counters: tuple[float, ...]
    failure_by_reason: Mapping[str, float]
    pending_request_count: float | None
    stats_counts: tuple[int, int] | None
    batch_stats_doc: str | None

    def batch_stats(self) -> Sequence[Sequence[int]]:
        """The cumulative batch stats, one entry per batch size (positions:
        ``BATCH_ENTRY``), as stored; empty without statistics or batch stats. Decoded
        on each call: a window reads each once, and the decoded lists of every sample
        of a fleet's window, kept, cost more in the garbage collector's passes over
        them than their decoding."""
        if self.stats_counts is None or self.batch_stats_doc is None:
            return ()
        try:
            doc: Sequence[Sequence[int]] = orjson.loads(self.batch_stats_doc)
        except orjson.JSONDecodeError:
            doc = json.loads(self.batch_stats_doc)
        return doc


@dataclass(frozen=True)
class CounterSeries:
    """The readings of one (target, model, version), oldest first."""

    target: str
    model: str
    version: str
    readings: tuple[CounterReading, ...]


# The JSON documents are selected as their text: SQLAlchemy's decoding of them cost
# three times the rest of the read; they are decoded here (see ``_Documents``).
_SAMPLE_COLUMNS = (
    ModelSampleRow.model_id,
    ModelSampleRow.collected_at,
    *(getattr(ModelSampleRow, name) for name in MODEL_COUNTERS),
    cast(ModelSampleRow.request_failure_by_reason, Text).label("failures_text"),
    ModelSampleRow.pending_request_count,
    ModelSampleRow.stats_inference_count,
    ModelSampleRow.stats_execution_count,
    cast(ModelSampleRow.batch_stats, Text).label("batch_stats_text"),
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
        documents = _Documents()
        by_model: dict[int, list[CounterReading]] = {}
        for row in rows:
            readings = by_model.get(row[0])
            if readings is None:
                readings = by_model[row[0]] = []
            readings.append(documents.reading(row))
        series = [
            CounterSeries(*names[model_id], tuple(readings))
            for model_id, readings in by_model.items()
        ]
        series.sort(key=lambda s: (s.target, s.model, s.version))
        return series


class _Documents:
    """Decodes the JSON documents of a read's rows as ``json.loads`` does (SQLAlchemy's
    ``JSON`` type, what ``model_samples`` reads them with). A failures document is
    decoded once per distinct text (most scrapes repeat the previous one). Batch stats
    are decoded when read (``CounterReading.batch_stats``): integers only, by orjson,
    which reads integers as ``json.loads`` does (one it refuses, e.g. past 64 bits, is
    read by ``json.loads``)."""

    def __init__(self) -> None:
        self._failures: dict[str, Mapping[str, float]] = {}

    def failures(self, text: str | None) -> Mapping[str, float]:
        if text is None:
            return {}
        doc = self._failures.get(text)
        if doc is None:
            doc = self._failures[text] = failure_counts(json.loads(text))
        return doc

    def reading(self, row: Sequence[Any]) -> CounterReading:
        """A reading from a row of ``_SAMPLE_COLUMNS``, its values read as
        ``sample_rows.model_sample_from`` reads them."""
        failures, pending, inference_count, execution_count, batch_stats = row[_COUNTERS_END:]
        has_stats = inference_count is not None
        return CounterReading(
            collected_at=row[1],
            counters=tuple(row[2:_COUNTERS_END]),
            failure_by_reason=self.failures(failures),
            pending_request_count=pending,
            stats_counts=(execution_count or 0, inference_count) if has_stats else None,
            batch_stats_doc=batch_stats if has_stats else None,
        )
