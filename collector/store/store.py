"""``Store``: the one place batchscope speaks SQL.

Every public method opens its own session and commits (or rolls back) before it
returns, so callers never hold a transaction and never see an ORM object: writes take
records from ``collector.records``, reads return those records wrapped in the rows of
``collector.store.rows``.

SQLite (the default, one embedded file) and PostgreSQL (a fleet) are both first-class;
other SQLAlchemy backends may work but are untested. Database errors other than a bad
URL at start propagate as ``sqlalchemy.exc.SQLAlchemyError``: the scheduler's wrapper
owns failure, and a failed write leaves the store as it was (one transaction per call).
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from typing import Any, TypeVar, TypeVarTuple, cast

from sqlalchemy import (
    Column,
    ColumnElement,
    CursorResult,
    Engine,
    Integer,
    Select,
    Table,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.expression import FunctionElement

from collector.errors import ConfigError
from collector.records import (
    BatchStat,
    DeviceSample,
    Duration,
    ModelConfig,
    ModelMetrics,
    ModelRates,
    ModelSample,
    ModelStats,
    ProcessSample,
    QueuePolicy,
    ServerMetrics,
    TritonSnapshot,
)
from collector.store.rows import (
    DetectorStreak,
    DeviceRollup,
    ModelRollup,
    ProcessBucket,
    RetentionReport,
    StoredDevice,
    StoredFinding,
    StoredModelConfig,
    StoredProcess,
    StoredRecommendation,
    StoredServer,
    TargetState,
    TargetTransition,
)
from collector.store.schema import (
    Base,
    BatchStatRow,
    DetectorStreakRow,
    DeviceRollupRow,
    DeviceSampleRow,
    FindingRow,
    ModelConfigRow,
    ModelRollupRow,
    ModelRow,
    ModelSampleRow,
    ProcessSampleRow,
    RecommendationRow,
    RollupMarkRow,
    ServerSampleRow,
    TargetRow,
    TransitionRow,
)

__all__ = ["HOST_KIND", "PRIMARY_SOURCE", "Store", "TRITON_KIND"]

#: Target kinds: a Triton server, or a host read by host-level sources (NVML, /proc).
TRITON_KIND = "triton"
HOST_KIND = "host"
#: The source whose scrapes decide whether a target of kind ``TRITON_KIND`` is up.
PRIMARY_SOURCE = "triton"

# How long a SQLite writer waits for another writer's lock before failing.
_SQLITE_BUSY_TIMEOUT_MS = 10_000
# Connection execution option that makes a SQLite transaction take the write lock at
# BEGIN (see ``_configure_sqlite``).
_WRITE_OPTION = "batchscope_write"

_R = TypeVar("_R")
_Row = TypeVar("_Row", bound=Base)
_Ts = TypeVarTuple("_Ts")
# A selected row by column name (``RowMapping`` keys are typed wider than ``str``).
_RowValues = Mapping[Any, Any]

# ``ModelStats`` duration fields, each stored as ``stats_<name>_count``/``_ns``.
_STAT_DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
# Record fields whose column has another name (see schema.py for why).
_DEVICE_COLUMNS = {"index": "device_index", "name": "device_name"}
_RATE_COLUMNS = {"window_s": "rate_window_s", "resets": "rate_resets"}
_METRIC_FIELDS = tuple(
    f.name
    for f in fields(ModelMetrics)
    if f.name not in ("model", "version", "summary_quantiles_us", "histogram_buckets")
)


class Store:
    """Typed storage of everything batchscope collects and concludes.

    ``url`` is a SQLAlchemy URL: ``sqlite:///batchscope.db`` (a file, relative to the
    working directory), ``sqlite://`` (in memory, one connection; tests only) or
    ``postgresql+psycopg://user@host/db``. The tables are created if missing. A URL
    that cannot be parsed, names an unknown backend, or cannot be opened raises
    ``ConfigError("db_url", ...)`` (the password is never part of the message).
    """

    def __init__(self, url: str) -> None:
        self._engine = _create_engine(url)
        self.url = self._engine.url.render_as_string(hide_password=True)
        try:
            Base.metadata.create_all(self._engine)
        except DBAPIError as err:
            self._engine.dispose()
            raise ConfigError(
                "db_url", f"cannot open database {self.url}: {err.orig or err}"
            ) from err
        self._dialect = self._engine.dialect.name
        reader = self._engine
        if self._dialect == "postgresql":
            # A read of samples and their batch stats is two queries; READ COMMITTED
            # would let a concurrent write or retention land between them. Read-only
            # transactions never fail under REPEATABLE READ.
            reader = reader.execution_options(isolation_level="REPEATABLE READ")
        self._reader = sessionmaker(reader, expire_on_commit=False)
        self._writer = sessionmaker(
            self._engine.execution_options(**{_WRITE_OPTION: True}), expire_on_commit=False
        )

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every pooled connection. The store must not be used afterwards."""
        self._engine.dispose()

    # ------------------------------------------------------------------ sessions

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One transaction that commits on success and rolls back on any error."""
        with self._writer.begin() as session:
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """One read transaction, so a multi-query read sees one snapshot (SQLite's WAL
        snapshot; REPEATABLE READ on PostgreSQL)."""
        with self._reader() as session:
            yield session

    # ------------------------------------------------------------------ targets

    def record_scrape(
        self,
        target: str,
        source: str,
        *,
        kind: str,
        started_at: float,
        duration_s: float,
        error_kind: str | None,
        error: str | None,
    ) -> TargetState:
        """Record that ``source`` scraped ``target``; it succeeded when ``error_kind``
        is ``None``. Returns the target's state after this scrape.

        Each (target, source) is tracked on its own: a ``TargetTransition`` is written
        for its first scrape and whenever it goes up→down or down→up (not while it
        stays down with another error). Which scrapes decide the *target's* state:

        * a target of kind ``"triton"`` is up when its latest scrape by source
          ``"triton"`` succeeded; other sources on it (host, NVML) do not change it;
        * a target of any other kind (a host) is up when the latest scrape of every
          source that ever scraped it succeeded.

        On a deciding scrape, ``consecutive_failures`` grows by one when it failed and
        returns to 0 (with the last error cleared) once the target is up again.
        ``kind`` overwrites the stored kind.
        """
        ok = error_kind is None
        with self._write() as session:
            target_id = self._ensure_target(session, target, kind)
            row = session.get_one(TargetRow, target_id)
            states = self._source_states(session, [target_id]).get(target_id, {})
            previous = states.get(source)
            if previous is None or previous.up != ok:
                session.add(
                    TransitionRow(
                        target_id=target_id,
                        source=source,
                        at=started_at,
                        up=ok,
                        error_kind=error_kind,
                        error=error,
                    )
                )
            up_by_source = {name: t.up for name, t in states.items()}
            up_by_source[source] = ok

            row.kind = kind
            if kind == TRITON_KIND:
                decides, up = source == PRIMARY_SOURCE, ok
            else:
                decides, up = True, all(up_by_source.values())
            if decides:
                row.last_scrape_at = started_at
                row.last_duration_s = duration_s
                if ok:
                    row.last_seen_at = started_at
                if not ok:
                    row.consecutive_failures += 1
                    row.last_error_kind = error_kind
                    row.last_error = error
                elif up:
                    row.consecutive_failures = 0
                    row.last_error_kind = None
                    row.last_error = None
                row.up = up
            session.flush()
            return _target_state(_orm_values(row), up_by_source)

    def targets(self) -> list[TargetState]:
        """Every known target, by name."""
        with self._read() as session:
            stmt = select(*_columns(TargetRow)).order_by(TargetRow.name)
            rows = session.execute(stmt).mappings().all()
            states = self._source_states(session, [r["id"] for r in rows])
            return [
                _target_state(r, {s: t.up for s, t in states.get(r["id"], {}).items()})
                for r in rows
            ]

    def transitions(
        self, target: str, *, source: str | None = None, since: float | None = None
    ) -> list[TargetTransition]:
        """The up/down history of ``target`` (optionally one source, from ``since``
        inclusive), oldest first."""
        stmt = (
            select(TransitionRow)
            .join(TargetRow, TargetRow.id == TransitionRow.target_id)
            .where(TargetRow.name == target)
            .order_by(TransitionRow.id)
        )
        if source is not None:
            stmt = stmt.where(TransitionRow.source == source)
        if since is not None:
            stmt = stmt.where(TransitionRow.at >= since)
        with self._read() as session:
            return [
                TargetTransition(
                    target=target,
                    source=t.source,
                    at=t.at,
                    up=t.up,
                    error_kind=t.error_kind,
                    error=t.error,
                )
                for t in session.scalars(stmt)
            ]

    # ------------------------------------------------------------------ sample writes

    def write_triton(
        self,
        snapshot: TritonSnapshot,
        rates: Mapping[tuple[str, str], ModelRates] | None = None,
    ) -> None:
        """Store one scrape of one Triton target in one transaction.

        One ``model_samples`` row per ``ModelMetrics``, joined with the ``ModelStats``
        of the same (model, version) when there is one, and with ``rates[(model,
        version)]`` when given; its ``batch_stats`` as rows of their own. A statistics
        entry without metrics is not stored (a sample is keyed by its metrics). A
        ``ModelConfig`` is stored only when its ``raw_json`` differs from the latest
        stored for that (target, model). Also the server metrics, Triton's GPU
        readings, and the target's ``server_version`` (when given). Rates for a series
        that is not in the metrics are ignored. The target is created with kind
        ``"triton"`` if it is new.
        """
        rates = rates or {}
        at = snapshot.collected_at
        with self._write() as session:
            target_id = self._ensure_target(session, snapshot.target, TRITON_KIND)
            if snapshot.server_version is not None:
                session.get_one(TargetRow, target_id).server_version = snapshot.server_version
            keys = [(m.model, m.version) for m in snapshot.model_metrics]
            model_ids = self._ensure_models(session, target_id, keys)
            stats = {(s.model, s.version): s for s in snapshot.model_stats}

            if snapshot.model_metrics:
                sample_ids = session.scalars(
                    insert(ModelSampleRow).returning(
                        ModelSampleRow.id, sort_by_parameter_order=True
                    ),
                    [
                        _model_sample_values(model_ids[key], at, m, stats.get(key), rates.get(key))
                        for key, m in zip(keys, snapshot.model_metrics, strict=True)
                    ],
                ).all()
                batch_rows = [
                    _batch_stat_values(sample_id, b)
                    for sample_id, key in zip(sample_ids, keys, strict=True)
                    if key in stats
                    for b in stats[key].batch_stats
                ]
                if batch_rows:
                    session.execute(insert(BatchStatRow), batch_rows)

            self._write_configs(session, target_id, at, snapshot.model_configs)
            if snapshot.server is not None:
                session.execute(
                    insert(ServerSampleRow),
                    [{"target_id": target_id, "collected_at": at, **asdict(snapshot.server)}],
                )
            if snapshot.gpus:
                session.execute(
                    insert(DeviceSampleRow),
                    [_device_values(target_id, at, d) for d in snapshot.gpus],
                )

    def write_devices(
        self, target: str, collected_at: float, samples: Sequence[DeviceSample]
    ) -> None:
        """Store one tick of device readings (any source); a new target gets kind
        ``"host"``."""
        if not samples:
            return
        with self._write() as session:
            target_id = self._ensure_target(session, target, HOST_KIND)
            session.execute(
                insert(DeviceSampleRow),
                [_device_values(target_id, collected_at, d) for d in samples],
            )

    def write_processes(
        self, target: str, collected_at: float, samples: Sequence[ProcessSample]
    ) -> None:
        """Store one tick of process readings; a new target gets kind ``"host"``."""
        if not samples:
            return
        with self._write() as session:
            target_id = self._ensure_target(session, target, HOST_KIND)
            session.execute(
                insert(ProcessSampleRow),
                [
                    {"target_id": target_id, "collected_at": collected_at, **asdict(p)}
                    for p in samples
                ],
            )

    # ------------------------------------------------------------------ sample reads

    def model_samples(
        self,
        *,
        target: str | None = None,
        model: str | None = None,
        version: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[ModelSample]:
        """Model samples with ``since <= collected_at <= until`` (each bound optional),
        oldest first (ties by target, model, version). ``stats`` is rebuilt with its
        batch stats in stored order when the sample had one, ``rates`` when stored."""
        where = _sample_filters(target, model, version, since, until)
        samples_stmt = (
            _join_models(
                select(
                    *_columns(ModelSampleRow),
                    ModelRow.name.label("model_name"),
                    ModelRow.version.label("model_version"),
                    TargetRow.name.label("target_name"),
                )
            )
            .where(*where)
            .order_by(
                ModelSampleRow.collected_at,
                TargetRow.name,
                ModelRow.name,
                ModelRow.version,
                ModelSampleRow.id,
            )
        )
        # Batch stats come by the same filter, not by an IN list of sample ids, so a
        # long window does not hit the backend's bound-parameter limit.
        batch_stmt = (
            _join_models(
                select(*_columns(BatchStatRow)).join(
                    ModelSampleRow, ModelSampleRow.id == BatchStatRow.model_sample_id
                )
            )
            .where(*where)
            .order_by(BatchStatRow.id)
        )
        with self._read() as session:
            batches: dict[int, list[BatchStat]] = defaultdict(list)
            for b in session.execute(batch_stmt).mappings():
                batches[b["model_sample_id"]].append(_batch_stat_from(b))
            return [
                _model_sample_from(row, batches.get(row["id"], []))
                for row in session.execute(samples_stmt).mappings()
            ]

    def model_configs(
        self, *, target: str | None = None, model: str | None = None
    ) -> list[StoredModelConfig]:
        """Every stored config (one per change), oldest first."""
        stmt = (
            select(*_columns(ModelConfigRow), TargetRow.name.label("target_name"))
            .join(TargetRow, TargetRow.id == ModelConfigRow.target_id)
            .order_by(ModelConfigRow.id)
        )
        if target is not None:
            stmt = stmt.where(TargetRow.name == target)
        if model is not None:
            stmt = stmt.where(ModelConfigRow.model == model)
        with self._read() as session:
            return [_stored_config(r) for r in session.execute(stmt).mappings()]

    def latest_model_configs(
        self, target: str | None = None
    ) -> dict[tuple[str, str], StoredModelConfig]:
        """The current config of every model, keyed by (target, model)."""
        latest = select(func.max(ModelConfigRow.id)).group_by(
            ModelConfigRow.target_id, ModelConfigRow.model
        )
        stmt = (
            select(*_columns(ModelConfigRow), TargetRow.name.label("target_name"))
            .join(TargetRow, TargetRow.id == ModelConfigRow.target_id)
            .where(ModelConfigRow.id.in_(latest))
        )
        if target is not None:
            stmt = stmt.where(TargetRow.name == target)
        with self._read() as session:
            return {
                (r["target_name"], r["model"]): _stored_config(r)
                for r in session.execute(stmt).mappings()
            }

    def server_samples(
        self,
        *,
        target: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[StoredServer]:
        """Server-wide metrics, oldest first (bounds inclusive)."""
        stmt = _by_target_and_time(
            select(*_columns(ServerSampleRow), TargetRow.name.label("target_name")),
            ServerSampleRow,
            target,
            since,
            until,
        ).order_by(ServerSampleRow.collected_at, TargetRow.name, ServerSampleRow.id)
        with self._read() as session:
            return [
                StoredServer(r["target_name"], r["collected_at"], _record_from(ServerMetrics, r))
                for r in session.execute(stmt).mappings()
            ]

    def device_samples(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        target: str | None = None,
        source: str | None = None,
    ) -> list[StoredDevice]:
        """Device readings, oldest first (bounds inclusive), in written order within a
        tick."""
        stmt = _by_target_and_time(
            select(*_columns(DeviceSampleRow), TargetRow.name.label("target_name")),
            DeviceSampleRow,
            target,
            since,
            until,
        ).order_by(DeviceSampleRow.collected_at, TargetRow.name, DeviceSampleRow.id)
        if source is not None:
            stmt = stmt.where(DeviceSampleRow.source == source)
        with self._read() as session:
            return [
                StoredDevice(
                    r["target_name"],
                    r["collected_at"],
                    _record_from(DeviceSample, r, _DEVICE_COLUMNS),
                )
                for r in session.execute(stmt).mappings()
            ]

    def process_samples(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        target: str | None = None,
        source: str | None = None,
        model: str | None = None,
    ) -> list[StoredProcess]:
        """Process readings, oldest first (bounds inclusive)."""
        stmt = _by_target_and_time(
            select(*_columns(ProcessSampleRow), TargetRow.name.label("target_name")),
            ProcessSampleRow,
            target,
            since,
            until,
        ).order_by(ProcessSampleRow.collected_at, TargetRow.name, ProcessSampleRow.id)
        if source is not None:
            stmt = stmt.where(ProcessSampleRow.source == source)
        if model is not None:
            stmt = stmt.where(ProcessSampleRow.model == model)
        with self._read() as session:
            return [
                StoredProcess(r["target_name"], r["collected_at"], _record_from(ProcessSample, r))
                for r in session.execute(stmt).mappings()
            ]

    def process_buckets(
        self, *, since: float, until: float, bucket_s: float
    ) -> list[ProcessBucket]:
        """Process readings in ``[since, until]`` averaged per process and
        ``bucket_s``-long bucket counted from ``since``, aggregated by the database: a
        heatmap of hours of model instances reads one row per cell, not per sample."""
        if not bucket_s > 0 or not math.isfinite(bucket_s):
            raise ValueError(f"bucket_s must be a positive number, got {bucket_s!r}")
        bucket = _floor_non_negative((ProcessSampleRow.collected_at - since) / bucket_s)
        keys = (
            TargetRow.name,
            ProcessSampleRow.pid,
            ProcessSampleRow.role,
            ProcessSampleRow.model,
            ProcessSampleRow.instance_name,
        )
        stmt = (
            _by_target_and_time(
                select(
                    *keys,
                    bucket.label("bucket"),
                    func.count().label("sample_count"),
                    func.avg(ProcessSampleRow.cpu_pct).label("cpu_pct"),
                    func.avg(ProcessSampleRow.sm_util_pct).label("sm_util_pct"),
                ),
                ProcessSampleRow,
                None,
                since,
                until,
            )
            .group_by(*keys, bucket)
            .order_by(*keys, bucket)
        )
        with self._read() as session:
            return [
                ProcessBucket(
                    target=r.name, pid=r.pid, role=r.role, model=r.model,
                    instance_name=r.instance_name, bucket=int(r.bucket),
                    sample_count=r.sample_count,
                    cpu_pct=None if r.cpu_pct is None else float(r.cpu_pct),
                    sm_util_pct=None if r.sm_util_pct is None else float(r.sm_util_pct),
                )
                for r in session.execute(stmt)
            ]

    def latest_collected_at(self, target: str | None = None) -> float | None:
        """The newest ``collected_at`` of any raw sample (model, server, device,
        process) of ``target`` or of all targets; ``None`` when there is none."""
        model_stmt = _join_models(select(func.max(ModelSampleRow.collected_at)))
        if target is not None:
            model_stmt = model_stmt.where(TargetRow.name == target)
        stmts = [model_stmt] + [
            _by_target_and_time(select(func.max(table.collected_at)), table, target, None, None)
            for table in (ServerSampleRow, DeviceSampleRow, ProcessSampleRow)
        ]
        with self._read() as session:
            found = [v for v in (session.scalar(s) for s in stmts) if v is not None]
        return max(found, default=None)

    # ------------------------------------------------------------------ rollups, retention

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
                *_columns(ModelRollupRow),
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
            return [
                _record_from(
                    ModelRollup,
                    r,
                    extra={
                        "target": r["target_name"],
                        "model": r["model_name"],
                        "version": r["model_version"],
                    },
                )
                for r in session.execute(stmt).mappings()
            ]

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
            select(*_columns(DeviceRollupRow), TargetRow.name.label("target_name"))
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
            return [
                _record_from(DeviceRollup, r, extra={"target": r["target_name"]})
                for r in session.execute(stmt).mappings()
            ]

    def apply_retention(
        self, now: float, *, raw_keep_s: float, rollup_keep_s: float
    ) -> RetentionReport:
        """Delete what is too old, in one transaction.

        Raw model and device samples (and the batch stats of deleted model samples)
        go when older than ``raw_keep_s`` *and* already rolled up at some bucket size;
        without any rollup they are kept. Server and process samples, which are not
        rolled up, go when older than ``raw_keep_s``. Rollups go once their bucket
        ended more than ``rollup_keep_s`` ago. Configs, transitions, findings and
        recommendations are kept.
        """
        raw_cut = now - raw_keep_s
        rollup_cut = now - rollup_keep_s
        counts: dict[str, int] = {}
        with self._write() as session:
            model_cut = _min_or_none(raw_cut, self._rolled_until(session, "model"))
            if model_cut is not None:
                old = select(ModelSampleRow.id).where(ModelSampleRow.collected_at < model_cut)
                counts["batch_stats"] = _delete(
                    session, delete(BatchStatRow).where(BatchStatRow.model_sample_id.in_(old))
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
            counts["server_samples"] = _delete(
                session, delete(ServerSampleRow).where(ServerSampleRow.collected_at < raw_cut)
            )
            counts["process_samples"] = _delete(
                session, delete(ProcessSampleRow).where(ProcessSampleRow.collected_at < raw_cut)
            )
            counts["model_rollups"] = _delete(
                session,
                delete(ModelRollupRow).where(
                    ModelRollupRow.bucket_start + ModelRollupRow.bucket_s <= rollup_cut
                ),
            )
            counts["device_rollups"] = _delete(
                session,
                delete(DeviceRollupRow).where(
                    DeviceRollupRow.bucket_start + DeviceRollupRow.bucket_s <= rollup_cut
                ),
            )
        return RetentionReport(**counts)

    # ------------------------------------------------------------------ findings, recommendations

    def add_finding(
        self,
        *,
        kind: str,
        severity: str,
        target: str,
        subject: str,
        summary: str,
        window_start: float,
        window_end: float,
        evidence: Mapping[str, Any] | None = None,
        created_at: float | None = None,
    ) -> int:
        """Store a finding and return its id. ``evidence`` must be JSON-serialisable;
        ``created_at`` defaults to now."""
        row = FindingRow(
            kind=kind,
            severity=severity,
            target=target,
            subject=subject,
            summary=summary,
            window_start=window_start,
            window_end=window_end,
            evidence=dict(evidence or {}),
            created_at=time.time() if created_at is None else created_at,
            resolved_at=None,
        )
        return self._add(row, lambda r: r.id)

    def findings(
        self,
        *,
        target: str | None = None,
        kind: str | None = None,
        since: float | None = None,
    ) -> list[StoredFinding]:
        """Findings created at or after ``since``, oldest first."""
        stmt = select(*_columns(FindingRow)).order_by(FindingRow.created_at, FindingRow.id)
        if target is not None:
            stmt = stmt.where(FindingRow.target == target)
        if kind is not None:
            stmt = stmt.where(FindingRow.kind == kind)
        if since is not None:
            stmt = stmt.where(FindingRow.created_at >= since)
        with self._read() as session:
            return [_record_from(StoredFinding, r) for r in session.execute(stmt).mappings()]

    def active_findings(
        self, *, target: str | None = None, kind: str | None = None
    ) -> list[StoredFinding]:
        """Findings not resolved yet, oldest first."""
        stmt = (
            select(*_columns(FindingRow))
            .where(FindingRow.resolved_at.is_(None))
            .order_by(FindingRow.created_at, FindingRow.id)
        )
        if target is not None:
            stmt = stmt.where(FindingRow.target == target)
        if kind is not None:
            stmt = stmt.where(FindingRow.kind == kind)
        with self._read() as session:
            return [_record_from(StoredFinding, r) for r in session.execute(stmt).mappings()]

    def update_finding(
        self,
        finding_id: int,
        *,
        severity: str,
        summary: str,
        window_end: float,
        evidence: Mapping[str, Any],
    ) -> StoredFinding:
        """Refresh an open finding with a newer evaluation of the same condition and
        return it. ``window_start`` and ``created_at`` stay: the finding reads as "held
        from window_start to window_end". Raises ``KeyError`` when there is no finding
        ``finding_id`` and ``ValueError`` when it is resolved (resolved findings are
        history; a condition that returns opens a new one)."""
        with self._write() as session:
            row = session.get(FindingRow, finding_id)
            if row is None:
                raise KeyError(f"no finding with id {finding_id}")
            if row.resolved_at is not None:
                raise ValueError(f"finding {finding_id} was resolved at {row.resolved_at}")
            row.severity = severity
            row.summary = summary
            row.window_end = float(window_end)
            row.evidence = dict(evidence)
            session.flush()
            return _record_from(StoredFinding, _orm_values(row))

    def resolve_finding(self, finding_id: int, at: float) -> StoredFinding:
        """Mark a finding resolved at ``at`` and return it. Resolving a resolved finding
        keeps its first ``resolved_at``. Raises ``KeyError`` when there is none."""
        with self._write() as session:
            row = session.get(FindingRow, finding_id)
            if row is None:
                raise KeyError(f"no finding with id {finding_id}")
            if row.resolved_at is None:
                row.resolved_at = float(at)
            session.flush()
            return _record_from(StoredFinding, _orm_values(row))

    def detector_streaks(self) -> list[DetectorStreak]:
        """The detectors' hysteresis state, ordered by (kind, target, subject)."""
        stmt = select(*_columns(DetectorStreakRow)).order_by(
            DetectorStreakRow.kind, DetectorStreakRow.target, DetectorStreakRow.subject
        )
        with self._read() as session:
            return [_record_from(DetectorStreak, r) for r in session.execute(stmt).mappings()]

    def replace_detector_streaks(self, streaks: Iterable[DetectorStreak]) -> None:
        """Replace the whole hysteresis state with ``streaks`` in one transaction (one
        evaluation's outcome; the set is small: only subjects with a streak going or an
        open finding). Two streaks with the same (kind, target, subject) are an error."""
        rows = [asdict(s) for s in streaks]
        with self._write() as session:
            _delete(session, delete(DetectorStreakRow))
            if rows:
                session.execute(insert(DetectorStreakRow), rows)

    def add_recommendation(
        self,
        *,
        target: str,
        model: str,
        change: Mapping[str, Any],
        predicted: Mapping[str, Any],
        confidence: float,
        config_fragment: str,
        status: str = "proposed",
        created_at: float | None = None,
    ) -> int:
        """Store a recommendation and return its id. ``change`` and ``predicted`` must
        be JSON-serialisable; ``created_at`` defaults to now."""
        row = RecommendationRow(
            target=target,
            model=model,
            created_at=time.time() if created_at is None else created_at,
            change=dict(change),
            predicted=dict(predicted),
            confidence=confidence,
            config_fragment=config_fragment,
            status=status,
            applied_at=None,
            verification=None,
        )
        return self._add(row, lambda r: r.id)

    def record_recommendation_outcome(
        self,
        recommendation_id: int,
        *,
        status: str,
        applied_at: float,
        verification: Mapping[str, Any],
    ) -> StoredRecommendation:
        """Mark a recommendation applied (``status`` e.g. ``"applied"`` or
        ``"rolled_back"``) with its before/after figures. Raises ``KeyError`` when there
        is no recommendation ``recommendation_id``."""
        with self._write() as session:
            row = session.get(RecommendationRow, recommendation_id)
            if row is None:
                raise KeyError(f"no recommendation with id {recommendation_id}")
            row.status = status
            row.applied_at = float(applied_at)
            row.verification = dict(verification)
            session.flush()
            return _record_from(StoredRecommendation, _orm_values(row))

    def recommendations(
        self,
        *,
        target: str | None = None,
        model: str | None = None,
        status: str | None = None,
    ) -> list[StoredRecommendation]:
        """Recommendations, oldest first."""
        stmt = select(*_columns(RecommendationRow)).order_by(
            RecommendationRow.created_at, RecommendationRow.id
        )
        if target is not None:
            stmt = stmt.where(RecommendationRow.target == target)
        if model is not None:
            stmt = stmt.where(RecommendationRow.model == model)
        if status is not None:
            stmt = stmt.where(RecommendationRow.status == status)
        with self._read() as session:
            return [_record_from(StoredRecommendation, r) for r in session.execute(stmt).mappings()]

    # ------------------------------------------------------------------ internals

    def _add(self, row: _Row, result: Callable[[_Row], _R]) -> _R:
        with self._write() as session:
            session.add(row)
            session.flush()
            return result(row)

    def _insert_ignoring_duplicates(
        self,
        session: Session,
        table: type[Base],
        rows: list[dict[str, Any]],
        unique: Sequence[str],
    ) -> None:
        """Insert ``rows``, skipping those that collide on the ``unique`` columns, so a
        concurrent writer that got there first is not an error."""
        if not rows:
            return
        if self._dialect == "postgresql":
            session.execute(pg_insert(table).on_conflict_do_nothing(index_elements=unique), rows)
        elif self._dialect == "sqlite":
            session.execute(
                sqlite_insert(table).on_conflict_do_nothing(index_elements=unique), rows
            )
        else:  # Portable fallback; races here surface as an IntegrityError.
            columns = [getattr(table, c) for c in unique]
            for row in rows:
                match = [col == row[c] for col, c in zip(columns, unique, strict=True)]
                if session.scalar(select(func.count()).select_from(table).where(*match)) == 0:
                    session.execute(insert(table), [row])

    def _ensure_target(self, session: Session, name: str, kind: str) -> int:
        """The id of target ``name``, created with ``kind`` if new, locked for the
        rest of the transaction on PostgreSQL so writers of one target serialise."""
        stmt = select(TargetRow.id).where(TargetRow.name == name).with_for_update()
        target_id = session.scalar(stmt)
        if target_id is None:
            self._insert_ignoring_duplicates(
                session,
                TargetRow,
                [{"name": name, "kind": kind, "consecutive_failures": 0}],
                ["name"],
            )
            target_id = session.scalar(stmt)
        assert target_id is not None  # inserted just above, or by a concurrent writer
        return target_id

    def _ensure_models(
        self, session: Session, target_id: int, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], int]:
        """Ids of the (model, version)s of a target, creating those that are new."""
        wanted = set(keys)
        if not wanted:
            return {}
        stmt = select(ModelRow.name, ModelRow.version, ModelRow.id).where(
            ModelRow.target_id == target_id
        )
        ids = {(n, v): i for n, v, i in session.execute(stmt)}
        missing = sorted(wanted - ids.keys())
        if missing:
            self._insert_ignoring_duplicates(
                session,
                ModelRow,
                [{"target_id": target_id, "name": n, "version": v} for n, v in missing],
                ["target_id", "name", "version"],
            )
            ids = {(n, v): i for n, v, i in session.execute(stmt)}
        return ids

    def _write_configs(
        self,
        session: Session,
        target_id: int,
        collected_at: float,
        configs: Sequence[ModelConfig],
    ) -> None:
        """Insert the configs whose ``raw_json`` changed since the latest stored one."""
        if not configs:
            return
        latest = (
            select(func.max(ModelConfigRow.id))
            .where(ModelConfigRow.target_id == target_id)
            .group_by(ModelConfigRow.model)
        )
        current = {
            model: raw
            for model, raw in session.execute(
                select(ModelConfigRow.model, ModelConfigRow.raw_json).where(
                    ModelConfigRow.id.in_(latest)
                )
            )
        }
        # The last config of a model in the snapshot wins, as a later read would.
        by_model = {c.model: c for c in configs}
        changed = [
            _config_values(target_id, collected_at, c)
            for c in by_model.values()
            if current.get(c.model) != c.raw_json
        ]
        if changed:
            session.execute(insert(ModelConfigRow), changed)

    def _source_states(
        self, session: Session, target_ids: Sequence[int]
    ) -> dict[int, dict[str, TransitionRow]]:
        """The latest transition of every (target, source), i.e. its current state."""
        if not target_ids:
            return {}
        latest = (
            select(func.max(TransitionRow.id))
            .where(TransitionRow.target_id.in_(target_ids))
            .group_by(TransitionRow.target_id, TransitionRow.source)
        )
        states: dict[int, dict[str, TransitionRow]] = defaultdict(dict)
        for t in session.scalars(select(TransitionRow).where(TransitionRow.id.in_(latest))):
            states[t.target_id][t.source] = t
        return states

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
        stmt = select(
            ModelSampleRow.model_id,
            ModelSampleRow.collected_at,
            ModelSampleRow.pending_request_count,
            ModelSampleRow.rate_window_s,
            *(getattr(ModelSampleRow, f) for f in _ROLLED_RATES),
        ).where(ModelSampleRow.collected_at < cutoff)
        if since is not None:
            stmt = stmt.where(ModelSampleRow.collected_at >= since)
        groups: dict[tuple[int, float], list[Any]] = defaultdict(list)
        for r in session.execute(stmt):
            groups[(r.model_id, _bucket_start(r.collected_at, bucket_s))].append(r)
        rows = [
            _model_rollup_values(model_id, start, bucket_s, samples)
            for (model_id, start), samples in sorted(groups.items())
        ]
        self._insert_ignoring_duplicates(
            session, ModelRollupRow, rows, ["bucket_s", "bucket_start", "model_id"]
        )
        return len(rows)

    def _rollup_devices(self, session: Session, cutoff: float, bucket_s: float) -> int:
        since, todo = self._advance_mark(session, "device", bucket_s, cutoff)
        if not todo:
            return 0
        stmt = (
            select(
                DeviceSampleRow.target_id,
                DeviceSampleRow.source,
                DeviceSampleRow.uuid,
                DeviceSampleRow.kind,
                DeviceSampleRow.collected_at,
                *(getattr(DeviceSampleRow, f) for f in _ROLLED_DEVICE_READINGS),
            )
            .where(DeviceSampleRow.collected_at < cutoff)
            .order_by(DeviceSampleRow.id)
        )
        if since is not None:
            stmt = stmt.where(DeviceSampleRow.collected_at >= since)
        groups: dict[tuple[int, str, str, float], list[Any]] = defaultdict(list)
        for r in session.execute(stmt):
            key = (r.target_id, r.source, r.uuid, _bucket_start(r.collected_at, bucket_s))
            groups[key].append(r)
        rows = [
            _device_rollup_values(target_id, source, uuid, start, bucket_s, samples)
            for (target_id, source, uuid, start), samples in sorted(groups.items())
        ]
        self._insert_ignoring_duplicates(
            session,
            DeviceRollupRow,
            rows,
            ["bucket_s", "bucket_start", "target_id", "source", "uuid"],
        )
        return len(rows)


# --------------------------------------------------------------------------- engine


def _create_engine(url: str) -> Engine:
    """An engine for ``url``, or ``ConfigError("db_url", ...)``."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        # The message would repeat the URL, password included.
        raise ConfigError(
            "db_url",
            "not a database URL (expected e.g. sqlite:///batchscope.db or "
            "postgresql+psycopg://user@host/db)",
        ) from None
    shown = parsed.render_as_string(hide_password=True)
    try:
        if parsed.get_backend_name() == "sqlite":
            return _create_sqlite_engine(parsed)
        # pre_ping: a fleet database restarts or drops idle connections.
        return create_engine(parsed, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError, ImportError) as err:
        raise ConfigError("db_url", f"unsupported database URL {shown}: {err}") from None


def _create_sqlite_engine(url: URL) -> Engine:
    in_memory = url.database in (None, "", ":memory:")
    if in_memory:
        # One shared connection, or each thread would see its own empty database.
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        engine = create_engine(url)
    _configure_sqlite(engine, wal=not in_memory)
    return engine


def _configure_sqlite(engine: Engine, *, wal: bool) -> None:
    """WAL lets the dashboard read while the collector writes; the busy timeout makes
    a second writer wait instead of failing; foreign keys are off by default in SQLite.

    The sqlite3 driver's own transaction handling is replaced by explicit BEGINs:
    it would start a transaction only at the first INSERT/UPDATE, so a read-then-write
    (``record_scrape``) would not be atomic. Write sessions begin ``IMMEDIATE`` to take
    the write lock up front; a deferred transaction that read first and then tries to
    write fails with "database is locked" instead of waiting.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if wal:
            cursor.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable across application crashes in WAL mode, and much faster.
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


# --------------------------------------------------------------------------- queries


def _join_models(stmt: Select[*_Ts]) -> Select[*_Ts]:
    return stmt.join(ModelRow, ModelRow.id == ModelSampleRow.model_id).join(
        TargetRow, TargetRow.id == ModelRow.target_id
    )


def _sample_filters(
    target: str | None,
    model: str | None,
    version: str | None,
    since: float | None,
    until: float | None,
) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if target is not None:
        where.append(TargetRow.name == target)
    if model is not None:
        where.append(ModelRow.name == model)
    if version is not None:
        where.append(ModelRow.version == version)
    if since is not None:
        where.append(ModelSampleRow.collected_at >= since)
    if until is not None:
        where.append(ModelSampleRow.collected_at <= until)
    return where


class _floor_non_negative(FunctionElement[int]):
    """``floor(x)`` for ``x >= 0``: SQLite has no FLOOR without its math extension,
    and its CAST truncates, which is the floor there; PostgreSQL's CAST rounds."""

    type = Integer()
    inherit_cache = True


@compiles(_floor_non_negative)
def _floor_default(element: _floor_non_negative, compiler: Any, **kw: Any) -> str:
    return f"FLOOR({compiler.process(element.clauses, **kw)})"


@compiles(_floor_non_negative, "sqlite")
def _floor_sqlite(element: _floor_non_negative, compiler: Any, **kw: Any) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS INTEGER)"


def _by_target_and_time(
    stmt: Select[*_Ts],
    table: type[ServerSampleRow] | type[DeviceSampleRow] | type[ProcessSampleRow],
    target: str | None,
    since: float | None,
    until: float | None,
) -> Select[*_Ts]:
    stmt = stmt.join(TargetRow, TargetRow.id == table.target_id)
    if target is not None:
        stmt = stmt.where(TargetRow.name == target)
    if since is not None:
        stmt = stmt.where(table.collected_at >= since)
    if until is not None:
        stmt = stmt.where(table.collected_at <= until)
    return stmt


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


def _columns(table: type[Base]) -> list[Column[Any]]:
    """Every column of ``table``, to select plain rows: building ORM objects first
    would triple the cost of reading a window of samples."""
    return list(cast(Table, table.__table__).columns)


def _delete(session: Session, stmt: Any) -> int:
    """Run a bulk DELETE and return how many rows it removed. The session holds no
    objects of these tables, so there is nothing to synchronise."""
    result = session.execute(stmt.execution_options(synchronize_session=False))
    return cast(CursorResult[Any], result).rowcount


def _min_or_none(a: float, b: float | None) -> float | None:
    return None if b is None else min(a, b)


# --------------------------------------------------------------------------- record ↔ row


def _record_from(
    cls: type[_R],
    row: _RowValues,
    rename: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> _R:
    """Build dataclass ``cls`` from the values in ``row`` under its field names (or
    the column names in ``rename``), taking ``extra`` fields as given."""
    rename = rename or {}
    extra = extra or {}
    values = {
        name: extra[name] if name in extra else row[rename.get(name, name)]
        for name in _field_names(cast(type, cls))
    }
    return cls(**values)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    # dataclasses.fields() is slow enough to show when reading thousands of rows.
    return tuple(f.name for f in fields(cls))


def _orm_values(obj: Base) -> dict[str, Any]:
    """An ORM object's column values, read like a selected row."""
    return {c.key: getattr(obj, c.key) for c in _columns(type(obj))}


def _target_state(row: _RowValues, sources: dict[str, bool]) -> TargetState:
    return _record_from(TargetState, row, extra={"sources": dict(sorted(sources.items()))})


def _device_values(target_id: int, at: float, d: DeviceSample) -> dict[str, Any]:
    values = {_DEVICE_COLUMNS.get(k, k): v for k, v in asdict(d).items()}
    return {"target_id": target_id, "collected_at": at, **values}


def _model_sample_values(
    model_id: int,
    at: float,
    m: ModelMetrics,
    stats: ModelStats | None,
    rates: ModelRates | None,
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
        duration: Duration | None = getattr(stats, name) if stats else None
        values[f"stats_{name}_count"] = duration.count if duration else None
        values[f"stats_{name}_ns"] = duration.ns if duration else None
    for f in fields(ModelRates):
        value = getattr(rates, f.name) if rates else None
        if f.name == "fail_per_s_by_reason" and value is not None:
            value = dict(value)
        values[_RATE_COLUMNS.get(f.name, f.name)] = value
    return values


def _model_sample_from(row: _RowValues, batches: list[BatchStat]) -> ModelSample:
    """A sample from a ``model_samples`` row labelled with its model, version and target
    (see ``Store.model_samples``)."""
    model, version = row["model_name"], row["model_version"]
    metrics = ModelMetrics(
        model=model,
        version=version,
        **{name: row[name] for name in _METRIC_FIELDS},
        summary_quantiles_us={
            family: {float(q): v for q, v in quantiles.items()}
            for family, quantiles in row["summary_quantiles_us"].items()
        },
        histogram_buckets={
            family: {float(le): count for le, count in buckets.items()}
            for family, buckets in (row["histogram_buckets"] or {}).items()
        },
    )
    stats = None
    if row["stats_inference_count"] is not None:
        stats = ModelStats(
            model=model,
            version=version,
            last_inference_ms=row["stats_last_inference_ms"] or 0,
            inference_count=row["stats_inference_count"],
            execution_count=row["stats_execution_count"] or 0,
            **{
                name: Duration(row[f"stats_{name}_count"] or 0, row[f"stats_{name}_ns"] or 0)
                for name in _STAT_DURATIONS
            },
            batch_stats=tuple(batches),
        )
    rates = None
    if row["rate_window_s"] is not None:
        rates = _record_from(ModelRates, row, _RATE_COLUMNS)
    return ModelSample(
        target=row["target_name"],
        collected_at=row["collected_at"],
        metrics=metrics,
        stats=stats,
        rates=rates,
    )


def _batch_stat_values(model_sample_id: int, b: BatchStat) -> dict[str, Any]:
    return {
        "model_sample_id": model_sample_id,
        "batch_size": b.batch_size,
        "exec_count": b.compute_infer.count,
        "compute_input_count": b.compute_input.count,
        "compute_input_ns": b.compute_input.ns,
        "compute_infer_ns": b.compute_infer.ns,
        "compute_output_count": b.compute_output.count,
        "compute_output_ns": b.compute_output.ns,
    }


def _batch_stat_from(row: _RowValues) -> BatchStat:
    return BatchStat(
        row["batch_size"],
        Duration(row["compute_input_count"], row["compute_input_ns"]),
        Duration(row["exec_count"], row["compute_infer_ns"]),
        Duration(row["compute_output_count"], row["compute_output_ns"]),
    )


def _config_values(target_id: int, at: float, c: ModelConfig) -> dict[str, Any]:
    values = asdict(c)
    values["preferred_batch_sizes"] = list(c.preferred_batch_sizes)
    return {"target_id": target_id, "collected_at": at, **values}


def _stored_config(row: _RowValues) -> StoredModelConfig:
    """A config from a ``model_configs`` row labelled with its target's name."""
    policy = row["default_queue_policy"]
    config = _record_from(
        ModelConfig,
        row,
        extra={
            "preferred_batch_sizes": tuple(row["preferred_batch_sizes"]),
            "default_queue_policy": QueuePolicy(**policy) if policy is not None else None,
        },
    )
    return StoredModelConfig(row["target_name"], row["collected_at"], config)


# --------------------------------------------------------------------------- rollup arithmetic

# Rates averaged into model rollups (all ``ModelRates`` fields but the bookkeeping ones).
_ROLLED_RATES = (
    "requests_per_s",
    "inferences_per_s",
    "executions_per_s",
    "fail_per_s",
    "avg_batch_size",
    "queue_us_per_request",
    "compute_input_us_per_request",
    "compute_infer_us_per_request",
    "compute_output_us_per_request",
    "request_us_per_request",
    "queue_share",
    "busy_share",
)
_MAXED_RATES = (
    "requests_per_s",
    "avg_batch_size",
    "queue_us_per_request",
    "request_us_per_request",
    "queue_share",
    "busy_share",
)
_ROLLED_DEVICE_READINGS = (
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "memory_used_bytes",
    "power_w",
)
_MAXED_DEVICE_READINGS = ("utilization_gpu_pct", "sm_active_pct", "memory_used_bytes", "power_w")


def _bucket_start(at: float, bucket_s: float) -> float:
    return math.floor(at / bucket_s) * bucket_s


def _weighted_mean(rows: Sequence[Any], name: str, weight: Callable[[Any], float]) -> float | None:
    """Mean of the non-null ``name`` over ``rows`` weighted by ``weight``; the plain
    mean when every weight is 0 (e.g. no requests in any window)."""
    pairs = [(getattr(r, name), weight(r)) for r in rows if getattr(r, name) is not None]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total > 0:
        return sum(v * w for v, w in pairs) / total
    return sum(v for v, _ in pairs) / len(pairs)


def _max(rows: Sequence[Any], name: str) -> Any:
    return max((getattr(r, name) for r in rows if getattr(r, name) is not None), default=None)


def _model_rollup_values(
    model_id: int, bucket_start: float, bucket_s: float, samples: Sequence[Any]
) -> dict[str, Any]:
    """Weights make each average the bucket-wide quantity: a per-second rate weighted
    by window length is total events over total time; per-request durations are
    weighted by requests, batch size by executions, queue share by request time."""
    rated = [s for s in samples if s.rate_window_s is not None]

    def window(s: Any) -> float:
        return float(s.rate_window_s)

    def requests(s: Any) -> float:
        return float((s.requests_per_s or 0.0) * s.rate_window_s)

    def executions(s: Any) -> float:
        return float((s.executions_per_s or 0.0) * s.rate_window_s)

    def request_time(s: Any) -> float:
        return requests(s) * (s.request_us_per_request or 0.0)

    weights: dict[str, Callable[[Any], float]] = {
        "avg_batch_size": executions,
        "queue_us_per_request": requests,
        "compute_input_us_per_request": requests,
        "compute_infer_us_per_request": requests,
        "compute_output_us_per_request": requests,
        "request_us_per_request": requests,
        "queue_share": request_time,
    }
    values: dict[str, Any] = {
        "model_id": model_id,
        "bucket_start": bucket_start,
        "bucket_s": bucket_s,
        "sample_count": len(samples),
        "rated_count": len(rated),
        "rated_s": sum(window(s) for s in rated),
        "pending_request_count": _weighted_mean(samples, "pending_request_count", lambda _: 1.0),
        "pending_request_count_max": _max(samples, "pending_request_count"),
    }
    for name in _ROLLED_RATES:
        values[name] = _weighted_mean(rated, name, weights.get(name, window))
    for name in _MAXED_RATES:
        values[f"{name}_max"] = _max(rated, name)
    return values


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
    for name in _ROLLED_DEVICE_READINGS:
        values[name] = _weighted_mean(samples, name, lambda _: 1.0)
    for name in _MAXED_DEVICE_READINGS:
        values[f"{name}_max"] = _max(samples, name)
    return values
