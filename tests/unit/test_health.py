"""The up/stale rule every view shares (``collector.analysis.health``)."""

from __future__ import annotations

import pytest

from collector.analysis.health import (
    MIN_STALE_S,
    is_fresh,
    series_interval_s,
    stale_after_s,
    target_up,
)


def test_a_reading_goes_stale_after_three_intervals_but_never_sooner_than_the_floor() -> None:
    assert stale_after_s(10.0) == 30.0
    assert stale_after_s(0.5) == MIN_STALE_S
    assert is_fresh(100.0, now=129.0, interval_s=10.0)
    assert not is_fresh(100.0, now=131.0, interval_s=10.0)
    assert not is_fresh(None, now=100.0, interval_s=10.0)


def test_the_interval_of_a_series_is_its_median_gap_so_one_missed_scrape_does_not_move_it() -> None:
    assert series_interval_s([0.0, 1.0, 2.0, 4.0, 5.0]) == pytest.approx(1.0)
    assert series_interval_s([3.0]) is None


def test_a_triton_target_is_decided_by_its_triton_source_alone() -> None:
    assert target_up("triton", {"triton": True, "host": False}) is True
    assert target_up("host", {"host": True, "nvml": False}) is False
    assert target_up("triton", {"host": True}) is None
