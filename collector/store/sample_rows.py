"""Rows of the sample tables ↔ the records they hold (model samples with their batch
stats, configs, devices)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any, cast

from sqlalchemy import JSON, Table

from collector import records
from collector.records import build_record
from collector.store.mapping import RowValues, field_names, rates_from, record_from
from collector.store.rows import StoredModelConfig
from collector.store.schema import BATCH_STAT_LAYOUT, DEVICE_COLUMNS, RATE_COLUMNS, ModelSampleRow

__all__ = [
    "batch_stats_from",
    "batch_stats_values",
    "config_values",
    "device_values",
    "failure_counts",
    "MODEL_SAMPLE_LAYOUT",
    "MODEL_SAMPLE_LAYOUT_WITHOUT_STATS",
    "model_sample_from",
    "model_sample_row",
    "stored_config",
]

# ``ModelStats`` duration fields, each stored as ``stats_<name>_count``/``_ns``.
_STAT_DURATIONS = tuple(f.name for f in fields(records.ModelStats) if f.type == "Duration")
_METRIC_FIELDS = tuple(
    f.name
    for f in fields(records.ModelMetrics)
    if f.name
    not in (
        "model",
        "version",
        "request_failure_by_reason",
        "summary_quantiles_us",
        "histogram_buckets",
    )
)


def failure_counts(document: Mapping[str, Any] | None) -> dict[str, float]:
    """A stored ``request_failure_by_reason`` document as counts: ``float()`` of each,
    as PostgreSQL keeps a NaN as the string "NaN" (see ``collector.store.bulk``)."""
    return {reason: float(count) for reason, count in (document or {}).items()}


def device_values(target_id: int, at: float, d: records.DeviceSample) -> dict[str, Any]:
    values = {DEVICE_COLUMNS.get(k, k): v for k, v in asdict(d).items()}
    return {"target_id": target_id, "collected_at": at, **values}


# ``model_samples``' values, in the order ``model_sample_row`` gives them: each name is
# the column of a record field. Its JSON documents (each converted its own way) are
# named; every other field is a scalar column, and ``TupleInsert`` checks that these
# are the table's columns.
_METRIC_DOCS = ("request_failure_by_reason", "summary_quantiles_us", "histogram_buckets")
_METRIC_SCALARS = tuple(f for f in _METRIC_FIELDS if f not in _METRIC_DOCS)
# (column, attribute path) of every scalar of ``ModelStats``.
_STAT_SCALARS = tuple(
    pair
    for f in fields(records.ModelStats)
    if f.name not in ("model", "version", "batch_stats")
    for pair in (
        ((f"stats_{f.name}_count", f"{f.name}.count"), (f"stats_{f.name}_ns", f"{f.name}.ns"))
        if f.name in _STAT_DURATIONS
        else ((f"stats_{f.name}", f.name),)
    )
)
_RATE_DOCS = ("fail_per_s_by_reason",)
_RATE_SCALARS = tuple(f for f in field_names(records.ModelRates) if f not in _RATE_DOCS)
MODEL_SAMPLE_LAYOUT: tuple[str, ...] = (
    "model_id",
    "collected_at",
    *_METRIC_SCALARS,
    *_METRIC_DOCS,
    *(column for column, _ in _STAT_SCALARS),
    "batch_stats",
    *(RATE_COLUMNS.get(f, f) for f in _RATE_SCALARS),
    *(RATE_COLUMNS.get(f, f) for f in _RATE_DOCS),
)
# ``MODEL_SAMPLE_LAYOUT`` without the statistics' columns, for the rows of a scrape
# that read no statistics (most scrapes: see ``statistics_interval_s``): the columns
# left out are NULL, and the driver binds twenty fewer parameters a row.
MODEL_SAMPLE_LAYOUT_WITHOUT_STATS: tuple[str, ...] = tuple(
    c for c in MODEL_SAMPLE_LAYOUT if c != "batch_stats" and not c.startswith("stats_")
)
_JSON_COLUMNS = {
    c.name for c in cast(Table, ModelSampleRow.__table__).columns if isinstance(c.type, JSON)
}
if {*_METRIC_DOCS, "batch_stats", *_RATE_DOCS} != _JSON_COLUMNS:
    raise RuntimeError("model_samples: its JSON columns are not the documents written")

_metric_scalars = operator.attrgetter(*_METRIC_SCALARS)
_stat_scalars = operator.attrgetter(*(path for _, path in _STAT_SCALARS))
_rate_scalars = operator.attrgetter(*_RATE_SCALARS)
_NO_STATS = (None,) * (len(_STAT_SCALARS) + 1)
_NO_RATES = (None,) * (len(_RATE_SCALARS) + len(_RATE_DOCS))
# Most documents of a scrape are empty (no failures, no summaries, no histograms).
_EMPTY_DOC = "{}"


def model_sample_row(
    model_id: int,
    at: float,
    m: records.ModelMetrics,
    stats: records.ModelStats | None,
    rates: records.ModelRates | None,
    encode: Callable[[Any], str | None],
    *,
    stats_columns: bool = True,
) -> tuple[Any, ...]:
    """One ``model_samples`` row in ``MODEL_SAMPLE_LAYOUT`` order, its JSON documents
    encoded by ``encode`` (``bulk.dialect_json_encoder``); ``None`` where absent.
    Without ``stats_columns`` (``stats`` must then be None), in
    ``MODEL_SAMPLE_LAYOUT_WITHOUT_STATS`` order."""
    failures = m.request_failure_by_reason
    row = (
        model_id,
        at,
        *_metric_scalars(m),
        encode(_plain(failures)) if failures else _EMPTY_DOC,
        encode(_text_keys(m.summary_quantiles_us)) if m.summary_quantiles_us else _EMPTY_DOC,
        encode(_text_keys(m.histogram_buckets)) if m.histogram_buckets else _EMPTY_DOC,
    )
    if stats is not None:
        if not stats_columns:
            raise ValueError("a row without the statistics' columns holds no statistics")
        row += (*_stat_scalars(stats), encode(batch_stats_values(stats.batch_stats)))
    elif stats_columns:
        row += _NO_STATS
    if rates is not None:
        by_reason = rates.fail_per_s_by_reason
        row += (*_rate_scalars(rates), encode(_plain(by_reason)) if by_reason else _EMPTY_DOC)
    else:
        row += _NO_RATES
    return row


def _plain(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` as a dict (a frozen record may hold another mapping)."""
    return doc if type(doc) is dict else dict(doc)


def _text_keys(doc: Mapping[str, Mapping[float, float]]) -> dict[str, dict[str, float]]:
    """JSON object keys are strings; str(float) round-trips exactly through float()."""
    return {family: {str(k): v for k, v in values.items()} for family, values in doc.items()}


def model_sample_from(row: RowValues) -> records.ModelSample:
    """A sample from a ``model_samples`` row labelled with its model, version and target
    (see ``Store.model_samples``)."""
    model, version = row["model_name"], row["model_version"]
    # float() of each value: PostgreSQL keeps a NaN quantile as the string "NaN"
    # (see ``collector.store.bulk``).
    values = {name: row[name] for name in _METRIC_FIELDS}
    values.update(
        model=model,
        version=version,
        request_failure_by_reason=failure_counts(row["request_failure_by_reason"]),
        summary_quantiles_us={
            family: {float(q): float(v) for q, v in quantiles.items()}
            for family, quantiles in row["summary_quantiles_us"].items()
        },
        histogram_buckets={
            family: {float(le): float(count) for le, count in buckets.items()}
            for family, buckets in (row["histogram_buckets"] or {}).items()
        },
    )
    metrics = build_record(records.ModelMetrics, values)
    stats = None
    if row["stats_inference_count"] is not None:
        stats = records.ModelStats(
            model=model,
            version=version,
            last_inference_ms=row["stats_last_inference_ms"] or 0,
            inference_count=row["stats_inference_count"],
            execution_count=row["stats_execution_count"] or 0,
            **{
                name: records.Duration(
                    row[f"stats_{name}_count"] or 0, row[f"stats_{name}_ns"] or 0
                )
                for name in _STAT_DURATIONS
            },
            batch_stats=batch_stats_from(row["batch_stats"] or ()),
        )
    return build_record(
        records.ModelSample,
        {
            "target": row["target_name"],
            "collected_at": row["collected_at"],
            "metrics": metrics,
            "stats": stats,
            "rates": rates_from(row),
        },
    )


# The positions of the parts of one entry of ``model_samples.batch_stats``, a
# ``BatchStat``'s ``figures`` (``BATCH_STAT_LAYOUT``).
_AT = {path: i for i, path in enumerate(BATCH_STAT_LAYOUT)}
_SIZE = _AT["batch_size"]
_DURATION_AT = tuple(
    (_AT[f"{name}.count"], _AT[f"{name}.ns"])
    for name in ("compute_input", "compute_infer", "compute_output")
)


def batch_stats_values(batches: Sequence[records.BatchStat]) -> list[tuple[int, ...]]:
    """The ``model_samples.batch_stats`` document of a sample's batch stats (a JSON
    array of arrays, each entry ``BatchStat.figures``)."""
    return [b.figures for b in batches]


def batch_stats_from(doc: Sequence[Sequence[int]]) -> tuple[records.BatchStat, ...]:
    """The batch stats of a ``model_samples.batch_stats`` document, in stored order."""
    (in_n, in_ns), (infer_n, infer_ns), (out_n, out_ns) = _DURATION_AT
    return tuple(
        records.BatchStat(
            e[_SIZE],
            records.Duration(e[in_n], e[in_ns]),
            records.Duration(e[infer_n], e[infer_ns]),
            records.Duration(e[out_n], e[out_ns]),
        )
        for e in doc
    )


def config_values(target_id: int, at: float, c: records.ModelConfig) -> dict[str, Any]:
    values = asdict(c)
    values["preferred_batch_sizes"] = list(c.preferred_batch_sizes)
    return {"target_id": target_id, "collected_at": at, **values}


def stored_config(row: RowValues) -> StoredModelConfig:
    """A config from a ``model_configs`` row labelled with its target's name."""
    policy = row["default_queue_policy"]
    config = record_from(
        records.ModelConfig,
        row,
        extra={
            "preferred_batch_sizes": tuple(row["preferred_batch_sizes"]),
            "default_queue_policy": records.QueuePolicy(**policy) if policy is not None else None,
        },
    )
    return StoredModelConfig(row["target_name"], row["collected_at"], config)
