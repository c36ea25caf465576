"""The SQLAlchemy 2 schema of batchscope's store.

Conventions:

* Times are Unix seconds in ``Float`` columns (double precision on PostgreSQL): the
  API speaks float seconds, and a float compares and indexes the same on every backend.
* Counters read from Triton are ``Float`` when the metrics endpoint gives floats and
  ``BigInteger`` when the statistics API gives integers (nanoseconds overflow 32 bits
  within seconds).
* Raw samples are cumulative, exactly as read; rates are derived elsewhere
  (``collector.analysis``) and stored beside the counters they came from.
* Attribute names equal column names, so bulk inserts can pass plain dicts.

Only ``collector.store`` imports this module.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from collector.records import (
    BATCH_STAT_FIGURES,
    DeviceSample,
    HostFacts,
    ModelPeaks,
    ModelRates,
    ProcessSample,
    Recommendation,
    ServerMetrics,
)

__all__ = [
    "DEVICE_COLUMNS",
    "DEVICE_MEAN_READINGS",
    "DEVICE_PEAK_READINGS",
    "PEAK_COLUMNS",
    "RATE_COLUMNS",
    "RECOMMENDATION_JSON_FIELDS",
    "BATCH_STAT_LAYOUT",
    "Base",
    "DetectorStreakRow",
    "HostFactsRow",
    "DeviceRollupRow",
    "DeviceSampleRow",
    "FindingRow",
    "ModelConfigRow",
    "ModelRollupRow",
    "ModelRow",
    "ModelSampleRow",
    "ProcessSampleRow",
    "RecommendationRow",
    "RollupMarkRow",
    "ServerSampleRow",
    "TargetRow",
    "TransitionRow",
    "record_columns",
]

# SQLite only auto-increments a column declared exactly ``INTEGER PRIMARY KEY``;
# PostgreSQL gets 64-bit ids because sample tables grow by thousands of rows a minute.
ID = BigInteger().with_variant(Integer(), "sqlite")
# ``none_as_null``: a missing document is SQL NULL, not the JSON text ``null``.
JSONDoc = JSON(none_as_null=True)


class Base(DeclarativeBase):
    # Named constraints keep future migrations (Alembic) deterministic across backends.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {
        float: Float(),
        int: BigInteger(),
        str: Text(),
        bool: Boolean(),
        dict[str, Any]: JSONDoc,
    }


# --------------------------------------------------------------------------- columns from records

_SCALAR_TYPES: dict[type, TypeEngine[Any]] = {
    float: Float(),
    int: BigInteger(),
    str: Text(),
    bool: Boolean(),
}


def record_columns(
    record: type,
    *,
    rename: Mapping[str, str] | None = None,
    skip: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
    types_: Mapping[str, TypeEngine[Any]] | None = None,
    nullable: bool | None = None,
) -> list[Column[Any]]:
    """One column per field of dataclass ``record`` (those in ``only`` when given,
    but those in ``skip``), so a table that stores a record never repeats its field
    list: the name (or ``rename[name]``), the type from the annotation (scalars as
    ``type_annotation_map``; anything else, e.g. a dict, a tuple or a nested record, as
    a JSON document), NULL allowed when the annotation allows ``None`` (or as
    ``nullable`` says for every column)."""
    rename = rename or {}
    types_ = types_ or {}
    hints = typing.get_type_hints(record)
    columns: list[Column[Any]] = []
    for f in fields(record):
        if f.name in skip or (only is not None and f.name not in only):
            continue
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
        optional = type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if args else hint
        sql_type = types_.get(f.name) or _SCALAR_TYPES.get(base) or JSONDoc
        columns.append(
            Column(
                rename.get(f.name, f.name),
                sql_type,
                nullable=optional if nullable is None else nullable,
            )
        )
    return columns


def _add_columns(table: type[Base], columns: list[Column[Any]]) -> None:
    # Declarative classes take columns assigned after the class body.
    for column in columns:
        setattr(table, column.name, column)


#: ``ModelRates`` fields stored under another column name (a sample's "window" and
#: "resets" would read as the scrape's own).
RATE_COLUMNS: dict[str, str] = {"window_s": "rate_window_s", "resets": "rate_resets"}
#: ``ModelPeaks`` fields are stored as ``<field>_max``.
PEAK_COLUMNS: dict[str, str] = {f.name: f"{f.name}_max" for f in fields(ModelPeaks)}
#: ``DeviceSample`` fields stored under another column name (``index`` and ``name``
#: read as SQL keywords or ORM attributes elsewhere).
DEVICE_COLUMNS: dict[str, str] = {"index": "device_index", "name": "device_name"}
# ``DeviceSample`` ids and counts small enough for a 32-bit column.
_SMALL_DEVICE_INTS = ("index", "gpu_instance_id", "compute_instance_id", "sm_clock_mhz")
#: ``DeviceSample`` readings a device rollup keeps the mean of...
DEVICE_MEAN_READINGS = (
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "memory_used_bytes",
    "power_w",
)
#: ...and those it also keeps the maximum of.
DEVICE_PEAK_READINGS = ("utilization_gpu_pct", "sm_active_pct", "memory_used_bytes", "power_w")
#: One ``model_samples.batch_stats`` entry: ``records.BATCH_STAT_FIGURES``.
BATCH_STAT_LAYOUT = BATCH_STAT_FIGURES
#: ``Recommendation`` fields stored as JSON documents (the rest are scalar columns).
RECOMMENDATION_JSON_FIELDS = (
    "changes",
    "current_config",
    "proposed_config",
    "current",
    "predicted",
    "evidence",
)


def _rate_columns() -> list[Column[Any]]:
    # Every rate column is NULL where there are no rates (the first scrape of a series,
    # a bucket without rated scrapes); ``resets`` is a small count.
    return record_columns(
        ModelRates, rename=RATE_COLUMNS, types_={"resets": Integer()}, nullable=True
    )


# --------------------------------------------------------------------------- targets


class TargetRow(Base):
    """One monitored target (a Triton server or a host) and its current health."""

    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(unique=True)
    kind: Mapped[str]
    up: Mapped[bool | None]
    last_error_kind: Mapped[str | None]
    last_error: Mapped[str | None]
    last_seen_at: Mapped[float | None]
    last_scrape_at: Mapped[float | None]
    last_duration_s: Mapped[float | None]
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    server_version: Mapped[str | None]
    interval_s: Mapped[float | None]
    url: Mapped[str | None]
    metrics_url: Mapped[str | None]


class TransitionRow(Base):
    """A (target, source) changed between up and down, or was scraped the first time."""

    __tablename__ = "target_transitions"
    __table_args__ = (Index(None, "target_id", "source", "id"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"))
    source: Mapped[str]
    at: Mapped[float]
    up: Mapped[bool]
    error_kind: Mapped[str | None]
    error: Mapped[str | None]


# --------------------------------------------------------------------------- models


class ModelRow(Base):
    """The identity of one (target, model, version)."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("target_id", "name", "version"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"))
    name: Mapped[str]
    version: Mapped[str]


class ModelSampleRow(Base):
    """One scrape of one (model, version): metrics counters, the statistics API's
    scalar counters (all NULL when the API gave no entry) and the rates since the
    previous scrape (all NULL for the first scrape of a series)."""

    __tablename__ = "model_samples"
    __table_args__ = (
        Index(None, "model_id", "collected_at"),
        # Rollups and retention scan by time across all models.
        Index(None, "collected_at"),
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    model_id: Mapped[int] = mapped_column(ID, ForeignKey("models.id"))
    collected_at: Mapped[float]

    # ModelMetrics (metrics endpoint, summed over gpu_uuid)
    request_success: Mapped[float]
    request_failure_by_reason: Mapped[dict[str, Any]]
    inference_count: Mapped[float]
    exec_count: Mapped[float]
    request_duration_us: Mapped[float]
    queue_duration_us: Mapped[float]
    compute_input_duration_us: Mapped[float]
    compute_infer_duration_us: Mapped[float]
    compute_output_duration_us: Mapped[float]
    pending_request_count: Mapped[float | None]
    cache_hit_count: Mapped[float | None]
    cache_miss_count: Mapped[float | None]
    cache_hit_duration_us: Mapped[float | None]
    cache_miss_duration_us: Mapped[float | None]
    load_duration_s: Mapped[float | None]
    # {family: {quantile as text: µs}}: JSON keys are strings.
    summary_quantiles_us: Mapped[dict[str, Any]]
    # {family: {upper bound as text ("inf" for +Inf): cumulative count}}.
    histogram_buckets: Mapped[dict[str, Any] | None]

    # ModelStats (statistics API); prefixed because the metric names collide.
    stats_last_inference_ms: Mapped[int | None]
    stats_inference_count: Mapped[int | None]
    stats_execution_count: Mapped[int | None]
    stats_success_count: Mapped[int | None]
    stats_success_ns: Mapped[int | None]
    stats_fail_count: Mapped[int | None]
    stats_fail_ns: Mapped[int | None]
    stats_queue_count: Mapped[int | None]
    stats_queue_ns: Mapped[int | None]
    stats_compute_input_count: Mapped[int | None]
    stats_compute_input_ns: Mapped[int | None]
    stats_compute_infer_count: Mapped[int | None]
    stats_compute_infer_ns: Mapped[int | None]
    stats_compute_output_count: Mapped[int | None]
    stats_compute_output_ns: Mapped[int | None]
    stats_cache_hit_count: Mapped[int | None]
    stats_cache_hit_ns: Mapped[int | None]
    stats_cache_miss_count: Mapped[int | None]
    stats_cache_miss_ns: Mapped[int | None]
    # The statistics API's ``batch_stats`` entries, cumulative as read: a compact JSON
    # array with one array per batch size, in ``BATCH_STAT_LAYOUT`` order, in the order
    # of the record (the parser's: by batch size). NULL when the sample had no
    # statistics entry, ``[]`` when the entry had no batch stats.
    batch_stats: Mapped[list[Any] | None] = mapped_column(JSONDoc)

    # ModelRates: see ``_rate_columns`` (added below the class).


_add_columns(ModelSampleRow, _rate_columns())


class ModelConfigRow(Base):
    """A model's effective config, one row per change of ``raw_json``.

    Keyed by (target, model name) rather than ``models.id``: Triton serves one config
    per model, shared by all its versions.
    """

    __tablename__ = "model_configs"
    __table_args__ = (Index(None, "target_id", "model", "id"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"))
    model: Mapped[str]
    collected_at: Mapped[float]
    max_batch_size: Mapped[int] = mapped_column(Integer)
    dynamic_batching: Mapped[bool]
    preferred_batch_sizes: Mapped[list[int]] = mapped_column(JSONDoc)
    max_queue_delay_us: Mapped[int]
    priority_levels: Mapped[int] = mapped_column(Integer)
    default_queue_policy: Mapped[dict[str, Any] | None]
    instance_count: Mapped[int] = mapped_column(Integer)
    instance_kind: Mapped[str]
    backend: Mapped[str | None]
    platform: Mapped[str | None]
    raw_json: Mapped[str]


# --------------------------------------------------------------------------- server, devices


class ServerSampleRow(Base):
    __tablename__ = "server_samples"
    __table_args__ = (Index(None, "target_id", "collected_at"), Index(None, "collected_at"))

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"))
    collected_at: Mapped[float]
    # ServerMetrics: see below the class.


_add_columns(ServerSampleRow, record_columns(ServerMetrics))


class DeviceSampleRow(Base):
    """A ``DeviceSample``; ``device_index``/``device_name`` are its ``index``/``name``
    (names that read as SQL keywords or ORM attributes elsewhere)."""

    __tablename__ = "device_samples"
    __table_args__ = (Index(None, "target_id", "collected_at"), Index(None, "collected_at"))

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"))
    collected_at: Mapped[float]
    # Which device: declared here to be queried by; the readings come from the record.
    source: Mapped[str]
    uuid: Mapped[str]
    kind: Mapped[str]


_add_columns(
    DeviceSampleRow,
    record_columns(
        DeviceSample,
        rename=DEVICE_COLUMNS,
        skip=("source", "uuid", "kind"),
        types_=dict.fromkeys(_SMALL_DEVICE_INTS, Integer()),
    ),
)


class ProcessSampleRow(Base):
    __tablename__ = "process_samples"
    __table_args__ = (Index(None, "target_id", "collected_at"), Index(None, "collected_at"))

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"))
    collected_at: Mapped[float]
    # ProcessSample: see below the class.


_add_columns(ProcessSampleRow, record_columns(ProcessSample))


# --------------------------------------------------------------------------- rollups


class ModelRollupRow(Base):
    """One bucket of one (model, version): its ``ModelRates`` (the columns of
    ``model_samples``, merged over the bucket), its ``ModelPeaks`` (``<field>_max``)
    and the pending-request gauge's mean and maximum."""

    __tablename__ = "model_rollups"
    __table_args__ = (
        UniqueConstraint("bucket_s", "bucket_start", "model_id"),
        Index(None, "model_id", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    model_id: Mapped[int] = mapped_column(ID, ForeignKey("models.id"))
    bucket_start: Mapped[float]
    bucket_s: Mapped[float]
    sample_count: Mapped[int] = mapped_column(Integer)
    pending_request_count: Mapped[float | None]
    pending_request_count_max: Mapped[float | None]


_add_columns(ModelRollupRow, _rate_columns())
_add_columns(ModelRollupRow, record_columns(ModelPeaks, rename=PEAK_COLUMNS))


class DeviceRollupRow(Base):
    """One bucket of one device: the means of its ``DEVICE_MEAN_READINGS`` (under
    their own names) and the maxima of its ``DEVICE_PEAK_READINGS`` (``<field>_max``)."""

    __tablename__ = "device_rollups"
    __table_args__ = (
        UniqueConstraint("bucket_s", "bucket_start", "target_id", "source", "uuid"),
        Index(None, "target_id", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"))
    source: Mapped[str]
    uuid: Mapped[str]
    kind: Mapped[str]
    bucket_start: Mapped[float]
    bucket_s: Mapped[float]
    sample_count: Mapped[int] = mapped_column(Integer)


# A mean of byte counts is no whole number.
_add_columns(
    DeviceRollupRow,
    record_columns(
        DeviceSample,
        only=DEVICE_MEAN_READINGS,
        types_={"memory_used_bytes": Float()},
        nullable=True,
    ),
)
_add_columns(
    DeviceRollupRow,
    record_columns(
        DeviceSample,
        only=DEVICE_PEAK_READINGS,
        rename={name: f"{name}_max" for name in DEVICE_PEAK_READINGS},
        nullable=True,
    ),
)


class RollupMarkRow(Base):
    """How far raw samples of one kind (``"model"`` or ``"device"``) have been rolled
    up at one bucket size: every raw sample with ``collected_at < rolled_until`` is in
    a rollup. Retention deletes raw samples only below this mark."""

    __tablename__ = "rollup_marks"

    kind: Mapped[str] = mapped_column(primary_key=True)
    bucket_s: Mapped[float] = mapped_column(primary_key=True)
    rolled_until: Mapped[float]


# --------------------------------------------------------------------------- analysis output


class FindingRow(Base):
    __tablename__ = "findings"
    __table_args__ = (Index(None, "target", "created_at"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    kind: Mapped[str]
    severity: Mapped[str]
    # Plain names, not foreign keys: a finding may be about a host or a fleet.
    target: Mapped[str]
    subject: Mapped[str]
    summary: Mapped[str]
    window_start: Mapped[float]
    window_end: Mapped[float]
    evidence: Mapped[dict[str, Any]]
    created_at: Mapped[float]
    resolved_at: Mapped[float | None]


class DetectorStreakRow(Base):
    """Hysteresis state of one (kind, target, subject): see ``rows.DetectorStreak``.
    Kept in the store so a restarted process, or a one-shot CLI run, continues the
    count instead of starting over."""

    __tablename__ = "detector_streaks"
    __table_args__ = (UniqueConstraint("kind", "target", "subject"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    kind: Mapped[str]
    target: Mapped[str]
    subject: Mapped[str]
    holding: Mapped[int] = mapped_column(Integer)
    clearing: Mapped[int] = mapped_column(Integer)
    since: Mapped[float | None]
    evaluated_at: Mapped[float]


class RecommendationRow(Base):
    """A ``Recommendation``, each field stored once (scalars as columns, the nested
    parts as JSON), and what became of it: ``status`` is ``"open"`` until an apply
    records ``"applied"``, ``"kept"``, ``"rolled_back"`` or ``"failed"`` at
    ``applied_at`` with the ``verification`` figures."""

    __tablename__ = "recommendations"

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    status: Mapped[str]
    applied_at: Mapped[float | None]
    verification: Mapped[dict[str, Any] | None]


_add_columns(RecommendationRow, record_columns(Recommendation))
_RECOMMENDATIONS = RecommendationRow.__table__.c
Index(None, _RECOMMENDATIONS.target, _RECOMMENDATIONS.model, _RECOMMENDATIONS.created_at)


# --------------------------------------------------------------------------- host facts


class HostFactsRow(Base):
    """The latest ``HostFacts`` of each target."""

    __tablename__ = "host_facts"

    target_id: Mapped[int] = mapped_column(ID, ForeignKey("targets.id"), primary_key=True)


_add_columns(HostFactsRow, record_columns(HostFacts, skip=("target",)))
