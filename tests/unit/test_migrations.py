"""Alembic migrations: a database made by the schema as it was before migrations
(the DDL ``create_all`` issued then, ``collector/store/migrations/baseline.sql``) is
upgraded in place when a store opens it, and its data reads back intact through the
Store API; a migrated database and a new one both match the models exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, MetaData, create_engine, inspect, text
from sqlalchemy.pool import NullPool

from collector.records import (
    BatcherConfig,
    BatchStat,
    ConfigChange,
    Duration,
    ModelPeaks,
    Prediction,
    Recommendation,
)
from collector.store import DetectorStreak, Store
from collector.store.migrate import BASELINE_REVISION, alembic_config, baseline_statements
from collector.store.schema import Base
from tests.unit.test_store import QUEUE_FINDING, full_rates

T0 = 1_700_000_040.0


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def old_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database (SQLite, or the test PostgreSQL) made by the schema on main before
    migrations, with rows of every kind in the shapes of the time."""
    on_sqlite = request.param == "sqlite"
    db_url = f"sqlite:///{tmp_path / 'old.db'}" if on_sqlite else request.getfixturevalue("pg_url")
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:
        for statement in baseline_statements(engine.dialect.name):
            conn.exec_driver_sql(statement)
        _insert_old_rows(conn)
    engine.dispose()
    yield db_url


def _insert(conn: Connection, table: str, **values: Any) -> None:
    encoded = {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in values.items()}
    names = ", ".join(encoded)
    params = ", ".join(f":{k}" for k in encoded)
    conn.execute(text(f"INSERT INTO {table} ({names}) VALUES ({params})"), encoded)


# --------------------------------------------------------------------------- the old rows

RATES = full_rates()  # every rate set, as in the store's own tests
METRICS = {
    "request_success": 100.0,
    "request_failure_by_reason": {"REJECTED": 2.0},
    "inference_count": 400.0,
    "exec_count": 50.0,
    "request_duration_us": 123_456.5,
    "queue_duration_us": 23_456.25,
    "compute_input_duration_us": 1_000.0,
    "compute_infer_duration_us": 90_000.0,
    "compute_output_duration_us": 2_000.0,
    "pending_request_count": 3.0,
    "summary_quantiles_us": {"nv_inference_queue_summary_us": {"0.5": 10.0}},
    "histogram_buckets": None,
}
STATS = {
    "stats_last_inference_ms": 1_700_000_039_123,
    "stats_inference_count": 400,
    "stats_execution_count": 50,
    "stats_success_count": 100,
    "stats_success_ns": 123_456_789_012,
    "stats_fail_count": 3,
    "stats_fail_ns": 4_000,
    "stats_queue_count": 100,
    "stats_queue_ns": 23_456_000_000,
    "stats_compute_input_count": 50,
    "stats_compute_input_ns": 1_000_000,
    "stats_compute_infer_count": 50,
    "stats_compute_infer_ns": 90_000_000_000,
    "stats_compute_output_count": 50,
    "stats_compute_output_ns": 2_000_000,
    "stats_cache_hit_count": 0,
    "stats_cache_hit_ns": 0,
    "stats_cache_miss_count": 0,
    "stats_cache_miss_ns": 0,
}
PEAKS = ModelPeaks(
    requests_per_s=50.0,
    avg_batch_size=8.0,
    queue_us_per_request=300.0,
    request_us_per_request=1500.0,
    queue_share=0.25,
    busy_share=0.6,
)


def recommendation(kind: str, model: str = "resnet", at: float = T0) -> Recommendation:
    current = BatcherConfig(max_batch_size=32, preferred_batch_sizes=(8,))
    proposed = replace(current, dynamic_batching=True, max_queue_delay_us=500)
    return Recommendation(
        target="triton-a",
        model=model,
        created_at=at,
        kind=kind,
        changes=(
            ConfigChange("dynamic_batching", False, True),
            ConfigChange("max_queue_delay_us", 0, 500),
        ),
        current_config=current,
        proposed_config=proposed,
        current=Prediction(qps=100.0, p95_ms=30.0, p50_ms=12.0),
        predicted=Prediction(qps=250.0, p95_ms=27.0, avg_batch_size=6.0, busy_share=0.5),
        confidence=0.7,
        reason=f"a {kind}",
        slo_p95_ms=40.0,
        config_pbtxt="dynamic_batching { max_queue_delay_microseconds: 500 }",
        config_json='{"name": "resnet"}',
        evidence={"points": 3, "r2": 0.9, "probe": False},
    )


def _old_recommendation(conn: Connection, rec: Recommendation, status: str, **outcome: Any) -> None:
    """As ``store_recommendation`` wrote one: the whole recommendation in ``change``,
    its kind in ``status`` until an apply overwrote it with the outcome."""
    _insert(
        conn,
        "recommendations",
        target=rec.target,
        model=rec.model,
        created_at=rec.created_at,
        change=asdict(rec),
        predicted={"qps": rec.predicted.qps, "p95_ms": rec.predicted.p95_ms},
        confidence=rec.confidence,
        config_fragment=rec.config_pbtxt,
        status=status,
        **outcome,
    )


def _insert_old_rows(conn: Connection) -> None:
    _insert(
        conn,
        "targets",
        id=1,
        name="triton-a",
        kind="triton",
        up=True,
        last_seen_at=T0 + 10,
        last_scrape_at=T0 + 10,
        last_duration_s=0.05,
        consecutive_failures=0,
        server_version="2.52.0",
    )
    _insert(conn, "target_transitions", id=1, target_id=1, source="triton", at=T0, up=True)
    _insert(conn, "models", id=1, target_id=1, name="resnet", version="1")
    rate_columns = {
        ("rate_window_s" if k == "window_s" else "rate_resets" if k == "resets" else k): v
        for k, v in asdict(RATES).items()
    }
    _insert(conn, "model_samples", id=1, model_id=1, collected_at=T0, **METRICS, **STATS)
    _insert(
        conn,
        "model_samples",
        id=2,
        model_id=1,
        collected_at=T0 + 5,
        **METRICS,
        **STATS,
        **rate_columns,
    )
    _insert(
        conn,
        "batch_stats",
        id=1,
        model_sample_id=2,
        batch_size=8,
        exec_count=40,
        compute_input_count=40,
        compute_input_ns=800_000,
        compute_infer_ns=80_000_000_000,
        compute_output_count=40,
        compute_output_ns=1_600_000,
    )
    _insert(
        conn,
        "model_configs",
        id=1,
        target_id=1,
        model="resnet",
        collected_at=T0,
        max_batch_size=32,
        dynamic_batching=False,
        preferred_batch_sizes=[8],
        max_queue_delay_us=0,
        priority_levels=0,
        default_queue_policy=None,
        instance_count=1,
        instance_kind="KIND_GPU",
        backend="onnxruntime",
        platform=None,
        raw_json='{"name": "resnet"}',
    )
    rated = {
        name: getattr(RATES, name)
        for name in (
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
    }
    peaks = {f"{k}_max": v for k, v in asdict(PEAKS).items()}
    _insert(
        conn,
        "model_rollups",
        id=1,
        model_id=1,
        bucket_start=T0 - 60,
        bucket_s=60.0,
        sample_count=6,
        rated_count=5,
        rated_s=28.0,
        pending_request_count=3.0,
        pending_request_count_max=4.0,
        **rated,
        **peaks,
    )
    _insert(
        conn,
        "model_rollups",
        id=2,
        model_id=1,
        bucket_start=T0 - 120,
        bucket_s=60.0,
        sample_count=1,
        rated_count=0,
        rated_s=0.0,
    )
    _insert(conn, "rollup_marks", kind="model", bucket_s=60.0, rolled_until=T0)
    # Findings and streaks were stored with their records' fields as columns.
    _insert(conn, "findings", id=1, created_at=T0 + 60, **asdict(QUEUE_FINDING))
    streak = DetectorStreak("queue_saturation", "triton-a", "resnet", 2, 0, T0, T0 + 60)
    _insert(conn, "detector_streaks", id=1, **asdict(streak))
    _old_recommendation(conn, recommendation("tune"), "tune")
    _old_recommendation(
        conn,
        recommendation("probe", at=T0 + 1),
        "applied",
        applied_at=T0 + 30,
        verification={"verdict": "kept"},
    )
    _old_recommendation(
        conn,
        recommendation("tune", at=T0 + 2),
        "rolled_back",
        applied_at=T0 + 40,
        verification={"verdict": "p95 grew"},
    )
    # Written by hand: ``change`` never held a whole recommendation.
    _insert(
        conn,
        "recommendations",
        target="triton-a",
        model="mlp",
        created_at=T0 + 3,
        change={"reason": "hand-written"},
        predicted={"qps": 120.0, "p95_ms": 12.0},
        confidence=0.5,
        config_fragment="max_batch_size: 32\n",
        status="proposed",
    )
    if conn.dialect.name == "postgresql":
        # Rows above name their ids; a store would have drawn them from the sequences.
        for table in (
            "targets",
            "target_transitions",
            "models",
            "model_samples",
            "batch_stats",
            "model_configs",
            "model_rollups",
            "findings",
            "detector_streaks",
        ):
            conn.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"(SELECT max(id) FROM {table}))"
                )
            )


# --------------------------------------------------------------------------- tests


def test_an_old_database_is_upgraded_and_reads_back_intact(old_db: str) -> None:
    with Store(old_db) as store:
        [target] = store.targets()
        assert (target.name, target.kind, target.up, target.server_version) == (
            "triton-a",
            "triton",
            True,
            "2.52.0",
        )
        assert target.sources == {"triton": True}
        first, second = store.model_samples()
        assert (first.rates, second.rates) == (None, RATES)
        assert second.metrics.request_failure_by_reason == {"REJECTED": 2.0}
        assert second.metrics.summary_quantiles_us == {"nv_inference_queue_summary_us": {0.5: 10.0}}
        assert second.stats is not None and second.stats.success == Duration(100, 123_456_789_012)
        assert second.stats.batch_stats == (
            BatchStat(
                8, Duration(40, 800_000), Duration(40, 80_000_000_000), Duration(40, 1_600_000)
            ),
        )
        assert store.latest_model_configs()[("triton-a", "resnet")].config.raw_json == (
            '{"name": "resnet"}'
        )

        unrated, rated = store.model_rollups()
        assert (unrated.sample_count, unrated.rates, unrated.peaks) == (1, None, None)
        # The rollup's averages are its rates now; the window is what rated_s was.
        assert rated.rates == replace(
            RATES, window_s=28.0, resets=0, fail_per_s_by_reason={"OTHER": 0.4}
        )
        assert rated.peaks == PEAKS
        assert (rated.pending_request_count, rated.pending_request_count_max) == (3.0, 4.0)

        [finding] = store.active_findings()
        assert (finding.kind, finding.evidence) == ("queue_saturation", {"queue_share": 0.6})
        assert [s.holding for s in store.detector_streaks()] == [2]

        tune, probe, rolled_back, by_hand = store.recommendations()
        assert (tune.recommendation, tune.kind, tune.status) == (
            recommendation("tune"),
            "tune",
            "open",
        )
        assert (probe.recommendation, probe.kind, probe.status, probe.applied_at) == (
            recommendation("probe", at=T0 + 1),
            "probe",
            "kept",
            T0 + 30,
        )
        assert probe.verification == {"verdict": "kept"}
        assert (rolled_back.kind, rolled_back.status, rolled_back.verification) == (
            "tune",
            "rolled_back",
            {"verdict": "p95 grew"},
        )
        assert (by_hand.kind, by_hand.status, by_hand.model) == ("tune", "open", "mlp")
        kept = by_hand.recommendation
        assert (
            kept.reason,
            kept.predicted.qps,
            kept.predicted.p95_ms,
            kept.config_pbtxt,
            kept.changes,
        ) == ("hand-written", 120.0, 12.0, "max_batch_size: 32\n", ())

        # The upgraded database takes new writes, ids and rollup marks continuing.
        rid = store.add_recommendation(recommendation("no_change", at=T0 + 4))
        assert rid > by_hand.id
        assert store.rollup(T0 + 65, bucket_s=60.0) == 1
        assert store.recommendations(kind="no_change")[0].status == "open"


def _diffs(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


def test_the_upgraded_database_matches_the_models(old_db: str) -> None:
    with Store(old_db) as store:
        store.open()
    engine = create_engine(old_db, poolclass=NullPool)
    with engine.connect() as conn:
        assert _diffs(conn) == []
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    engine.dispose()
    assert version != BASELINE_REVISION


def test_a_new_database_matches_the_models_and_reopens(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    with Store(url) as store:
        store.open()
    with Store(url) as again:  # already at head: nothing to do, no error
        assert again.targets() == []
    engine = create_engine(url, poolclass=NullPool)
    with engine.connect() as conn:
        assert _diffs(conn) == []
        assert "alembic_version" in inspect(conn).get_table_names()
    engine.dispose()


def test_the_first_revision_is_the_schema_before_migrations(tmp_path: Path) -> None:
    """Revision 0001, run through Alembic, makes exactly what the DDL of create_all
    before migrations made, so stamping an old database with it is true."""
    fixture = create_engine(f"sqlite:///{tmp_path / 'fixture.db'}", poolclass=NullPool)
    with fixture.begin() as conn:
        for statement in baseline_statements("sqlite"):
            conn.exec_driver_sql(statement)
    made = MetaData()
    made.reflect(fixture)
    revision = create_engine(f"sqlite:///{tmp_path / 'revision.db'}", poolclass=NullPool)
    with revision.begin() as conn:
        command.upgrade(alembic_config(conn), BASELINE_REVISION)
    with revision.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diffs = [
            d
            for d in compare_metadata(context, made)
            if not (d[0] == "remove_table" and d[1].name == "alembic_version")
        ]
    assert diffs == []
    fixture.dispose()
    revision.dispose()


# --------------------------------------------------------------------------- 0008


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_0007(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database at revision 0007 (batch stats in a table of their own) holding a
    sample without statistics, one with statistics but no batch stats, and two with
    batch stats in an order that is not by id or by batch size."""
    on_sqlite = request.param == "sqlite"
    db_url = f"sqlite:///{tmp_path / 'r7.db'}" if on_sqlite else request.getfixturevalue("pg_url")
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0007")
        _insert(conn, "targets", id=1, name="triton-a", kind="triton", consecutive_failures=0)
        _insert(conn, "models", id=1, target_id=1, name="resnet", version="1")
        without_stats = {k: None for k in STATS}
        _insert(
            conn, "model_samples", id=1, model_id=1, collected_at=T0, **METRICS, **without_stats
        )
        for sample_id in (2, 3, 4):
            at = T0 + sample_id
            _insert(
                conn, "model_samples", id=sample_id, model_id=1, collected_at=at, **METRICS, **STATS
            )
        # Sample 3's rows are written after sample 4's, and its sizes out of order.
        for row_id, sample_id, size in ((1, 4, 2), (2, 3, 16), (3, 3, 1), (4, 3, 4)):
            _insert(
                conn,
                "batch_stats",
                id=row_id,
                model_sample_id=sample_id,
                batch_size=size,
                exec_count=10 * size,
                compute_input_count=10 * size + 1,
                compute_input_ns=1_000 * size + 2,
                compute_infer_ns=90_000_000_000 * size + 3,
                compute_output_count=10 * size + 4,
                compute_output_ns=1_000 * size + 5,
            )
    engine.dispose()
    yield db_url


def _batch(size: int) -> BatchStat:
    return BatchStat(
        size,
        Duration(10 * size + 1, 1_000 * size + 2),
        Duration(10 * size, 90_000_000_000 * size + 3),
        Duration(10 * size + 4, 1_000 * size + 5),
    )


def test_batch_stats_move_into_their_samples_and_back(db_0007: str) -> None:
    with Store(db_0007) as store:
        samples = store.model_samples()
    assert samples[0].stats is None
    assert [s.stats.batch_stats for s in samples[1:] if s.stats is not None] == [
        (),
        (_batch(16), _batch(1), _batch(4)),
        (_batch(2),),
    ]
    engine = create_engine(db_0007, poolclass=NullPool)
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT CAST(batch_stats AS TEXT) FROM model_samples ORDER BY id")
        ).all()
        # Compact, in the layout of schema.BATCH_STAT_LAYOUT, in written order.
        assert [r[0] for r in stored][:3] == [
            None,
            "[]",
            "[[16,161,16002,160,1440000000003,164,16005],"
            "[1,11,1002,10,90000000003,14,1005],[4,41,4002,40,360000000003,44,4005]]",
        ]
        assert "batch_stats" not in inspect(conn).get_table_names()
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0007")
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT model_sample_id, batch_size, exec_count FROM batch_stats ORDER BY id")
        ).all()
        assert [tuple(r) for r in rows] == [(3, 16, 160), (3, 1, 10), (3, 4, 40), (4, 2, 20)]
        assert "batch_stats" not in {c["name"] for c in inspect(conn).get_columns("model_samples")}
    engine.dispose()
