"""``record_from``: a record read from a row is the record its ``__init__`` makes."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest

from collector.records import ModelRates, ProcessSample
from collector.store.mapping import rates_values, record_from
from collector.store.schema import RATE_COLUMNS
from tests.unit.test_store import full_rates


def test_a_record_read_from_a_row_is_the_one_init_makes() -> None:
    rates = full_rates()
    row = rates_values(rates)
    read = record_from(ModelRates, row, RATE_COLUMNS)
    assert read == rates
    assert repr(read) == repr(rates)
    assert pickle.loads(pickle.dumps(read)) == rates
    # Still frozen.
    with pytest.raises(AttributeError):
        read.window_s = 1.0  # type: ignore[misc]


def test_extra_fields_override_the_row_and_need_not_be_in_it() -> None:
    row = rates_values(full_rates())
    del row["rate_resets"]
    read = record_from(ModelRates, row, RATE_COLUMNS, extra={"resets": 7, "window_s": 2.5})
    assert (read.resets, read.window_s) == (7, 2.5)


def test_each_renaming_reads_its_own_columns() -> None:
    @dataclass(frozen=True)
    class Pair:
        a: int
        b: int

    row = {"a": 1, "b": 2, "x": 10, "y": 20}
    assert record_from(Pair, row) == Pair(1, 2)
    assert record_from(Pair, row, {"a": "x"}) == Pair(10, 2)
    assert record_from(Pair, row, {"a": "x", "b": "y"}) == Pair(10, 20)
    assert record_from(Pair, row, {"b": "y"}) == Pair(1, 20)


def test_a_record_with_a_post_init_or_slots_is_made_by_its_init() -> None:
    @dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    @dataclass(frozen=True, slots=True)
    class Slotted:
        value: int
        tags: list[str] = field(default_factory=list)

    assert record_from(Checked, {"value": 1}) == Checked(1)
    with pytest.raises(ValueError, match="negative"):
        record_from(Checked, {"value": -1})
    assert record_from(Slotted, {"value": 1, "tags": ["a"]}) == Slotted(1, ["a"])


def test_a_process_sample_reads_back_whole() -> None:
    sample = ProcessSample(
        source="host", pid=42, role="stub", model="m", cpu_pct=12.5, rss_bytes=2**30
    )
    row = {name: getattr(sample, name) for name in sample.__dataclass_fields__}
    assert record_from(ProcessSample, row) == sample
