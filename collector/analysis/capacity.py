"""Idle capacity of a model's instances: the one formula the detectors' findings and
the exporter's gauge both use, so the two never disagree."""

from __future__ import annotations

__all__ = ["idle_instance_equivalents"]


def idle_instance_equivalents(instance_count: int, busy_share: float) -> float:
    """Idle capacity in instance-equivalents: the instances times the share of the
    window they were not computing. ``busy_share`` (``ModelRates.busy_share``) is
    clamped to 0..1 first: a share a little over 1 is timing noise, not negative
    idleness. Two instances busy 20 % of the time have 1.6 idle instance-equivalents."""
    return instance_count * (1.0 - min(max(busy_share, 0.0), 1.0))
