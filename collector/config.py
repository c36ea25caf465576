"""Settings: one typed model, filled from defaults, a YAML file, ``BATCHSCOPE_*``
environment variables and the command line (later wins), validated once at start."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Settings", "TargetSettings"]


@dataclass(frozen=True)
class TargetSettings:
    """One Triton server: ``url`` is its HTTP endpoint, ``metrics_url`` its /metrics."""

    name: str
    url: str
    metrics_url: str


@dataclass(frozen=True)
class Settings:
    targets: tuple[TargetSettings, ...] = ()
    db_url: str = "sqlite:///batchscope.db"
    interval_s: float = 5.0
    duration_s: float | None = None
    timeout_s: float = 3.0
    max_response_bytes: int = 16 * 1024 * 1024
    sources: tuple[str, ...] = ("triton", "nvml", "host")
    extra: dict[str, object] = field(default_factory=dict)
