"""The one protocol every source implements, and the registry of sources.

A source turns one endpoint into typed records (``collector.records``). It never
schedules, never writes to the store and never swallows a failure: it raises a
``collector.errors.CollectError`` and the scheduler's wrapper records it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from collector.records import (
    DeviceSample,
    HostFacts,
    ProcessSample,
    ScrapeHealth,
    TritonSnapshot,
)

__all__ = ["Record", "Source", "SourceSpec", "SOURCES", "register_source"]

Record = TritonSnapshot | DeviceSample | ProcessSample | HostFacts | ScrapeHealth


@runtime_checkable
class Source(Protocol):
    """``name`` is the registry name; ``target`` the target the records belong to."""

    name: str
    target: str

    def collect(self) -> Sequence[Record]:
        """Read the endpoint once. Raise ``CollectError`` on failure."""
        ...

    def close(self) -> None:
        """Release connections and library handles."""
        ...


@dataclass(frozen=True)
class SourceSpec:
    """How to build a source. ``per_target`` sources get one instance per Triton
    target; the others one per host."""

    name: str
    factory: Callable[..., Source]
    per_target: bool
    default_enabled: bool = True


SOURCES: dict[str, SourceSpec] = {}


def register_source(spec: SourceSpec) -> SourceSpec:
    if spec.name in SOURCES:
        raise ValueError(f"source {spec.name!r} registered twice")
    SOURCES[spec.name] = spec
    return spec
