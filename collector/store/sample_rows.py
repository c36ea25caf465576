"""Rows of the sample tables ↔ the records they hold (model samples with their batch
stats, configs, devices)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

from collector import records
from collector.store.mapping import RowValues, rates_from, rates_values, record_from
from collector.store.rows import StoredModelConfig
from collector.store.schema import BATCH_STAT_LAYOUT, DEVICE_COLUMNS

__all__ = [
    "batch_stats_from",
    "batch_stats_values",
    "config_values",
    "device_values",
    "model_sample_from",
    "model_sample_values",
    "stored_config",
]

# ``ModelStats`` duration fields, each stored as ``stats_<name>_count``/``_ns``.
_STAT_DURATIONS = tuple(f.name for f in fields(records.ModelStats) if f.type == "Duration")
_METRIC_FIELDS = tuple(
    f.name
    for f in fields(records.ModelMetrics)
    if f.name not in ("model", "version", "summary_quantiles_us", "histogram_buckets")
)


def device_values(target_id: int, at: float, d: records.DeviceSample) -> dict[str, Any]:
    values = {DEVICE_COLUMNS.get(k, k): v for k, v in asdict(d).items()}
    return {"target_id": target_id, "collected_at": at, **values}


def model_sample_values(
    model_id: int,
    at: float,
    m: records.ModelMetrics,
    stats: records.ModelStats | None,
    rates: records.ModelRates | None,
) -> dict[str, Any]:
    """One ``model_samples`` row. Every row has every key (``None`` where absent):
    an executemany needs the same columns in every row."""
    values: dict[str, Any] = {"model_id": model_id, "collected_at": at}
    values.update({name: getattr(m, name) for name in _METRIC_FIELDS})
    values["request_failure_by_reason"] = dict(m.request_failure_by_reason)
    # JSON object keys are strings; str(float) round-trips exactly through float().
    values["summary_quantiles_us"] = {
        family: {str(q): v for q, v in quantiles.items()}
        for family, quantiles in m.summary_quantiles_us.items()
    }
    values["histogram_buckets"] = {
        family: {str(le): count for le, count in buckets.items()}
        for family, buckets in m.histogram_buckets.items()
    }
    values["stats_last_inference_ms"] = stats.last_inference_ms if stats else None
    values["stats_inference_count"] = stats.inference_count if stats else None
    values["stats_execution_count"] = stats.execution_count if stats else None
    for name in _STAT_DURATIONS:
        duration: records.Duration | None = getattr(stats, name) if stats else None
        values[f"stats_{name}_count"] = duration.count if duration else None
        values[f"stats_{name}_ns"] = duration.ns if duration else None
    values["batch_stats"] = batch_stats_values(stats.batch_stats) if stats else None
    values.update(rates_values(rates))
    return values


def model_sample_from(row: RowValues) -> records.ModelSample:
    """A sample from a ``model_samples`` row labelled with its model, version and target
    (see ``Store.model_samples``)."""
    model, version = row["model_name"], row["model_version"]
    # float() of each value: PostgreSQL keeps a NaN quantile as the string "NaN"
    # (see ``collector.store.bulk``).
    metrics = records.ModelMetrics(
        model=model,
        version=version,
        **{name: row[name] for name in _METRIC_FIELDS},
        summary_quantiles_us={
            family: {float(q): float(v) for q, v in quantiles.items()}
            for family, quantiles in row["summary_quantiles_us"].items()
        },
        histogram_buckets={
            family: {float(le): float(count) for le, count in buckets.items()}
            for family, buckets in (row["histogram_buckets"] or {}).items()
        },
    )
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
    return records.ModelSample(
        target=row["target_name"],
        collected_at=row["collected_at"],
        metrics=metrics,
        stats=stats,
        rates=rates_from(row),
    )


# One entry of ``model_samples.batch_stats`` from a ``BatchStat``, and the positions
# of its parts, both from ``BATCH_STAT_LAYOUT``.
_batch_stat_entry = operator.attrgetter(*BATCH_STAT_LAYOUT)
_AT = {path: i for i, path in enumerate(BATCH_STAT_LAYOUT)}
_SIZE = _AT["batch_size"]
_DURATION_AT = tuple(
    (_AT[f"{name}.count"], _AT[f"{name}.ns"])
    for name in ("compute_input", "compute_infer", "compute_output")
)


def batch_stats_values(batches: Sequence[records.BatchStat]) -> list[list[int]]:
    """The ``model_samples.batch_stats`` document of a sample's batch stats."""
    return [list(_batch_stat_entry(b)) for b in batches]


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
