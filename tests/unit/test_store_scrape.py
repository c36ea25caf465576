"""A Triton scrape's samples and its record in one transaction (``Store.write_scrape``),
recorded exactly as ``record_scrape`` records it; JSON documents written by orjson
where that reads back the same; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from collector.analysis.health import FLEET_SOURCE
from collector.records import ModelConfig, TritonSnapshot
from collector.store import ScrapeRecord, Store
from collector.store.bulk import json_encoder, json_loads, json_text
from tests.unit.test_store import full_metrics, full_rates, full_stats

T0 = 1_700_000_000.0


def _snapshot(target: str, at: float) -> TritonSnapshot:
    config = ModelConfig(model="resnet", max_batch_size=8, raw_json='{"name": "resnet"}')
    return TritonSnapshot(
        target,
        at,
        server_version="2.52.0",
        model_metrics=(full_metrics("resnet"), full_metrics("mlp")),
        model_stats=(full_stats("resnet"),),
        model_configs=(config,),
    )


# (seconds after T0, error kind or None, first in its run, source)
_SCRAPES: list[tuple[float, str | None, bool, str]] = [
    (0, None, True, "triton"),
    (1, None, False, "triton"),
    (2, "timeout", False, "triton"),
    (3, "timeout", False, "triton"),
    (4, None, False, "triton"),
    (5, None, False, FLEET_SOURCE),  # another deciding source of the same target
    (6, None, False, "triton"),
    (7, "down", False, FLEET_SOURCE),
    (8, None, False, "triton"),
    (9, "refused", True, "triton"),  # a collector restarted
    (10, None, True, "triton"),
    (11, None, False, "triton"),
]


def _record(store: Store, target: str, dt: float, error_kind: str | None, first: bool, source: str,
            *, combined: bool) -> None:  # fmt: skip
    scrape = ScrapeRecord(
        target, source, "triton", T0 + dt, 0.25, error_kind,
        None if error_kind is None else f"{error_kind} at {dt}",
        interval_s=1.0, first_in_run=first,
    )  # fmt: skip
    if combined and error_kind is None and source == "triton":
        store.write_scrape(_snapshot(target, T0 + dt), {}, scrape)
        return
    if error_kind is None and source == "triton":
        store.write_triton(_snapshot(target, T0 + dt), {})
    store.record_scrape(
        target, source, kind=scrape.kind, started_at=scrape.started_at,
        duration_s=scrape.duration_s, error_kind=error_kind, error=scrape.error,
        interval_s=scrape.interval_s, first_in_run=first,
    )  # fmt: skip


def test_write_scrape_records_what_record_scrape_records(store: Store) -> None:
    for dt, error_kind, first, source in _SCRAPES:
        _record(store, "apart", dt, error_kind, first, source, combined=False)
        _record(store, "together", dt, error_kind, first, source, combined=True)
    states = {t.name: t for t in store.targets()}
    apart, together = states["apart"], states["together"]
    # The write's own time is added to the duration given: the same, or a little more.
    assert apart.last_duration_s == 0.25
    assert together.last_duration_s is not None and 0.25 <= together.last_duration_s < 1.25
    assert replace(together, name="apart", last_duration_s=0.25) == apart
    assert [replace(t, target="x") for t in store.transitions("together")] == [
        replace(t, target="x") for t in store.transitions("apart")
    ]
    assert len(store.transitions("together")) == 7  # five of triton, two of the fleet
    for target in ("apart", "together"):
        samples = store.model_samples(target=target, model="resnet")
        assert [s.collected_at - T0 for s in samples] == [0, 1, 4, 6, 8, 10, 11]
        assert samples[-1].stats == full_stats("resnet")
    assert len(store.model_configs()) == 2


def test_a_scrape_is_one_transaction(store: Store) -> None:
    scrape = ScrapeRecord("t", "triton", "triton", T0, 0.1, interval_s=1.0, first_in_run=True)
    store.write_scrape(_snapshot("t", T0), {}, scrape)
    begins: list[object] = []

    def began(connection: object) -> None:
        begins.append(connection)

    event.listen(store._engine, "begin", began)  # noqa: SLF001
    try:
        later = replace(scrape, started_at=T0 + 1, first_in_run=False)
        store.write_scrape(_snapshot("t", T0 + 1), {("resnet", "1"): full_rates()}, later)
    finally:
        event.remove(store._engine, "begin", began)  # noqa: SLF001
    assert len(begins) == 1
    [state] = store.targets()
    assert (state.up, state.last_scrape_at, state.last_seen_at) == (True, T0 + 1, T0 + 1)
    [_, rated] = store.model_samples(model="resnet")
    assert rated.rates == full_rates()


def _sql(db_url: str, statement: str) -> list[tuple[Any, ...]]:
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:
        result = conn.execute(text(statement))
        rows = [tuple(r) for r in result] if result.returns_rows else []
    engine.dispose()
    return rows


def test_a_failed_write_leaves_neither_samples_nor_record(store: Store, db_url: str) -> None:
    scrape = ScrapeRecord("t", "triton", "triton", T0, 0.1, first_in_run=True)
    store.write_scrape(_snapshot("t", T0), {}, scrape)
    # Another client deletes the models (their ids are in the write cache).
    _sql(db_url, "DELETE FROM model_samples")
    _sql(db_url, "DELETE FROM models")
    later = replace(scrape, started_at=T0 + 1, first_in_run=False)
    with pytest.raises(SQLAlchemyError):
        store.write_scrape(_snapshot("t", T0 + 1), {}, later)
    [state] = store.targets()
    assert state.last_scrape_at == T0  # the record was rolled back with the samples
    assert store.model_samples() == []
    # The next write finds everything again.
    store.write_scrape(_snapshot("t", T0 + 2), {}, replace(later, started_at=T0 + 2))
    assert [s.collected_at for s in store.model_samples(model="resnet")] == [T0 + 2]
    with pytest.raises(ValueError, match="snapshot"):
        store.write_scrape(_snapshot("other", T0 + 3), {}, later)


def test_non_finite_floats_are_stored_as_before(store: Store, db_url: str) -> None:
    """orjson would write NaN as null: such a document is written by json, as NaN on
    SQLite and as the string "NaN" on PostgreSQL, whose json refuses the token."""
    metrics = replace(full_metrics(), summary_quantiles_us={"s": {0.5: math.nan}})
    store.write_triton(TritonSnapshot("t", T0, model_metrics=(metrics,)))
    [(stored,)] = _sql(db_url, "SELECT CAST(summary_quantiles_us AS TEXT) FROM model_samples")
    nan = '"NaN"' if db_url.startswith("postgresql") else "NaN"
    assert stored == '{"s":{"0.5":%s}}' % nan  # noqa: UP031
    [sample] = store.model_samples()
    assert math.isnan(sample.metrics.summary_quantiles_us["s"][0.5])


def test_a_nan_failure_count_reads_back_as_a_number(store: Store) -> None:
    """A failure counter that parsed as NaN is stored (as "NaN" on PostgreSQL) and read
    back as a float by both readers, so rate arithmetic over it cannot meet a string."""
    metrics = replace(full_metrics(), request_failure_by_reason={"REJECTED": math.nan})
    for at in (T0, T0 + 1):
        store.write_triton(TritonSnapshot("t", at, model_metrics=(metrics,)))
    [sample, _] = store.model_samples()
    assert math.isnan(sample.metrics.request_failure_by_reason["REJECTED"])
    [series] = store.counter_series(since=T0 - 1, until=T0 + 2)
    for reading in series.readings:
        assert math.isnan(reading.failure_by_reason["REJECTED"])


_DOCUMENTS: list[Any] = [
    {},
    [],
    {"BACKEND": 0.0, "REJECTED": 1.5},
    [[8, 40, 800_000, 40, 80_000_000_000, 40, 1_600_000], [1, 11, 2**63 - 1, 0, 0, 0, 0]],
    {"q": {"0.5": 1e16, "0.99": 1e-7, "inf": 3.0}},
    {"über": "ünïcode", "tab\t": "line\nbreak", "quote": '"'},
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf},
    {"none": None, "nested": [None, 1]},
    {"big": 2**70},  # past 64 bits: orjson refuses it
    {"tuple": (1, 2)},
]


@pytest.mark.parametrize("finite_only", [False, True])
@pytest.mark.parametrize("doc", _DOCUMENTS, ids=range(len(_DOCUMENTS)))
def test_the_fast_json_encoder_reads_back_as_json_text(doc: Any, finite_only: bool) -> None:
    encoded = json_encoder(finite_only)(doc)
    expected = json_text(doc, finite_only=finite_only)
    assert encoded is not None and expected is not None
    # NaN != NaN: compare the documents' JSON text once read back and written again.
    assert json.dumps(json.loads(encoded)) == json.dumps(json.loads(expected))
    if finite_only:
        assert "NaN" not in encoded.replace('"NaN"', "")
    assert json_encoder(finite_only)(None) is None


@pytest.mark.parametrize("finite_only", [False, True])
@pytest.mark.parametrize("doc", _DOCUMENTS, ids=range(len(_DOCUMENTS)))
def test_the_fast_json_reader_reads_what_json_reads(doc: Any, finite_only: bool) -> None:
    """orjson reads what it can, json the rest (NaN and the infinities as SQLite keeps
    them, integers past 64 bits): the values are json's either way."""
    text = json_text(doc, finite_only=finite_only)
    assert text is not None
    for given in (text, text.encode()):
        read = json_loads(given)
        # NaN != NaN: compare the values written again.
        assert json.dumps(read) == json.dumps(json.loads(text))
        assert type(read) is type(json.loads(text))


def test_the_fast_json_reader_refuses_what_json_refuses() -> None:
    for bad in ("", "{", "[1,]", "nan", "{'a': 1}"):
        with pytest.raises(ValueError):
            json_loads(bad)


def test_documents_with_any_characters_read_back(store: Store) -> None:
    """What COPY (PostgreSQL) and the driver (SQLite) must escape reads back as written."""
    reasons = {'a"b\\c\td\nü': 1.0, "": 2.0, "\\N": 3.0, "tab\there": 4.0}
    metrics = replace(full_metrics(), request_failure_by_reason=reasons)
    scrape = ScrapeRecord("t", "triton", "triton", T0, 0.1)
    store.write_scrape(TritonSnapshot("t", T0, model_metrics=(metrics,)), {}, scrape)
    [sample] = store.model_samples()
    assert sample.metrics.request_failure_by_reason == reasons
    assert sample.metrics == metrics
