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
