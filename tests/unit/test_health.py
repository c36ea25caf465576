"""The up/stale rule every view shares (``collector.analysis.health``)."""

from __future__ import annotations

from collector.analysis.health import (
    MIN_STALE_S,
    is_fresh,
    stale_after_s,
    target_up,
)


def test_a_reading_goes_stale_after_three_intervals_but_never_sooner_than_the_floor() -> None:
    assert stale_after_s(10.0) == 30.0
    assert stale_after_s(0.5) == MIN_STALE_S
    assert is_fresh(100.0, now=129.0, interval_s=10.0)
    assert not is_fresh(100.0, now=131.0, interval_s=10.0)
    assert not is_fresh(None, now=100.0, interval_s=10.0)


def test_a_triton_target_is_decided_by_its_triton_source_alone() -> None:
    assert target_up("triton", {"triton": True, "host": False}) is True
    assert target_up("host", {"host": True, "nvml": False}) is False
    assert target_up("triton", {"host": True}) is None


def test_a_deciding_source_that_stopped_reporting_no_longer_keeps_the_target_down() -> None:
    down_direct = {"triton": False, "prometheus": True}
    assert target_up("triton", down_direct) is False  # both count without times
    # Both report: both must be up.
    assert target_up("triton", down_direct, {"triton": 95.0, "prometheus": 100.0}, 5.0) is False
    # The direct scrape stopped 20 s before Prometheus's latest (stale at 15 s).
    assert target_up("triton", down_direct, {"triton": 80.0, "prometheus": 100.0}, 5.0) is True
    # ... and the other way round: Prometheus no longer reports it.
    stopped_fleet = {"triton": True, "prometheus": False}
    assert target_up("triton", stopped_fleet, {"triton": 100.0, "prometheus": 80.0}, 5.0)
    # A source without a time counts; sources that do not decide are not looked at.
    assert target_up("triton", down_direct, {"prometheus": 100.0}, 5.0) is False
    assert target_up("triton", {"triton": True, "host": False}, {"host": 1.0}, 5.0) is True
    assert target_up("host", {"host": True, "nvml": False}, {"host": 100.0, "nvml": 1.0}) is True
