"""Raw samples: one scrape of a Triton target (model samples and their batch stats,
configs, server metrics, Triton's GPU readings), device and process readings; their
reads, oldest first."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVarTuple, cast

from sqlalchemy import ColumnElement, Connection, Integer, Select, Table, func, insert, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from collector.analysis.health import HOST_KIND, TRITON_KIND
from collector.records import (
    DeviceSample,
    ModelConfig,
    ModelRates,
    ModelSample,
    ProcessSample,
    ServerMetrics,
    TritonSnapshot,
)
from collector.store.bulk import BulkInsert, TupleInsert, dialect_json_encoder
from collector.store.engine import Executor
from collector.store.mapping import columns, record_from, record_values
from collector.store.rows import (
    ProcessBucket,
    ScrapeRecord,
    StoredDevice,
    StoredModelConfig,
    StoredProcess,
    StoredServer,
)
from collector.store.sample_rows import (
    MODEL_SAMPLE_LAYOUT,
    MODEL_SAMPLE_LAYOUT_WITHOUT_STATS,
    config_values,
    device_values,
    model_sample_from,
    model_sample_row,
    stored_config,
)
from collector.store.schema import (
    DEVICE_COLUMNS,
    DeviceSampleRow,
    ModelConfigRow,
    ModelRow,
    ModelSampleRow,
    ProcessSampleRow,
    ServerSampleRow,
    TargetRow,
)
from collector.store.targets import TargetsMixin

__all__ = ["SamplesMixin", "by_target_and_time", "join_models"]

_SampleTable = type[ServerSampleRow] | type[DeviceSampleRow] | type[ProcessSampleRow]
_Ts = TypeVarTuple("_Ts")
# The columns that come from ``ProcessSample``'s fields (see ``schema.record_columns``).
_PROCESS = cast(Table, ProcessSampleRow.__table__).c
# The inserts of every scrape skip SQLAlchemy's per-row parameter processing (see
# ``bulk``); a config changes seldom and goes through SQLAlchemy Core, built once.
_INSERT_MODEL_SAMPLES = TupleInsert(cast(Table, ModelSampleRow.__table__), MODEL_SAMPLE_LAYOUT)
_INSERT_MODEL_SAMPLES_WITHOUT_STATS = TupleInsert(
    cast(Table, ModelSampleRow.__table__), MODEL_SAMPLE_LAYOUT_WITHOUT_STATS
)
_INSERT_SERVER = BulkInsert(cast(Table, ServerSampleRow.__table__))
_INSERT_DEVICES = BulkInsert(cast(Table, DeviceSampleRow.__table__))
_INSERT_CONFIG = insert(cast(Table, ModelConfigRow.__table__))


class SamplesMixin(TargetsMixin):
    """``Store`` methods that write and read raw samples."""

    def write_triton(
        self,
        snapshot: TritonSnapshot,
        rates: Mapping[tuple[str, str], ModelRates] | None = None,
    ) -> None:
        """Store one scrape of one Triton target in one transaction.

        One ``model_samples`` row per ``ModelMetrics``, joined with the ``ModelStats``
        of the same (model, version) when there is one, and with ``rates[(model,
        version)]`` when given; its ``batch_stats`` in the sample's row. A statistics
        entry without metrics is not stored (a sample is keyed by its metrics). A
        ``ModelConfig`` is stored only when its ``raw_json`` differs from the latest
        stored for that (target, model). Also the server metrics, Triton's GPU
        readings, and the target's ``server_version`` (when given). Rates for a series
        that is not in the metrics are ignored. The target is created with kind
        ``"triton"`` if it is new.
        """
        # Writes of one target take turns with each other and with its scrape records:
        # the write cache of a target is read and filled by one of them at a time.
        with self._target_lock(snapshot.target):
            try:
                self._write_triton(snapshot, rates or {})
            except BaseException:
                self._drop_cached(snapshot.target)  # found again on the next write
                raise

    def write_scrape(
        self,
        snapshot: TritonSnapshot,
        rates: Mapping[tuple[str, str], ModelRates] | None,
        scrape: ScrapeRecord,
    ) -> None:
        """``write_triton`` and ``record_scrape`` of one scrape of the Triton target
        ``scrape.target`` in one transaction: what a successful scrape writes.

        ``scrape.duration_s`` is the scrape's time before this call; the write's own
        time up to the record is added, so the duration counts the store's write as
        when the two were written one after the other. Nothing is written when this
        raises (the caller records the failed scrape with ``record_scrape``)."""
        if scrape.target != snapshot.target:
            raise ValueError(f"scrape of {scrape.target!r}, snapshot of {snapshot.target!r}")
        with self._target_lock(snapshot.target):
            try:
                self._write_triton(snapshot, rates or {}, scrape)
            except BaseException:
                self._drop_cached(snapshot.target)  # found again on the next write
                raise

    def _write_triton(
        self,
        snapshot: TritonSnapshot,
        rates: Mapping[tuple[str, str], ModelRates],
        scrape: ScrapeRecord | None = None,
    ) -> None:
        started = time.perf_counter()
        at = snapshot.collected_at
        known: list[Callable[[], None]] = []  # what the write cache learns, once committed
        kind = TRITON_KIND if scrape is None else scrape.kind
        with self._write_connection() as connection:
            target_id = self._target_id(connection, snapshot.target, kind, known)
            models_changed = self._write_model_samples(
                connection, target_id, snapshot, rates, known
            )
            if snapshot.server_version is not None:
                # A changed set of models may be a restarted or replaced server.
                self._write_server_version(
                    connection, target_id, snapshot.server_version, known, stale=models_changed
                )
            self._write_configs(connection, target_id, at, snapshot.model_configs, known)
            if snapshot.server is not None:
                values = {"target_id": target_id, "collected_at": at}
                _INSERT_SERVER.execute(connection, [{**values, **record_values(snapshot.server)}])
            if snapshot.gpus:
                _INSERT_DEVICES.execute(
                    connection, [device_values(target_id, at, d) for d in snapshot.gpus]
                )
            if scrape is not None:
                written = replace(
                    scrape, duration_s=scrape.duration_s + time.perf_counter() - started
                )
                sources = self._write_scrape_record(connection, target_id, written)
                known.append(functools.partial(self._source_up.__setitem__, target_id, sources))
        for learn in known:
            learn()

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
                [device_values(target_id, collected_at, d) for d in samples],
            )

    def write_processes(
        self, target: str, collected_at: float, samples: Sequence[ProcessSample]
    ) -> None:
        """Store one tick of process readings of ``target`` (pids are per target: a
        join with another reading keys on both); a new target gets kind ``"host"``."""
        if not samples:
            return
        with self._write() as session:
            target_id = self._ensure_target(session, target, HOST_KIND)
            values = {"target_id": target_id, "collected_at": collected_at}
            session.execute(
                insert(ProcessSampleRow), [{**values, **record_values(p)} for p in samples]
            )

    # ------------------------------------------------------------------ reads

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
        with self._read() as session:
            return [
                model_sample_from(row)
                for row in session.execute(_model_samples_select(*where)).mappings()
            ]

    def newest_model_samples(
        self, *, since: float, until: float, with_statistics: bool = False
    ) -> list[ModelSample]:
        """The newest sample with ``since <= collected_at <= until`` (and statistics, if
        ``with_statistics``) of every (target, model, version) that has one, ordered as
        ``model_samples``: the last of that series' samples ``model_samples`` would
        return. What a status shows of a series beyond its rates, read without the rest
        of its samples."""
        span = (ModelSampleRow.collected_at >= since, ModelSampleRow.collected_at <= until)
        read = (ModelSampleRow.stats_inference_count.is_not(None),) if with_statistics else ()
        newest = (
            select(ModelSampleRow.model_id, func.max(ModelSampleRow.collected_at).label("at"))
            .where(*span, *read)
            .group_by(ModelSampleRow.model_id)
            .subquery()
        )
        stmt = _model_samples_select(*read).join(
            newest,
            (newest.c.model_id == ModelSampleRow.model_id)
            & (newest.c.at == ModelSampleRow.collected_at),
        )
        with self._read() as session:
            rows = [model_sample_from(row) for row in session.execute(stmt).mappings()]
        # Two samples of one series stamped alike: the last one stored, as model_samples.
        last = {(s.target, s.model, s.version): s for s in rows}
        return [s for s in rows if last[(s.target, s.model, s.version)] is s]

    def model_configs(
        self, *, target: str | None = None, model: str | None = None
    ) -> list[StoredModelConfig]:
        """Every stored config (one per change), oldest first."""
        stmt = (
            select(*columns(ModelConfigRow), TargetRow.name.label("target_name"))
            .join(TargetRow, TargetRow.id == ModelConfigRow.target_id)
            .order_by(ModelConfigRow.id)
        )
        if target is not None:
            stmt = stmt.where(TargetRow.name == target)
        if model is not None:
            stmt = stmt.where(ModelConfigRow.model == model)
        with self._read() as session:
            return [stored_config(r) for r in session.execute(stmt).mappings()]

    def latest_model_configs(
        self, target: str | None = None
    ) -> dict[tuple[str, str], StoredModelConfig]:
        """The current config of every model, keyed by (target, model)."""
        latest = select(func.max(ModelConfigRow.id)).group_by(
            ModelConfigRow.target_id, ModelConfigRow.model
        )
        stmt = (
            select(*columns(ModelConfigRow), TargetRow.name.label("target_name"))
            .join(TargetRow, TargetRow.id == ModelConfigRow.target_id)
            .where(ModelConfigRow.id.in_(latest))
        )
        if target is not None:
            stmt = stmt.where(TargetRow.name == target)
        with self._read() as session:
            return {
                (r["target_name"], r["model"]): stored_config(r)
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
        stmt = _labelled(ServerSampleRow, target, since, until)
        with self._read() as session:
            return [
                StoredServer(r["target_name"], r["collected_at"], record_from(ServerMetrics, r))
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
        stmt = _labelled(DeviceSampleRow, target, since, until)
        if source is not None:
            stmt = stmt.where(DeviceSampleRow.source == source)
        with self._read() as session:
            return [
                StoredDevice(
                    r["target_name"],
                    r["collected_at"],
                    record_from(DeviceSample, r, DEVICE_COLUMNS),
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
        stmt = _labelled(ProcessSampleRow, target, since, until)
        if source is not None:
            stmt = stmt.where(_PROCESS.source == source)
        if model is not None:
            stmt = stmt.where(_PROCESS.model == model)
        with self._read() as session:
            return [
                StoredProcess(r["target_name"], r["collected_at"], record_from(ProcessSample, r))
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
            _PROCESS.pid,
            _PROCESS.role,
            _PROCESS.model,
            _PROCESS.instance_name,
        )
        selected = select(
            *keys,
            bucket.label("bucket"),
            func.count().label("sample_count"),
            # A process is read by one source; grouping by it would change nothing.
            func.min(_PROCESS.source).label("source"),
            func.avg(_PROCESS.cpu_pct).label("cpu_pct"),
            func.avg(_PROCESS.sm_util_pct).label("sm_util_pct"),
        )
        stmt = (
            by_target_and_time(selected, ProcessSampleRow, None, since, until)
            .group_by(*keys, bucket)
            .order_by(*keys, bucket)
        )
        with self._read() as session:
            return [
                ProcessBucket(
                    source=r.source,
                    pid=r.pid,
                    role=r.role,
                    model=r.model,
                    instance_name=r.instance_name,
                    cpu_pct=None if r.cpu_pct is None else float(r.cpu_pct),
                    sm_util_pct=None if r.sm_util_pct is None else float(r.sm_util_pct),
                    target=r.name,
                    bucket=int(r.bucket),
                    sample_count=r.sample_count,
                )
                for r in session.execute(stmt)
            ]

    def latest_collected_at(self, target: str | None = None) -> float | None:
        """The newest ``collected_at`` of any raw sample (model, server, device,
        process) of ``target`` or of all targets; ``None`` when there is none."""
        model_stmt = join_models(select(func.max(ModelSampleRow.collected_at)))
        if target is not None:
            model_stmt = model_stmt.where(TargetRow.name == target)
        stmts = [model_stmt] + [
            by_target_and_time(select(func.max(table.collected_at)), table, target, None, None)
            for table in (ServerSampleRow, DeviceSampleRow, ProcessSampleRow)
        ]
        with self._read() as session:
            found = [v for v in (session.scalar(s) for s in stmts) if v is not None]
        return max(found, default=None)

    # ------------------------------------------------------------------ internals

    def _write_model_samples(
        self,
        connection: Connection,
        target_id: int,
        snapshot: TritonSnapshot,
        rates: Mapping[tuple[str, str], ModelRates],
        known: list[Callable[[], None]],
    ) -> bool:
        """Insert the model samples; whether the set of (model, version)s differs from
        the previous write's of this target (or there was none in this process)."""
        keys = [(m.model, m.version) for m in snapshot.model_metrics]
        key_set = frozenset(keys)
        changed = self._model_keys.get(target_id) != key_set
        if changed:
            known.append(functools.partial(self._model_keys.__setitem__, target_id, key_set))
        if not keys:
            return changed
        model_ids = self._model_ids_of(connection, target_id, keys, known)
        stats = {(s.model, s.version): s for s in snapshot.model_stats}
        at = snapshot.collected_at
        encode = dialect_json_encoder(connection.dialect)
        # A scrape that read no statistics leaves their columns out: they are NULL.
        inserted = _INSERT_MODEL_SAMPLES if stats else _INSERT_MODEL_SAMPLES_WITHOUT_STATS
        inserted.execute(
            connection,
            [
                model_sample_row(
                    model_ids[key],
                    at,
                    m,
                    stats.get(key),
                    rates.get(key),
                    encode,
                    stats_columns=bool(stats),
                )
                for key, m in zip(keys, snapshot.model_metrics, strict=True)
            ],
        )
        return changed

    def _model_ids_of(
        self,
        session: Executor,
        target_id: int,
        keys: Sequence[tuple[str, str]],
        known: list[Callable[[], None]],
    ) -> dict[tuple[str, str], int]:
        """Ids of the (model, version)s of a target, from the write cache when all are
        in it (the steady state: no query), else made by ``_ensure_models``."""
        cached = self._model_ids.get(target_id, {})
        if all(key in cached for key in keys):
            return cached
        ids = self._ensure_models(session, target_id, keys)
        known.append(functools.partial(self._model_ids.__setitem__, target_id, ids))
        return ids

    def _ensure_models(
        self, session: Executor, target_id: int, keys: Iterable[tuple[str, str]]
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
        session: Executor,
        target_id: int,
        collected_at: float,
        configs: Sequence[ModelConfig],
        known: list[Callable[[], None]],
    ) -> None:
        """Insert the configs whose ``raw_json`` changed since the latest stored one
        (known from the write cache after the first write of the target)."""
        if not configs:
            return
        current = self._latest_config_json.get(target_id)
        if current is None:
            latest = (
                select(func.max(ModelConfigRow.id))
                .where(ModelConfigRow.target_id == target_id)
                .group_by(ModelConfigRow.model)
            )
            stmt = select(ModelConfigRow.model, ModelConfigRow.raw_json).where(
                ModelConfigRow.id.in_(latest)
            )
            current = {model: raw for model, raw in session.execute(stmt)}
        # The last config of a model in the snapshot wins, as a later read would.
        by_model = {c.model: c for c in configs}
        changed = [c for c in by_model.values() if current.get(c.model) != c.raw_json]
        if changed:
            session.execute(
                _INSERT_CONFIG, [config_values(target_id, collected_at, c) for c in changed]
            )
        if changed or target_id not in self._latest_config_json:
            stored = {**current, **{c.model: c.raw_json for c in changed}}
            known.append(functools.partial(self._latest_config_json.__setitem__, target_id, stored))


# --------------------------------------------------------------------------- queries


def join_models(stmt: Select[*_Ts]) -> Select[*_Ts]:
    return stmt.join(ModelRow, ModelRow.id == ModelSampleRow.model_id).join(
        TargetRow, TargetRow.id == ModelRow.target_id
    )


def _model_samples_select(*where: ColumnElement[bool]) -> Select[Any]:
    """Model samples labelled with their model, version and target, filtered by
    ``where``, oldest first (ties by target, model, version, then as stored)."""
    return (
        join_models(
            select(
                *columns(ModelSampleRow),
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


def by_target_and_time(
    stmt: Select[*_Ts],
    table: _SampleTable,
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


def _labelled(
    table: _SampleTable, target: str | None, since: float | None, until: float | None
) -> Select[Any]:
    """Every column of a sample table and its target's name, oldest first."""
    stmt = select(*columns(table), TargetRow.name.label("target_name"))
    return by_target_and_time(stmt, table, target, since, until).order_by(
        table.collected_at, TargetRow.name, table.id
    )


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
