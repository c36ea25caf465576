"""The store's write cache: writes of one target take turns, a target written by
another process or deleted by someone else is found again, and a forgotten target
leaves nothing behind; on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool, QueuePool

from collector.analysis.health import FLEET_SOURCE
from collector.records import ModelConfig, TritonSnapshot
from collector.store import Store, TargetState
from collector.store.engine import SQLITE_KEPT_CONNECTIONS
from tests.unit.test_store import full_metrics, full_stats, scrape

T0 = 1_700_000_000.0


def _sql(db_url: str, *statements: str) -> list[tuple[object, ...]]:
    """Run ``statements`` as another client would; the rows of the last."""
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:
        rows: list[tuple[object, ...]] = []
        for statement in statements:
            result = conn.execute(text(statement))
            rows = [tuple(r) for r in result] if result.returns_rows else []
    engine.dispose()
    return rows


def _snapshot(at: float, *models: str, version: str = "2.52.0") -> TritonSnapshot:
    config = ModelConfig(model="resnet", max_batch_size=8, raw_json='{"name": "resnet"}')
    return TritonSnapshot(
        "triton-a",
        at,
        server_version=version,
        model_metrics=tuple(full_metrics(m) for m in models or ("resnet",)),
        model_stats=tuple(full_stats(m) for m in models or ("resnet",)),
        model_configs=(config,),
    )


def test_concurrent_writes_of_one_target_store_an_unchanged_config_once(store: Store) -> None:
    start = threading.Barrier(8)

    def write(worker: int) -> None:
        start.wait()
        for i in range(10):
            store.write_triton(_snapshot(T0 + worker * 100 + i))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.model_configs()) == 1
    assert len(store.model_samples()) == 80


def test_a_deciding_source_written_by_another_process_is_read_again(db_url: str) -> None:
    direct, fleet = Store(db_url), Store(db_url)
    try:
        scrape(fleet, T0, source=FLEET_SOURCE)
        assert scrape(direct, T0 + 1).sources == {FLEET_SOURCE: True, "triton": True}
        assert scrape(fleet, T0 + 2, source=FLEET_SOURCE).up is True
        scrape(fleet, T0 + 3, "down", source=FLEET_SOURCE)
        # The direct collector's cache still says the fleet source is up.
        after = scrape(direct, T0 + 4)
        assert after.sources == {FLEET_SOURCE: False, "triton": True}
        assert store_state(direct).sources == after.sources
    finally:
        direct.close()
        fleet.close()


def store_state(store: Store) -> TargetState:
    [state] = store.targets()
    return state


def test_a_target_deleted_by_someone_else_is_written_again(store: Store, db_url: str) -> None:
    scrape(store, T0)
    store.write_triton(_snapshot(T0))
    _sql(
        db_url,
        "DELETE FROM model_samples",
        "DELETE FROM models",
        "DELETE FROM model_configs",
        "DELETE FROM target_transitions",
        "DELETE FROM targets",
    )
    # The scrape's record finds the target gone and makes it again.
    state = scrape(store, T0 + 5, "timeout")
    assert (state.name, state.consecutive_failures) == ("triton-a", 1)
    # A sample write with the old ids fails once, then finds everything again.
    try:
        store.write_triton(_snapshot(T0 + 6))
    except SQLAlchemyError:
        store.write_triton(_snapshot(T0 + 6))
    store.write_triton(_snapshot(T0 + 7))
    assert [s.collected_at for s in store.model_samples()] == [T0 + 6, T0 + 7]
    assert [t.name for t in store.targets()] == ["triton-a"]


def test_sample_writes_after_the_target_row_is_deleted(store: Store, db_url: str) -> None:
    store.write_triton(_snapshot(T0))
    _sql(
        db_url,
        "DELETE FROM model_samples",
        "DELETE FROM models",
        "DELETE FROM model_configs",
        "DELETE FROM targets",
    )
    with pytest.raises(SQLAlchemyError):
        store.write_triton(_snapshot(T0 + 1))  # the cached ids are gone
    store.write_triton(_snapshot(T0 + 2))
    [sample] = store.model_samples()
    assert (sample.collected_at, sample.stats) == (T0 + 2, full_stats())


def test_a_forgotten_target_is_found_again(store: Store, db_url: str) -> None:
    store.write_triton(_snapshot(T0))
    _sql(db_url, "UPDATE targets SET server_version = 'edited'")
    store.write_triton(_snapshot(T0 + 1))  # known: not written again
    assert _sql(db_url, "SELECT server_version FROM targets") == [("edited",)]
    store.forget_target("triton-a")
    store.write_triton(_snapshot(T0 + 2))
    assert _sql(db_url, "SELECT server_version FROM targets") == [("2.52.0",)]
    assert len(store.model_samples()) == 3


def test_forgetting_a_target_keeps_its_lock(store: Store) -> None:
    """A writer that looked the lock up before ``forget_target`` and one that looks it
    up after must get the same lock, or both could write the target at once."""
    store.write_triton(_snapshot(T0))
    looked_up_before = store._target_lock("triton-a")
    store.forget_target("triton-a")
    assert store._target_lock("triton-a") is looked_up_before


def test_a_changed_set_of_models_writes_the_server_version_again(store: Store, db_url: str) -> None:
    store.write_triton(_snapshot(T0, "resnet"))
    _sql(db_url, "UPDATE targets SET server_version = 'edited'")
    store.write_triton(_snapshot(T0 + 1, "resnet"))
    assert _sql(db_url, "SELECT server_version FROM targets") == [("edited",)]
    store.write_triton(_snapshot(T0 + 2, "resnet", "mlp"))
    assert _sql(db_url, "SELECT server_version FROM targets") == [("2.52.0",)]
    _sql(db_url, "UPDATE targets SET server_version = 'edited'")
    store.write_triton(replace(_snapshot(T0 + 3, "mlp")))  # a model unloaded
    assert _sql(db_url, "SELECT server_version FROM targets") == [("2.52.0",)]


def test_the_pool_serves_as_many_connections_as_asked(db_url: str) -> None:
    """24 at once, all kept by a server's store. A SQLite file store keeps two open
    after a peak, so that the page caches (up to 2 MiB each) of the connections a rare
    peak opened are not kept as long as the process runs; the descriptors those leave
    are reused by the next peak (SQLite holds them while other connections lock the
    file, as closing one would drop the process's locks), not added to."""
    with Store(db_url, pool_size=24) as store:
        pool = store._engine.pool  # noqa: SLF001
        assert isinstance(pool, QueuePool)
        descriptors = []
        for _peak in range(3):
            held = [store._engine.connect() for _ in range(24)]  # noqa: SLF001
            try:
                for conn in held:
                    conn.exec_driver_sql("SELECT 1").scalar_one()
                assert pool.checkedout() == 24
            finally:
                for conn in held:
                    conn.close()
            descriptors.append(len(psutil.Process().open_files()))
        if db_url.startswith("sqlite"):
            assert pool.checkedin() == SQLITE_KEPT_CONNECTIONS == 2
        else:
            assert pool.checkedin() == 24
        assert descriptors[0] == descriptors[1] == descriptors[2], descriptors
    with pytest.raises(ValueError, match="pool_size"):
        Store(db_url, pool_size=0)


def test_stores_of_one_process_may_be_opened_at_once(tmp_path: Path) -> None:
    """Each first open runs the migrations, whose context is module-wide in Alembic."""
    stores = [Store(f"sqlite:///{tmp_path / f's{i}.db'}") for i in range(6)]
    all_ready = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def open_(store: Store) -> None:
        all_ready.wait()
        try:
            store.open()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert all(s.targets() == [] for s in stores)
    finally:
        for s in stores:
            s.close()


def test_absent_figures_are_stored_as_sql_null(store: Store, db_url: str) -> None:
    """A scrape between two readings of the statistics and the first of a series (no
    rates) leave those columns NULL, as another client reads them; the SQLite driver
    binds each None through the adapter the store gives it."""
    snapshot = replace(_snapshot(T0), model_stats=())
    store.write_triton(snapshot, {})
    nulls = _sql(
        db_url,
        "SELECT COUNT(*) FROM model_samples WHERE stats_inference_count IS NULL"
        " AND batch_stats IS NULL AND avg_batch_size IS NULL AND rate_window_s IS NULL",
    )
    assert nulls == [(1,)]
    (sample,) = store.model_samples(target="triton-a")
    assert sample.stats is None and sample.rates is None
