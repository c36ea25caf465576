"""Whether a target is up, from the states of the sources that scrape it.

The store keeps what each (target, source) last did; which of those decide the
target's own state is this module's rule:

* a Triton target is up when its latest scrape by the ``"triton"`` source succeeded
  -- or, in fleet mode, when Prometheus's latest scrape of it did (the
  ``"prometheus"`` source reads its ``up`` series); with both, when both did, as
  long as both still report (one whose latest scrape is stale next to the other's
  no longer counts: ``target_up``). The other sources on it (host, NVML) do not
  change it;
* any other target (a host) is up when the latest scrape of every source that ever
  scraped it (and still reports) succeeded.

Everything is judged from *now*: a target, or a series of samples, is fresh while its
newest successful reading is younger than ``stale_after_s`` of its scrape interval.
Nothing (a rate, a finding, a recommendation) is computed from a window that holds no
fresh sample, and a target not scraped lately is stale, never up.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DEFAULT_INTERVAL_S",
    "HOST_KIND",
    "FLEET_SOURCE",
    "MIN_STALE_S",
    "PRIMARY_SOURCE",
    "STALE_AFTER_INTERVALS",
    "TRITON_KIND",
    "Health",
    "HealthState",
    "ScrapedTarget",
    "collector_running",
    "is_fresh",
    "scrape_decides",
    "scrape_interval_s",
    "stale_after_s",
    "target_health",
    "target_healths",
    "target_up",
]

#: Target kinds: a Triton server, or a host read by host-level sources (NVML, /proc).
TRITON_KIND = "triton"
HOST_KIND = "host"
#: The source whose scrapes decide whether a target of kind ``TRITON_KIND`` is up.
PRIMARY_SOURCE = "triton"
#: ... and the one that tells, in fleet mode, how Prometheus's scrapes of it went.
FLEET_SOURCE = "prometheus"
_DECIDING_TRITON = frozenset({PRIMARY_SOURCE, FLEET_SOURCE})
#: A reading is stale once this many scrape intervals pass without a newer one: one
#: late or failed scrape is jitter, three in a row is a target that is gone.
STALE_AFTER_INTERVALS = 3
#: ... but never sooner than this, so sub-second intervals do not flap on a slow tick.
MIN_STALE_S = 5.0
#: The scrape interval of a target stored before the store kept intervals (the
#: collector's default ``interval_s``).
DEFAULT_INTERVAL_S = 5.0


def scrape_decides(kind: str, source: str) -> bool:
    """Whether a scrape by ``source`` bears on the state of a target of ``kind``."""
    return kind != TRITON_KIND or source in _DECIDING_TRITON


def target_up(
    kind: str,
    states: Mapping[str, bool],
    scraped_at: Mapping[str, float] | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> bool | None:
    """Whether a target of ``kind`` is up, given whether the latest scrape of each
    source succeeded; ``None`` while no deciding source has scraped it.

    With ``scraped_at`` (when each source's latest scrape was) a deciding source
    whose latest scrape is stale next to the newest deciding one (older by more than
    ``stale_after_s(interval_s)``) no longer counts: one of two deciding sources that
    stopped (the direct scrape of a fleet-mode target given up) does not keep the
    target down for ever. A source without a time counts."""
    deciding = {source: up for source, up in states.items() if scrape_decides(kind, source)}
    if scraped_at:
        times = {s: scraped_at[s] for s in deciding if s in scraped_at}
        if times:
            oldest = max(times.values()) - stale_after_s(interval_s)
            deciding = {s: up for s, up in deciding.items() if times.get(s, oldest) >= oldest}
    if not deciding:
        return None
    return all(deciding.values())


def stale_after_s(interval_s: float) -> float:
    """How old the newest reading of something scraped every ``interval_s`` may be
    before it is stale."""
    return max(STALE_AFTER_INTERVALS * interval_s, MIN_STALE_S)


def is_fresh(last_at: float | None, now: float, interval_s: float) -> bool:
    """Whether a reading taken at ``last_at`` (``None``: never) still counts at ``now``."""
    return last_at is not None and now - last_at <= stale_after_s(interval_s)


# --------------------------------------------------------------------------- target health


class HealthState(enum.StrEnum):
    """What a target is *now*.

    * ``UP``: its latest deciding scrape succeeded, and recently;
    * ``DOWN``: a collector is running, but the target's latest scrape failed or its
      last successful one is older than ``stale_after_s`` of its interval;
    * ``STALE``: no collector has scraped any target lately, so nothing is known of
      now (the last thing known is kept in ``Health.last_seen_at``);
    * ``UNKNOWN``: never scraped by a source that decides its state.
    """

    UP = "up"
    DOWN = "down"
    STALE = "stale"
    UNKNOWN = "unknown"


class ScrapedTarget(Protocol):
    """What the store keeps of a target that the health rule reads
    (``collector.store.TargetState`` has these)."""

    @property
    def up(self) -> bool | None: ...
    @property
    def last_seen_at(self) -> float | None: ...
    @property
    def last_scrape_at(self) -> float | None: ...
    @property
    def interval_s(self) -> float | None: ...


@dataclass(frozen=True)
class Health:
    """A target's state at ``now`` and the one line that says why."""

    state: HealthState
    reason: str
    last_seen_at: float | None = None

    @property
    def up(self) -> bool:
        return self.state is HealthState.UP


def scrape_interval_s(target: ScrapedTarget | None) -> float:
    """How often ``target`` is scraped: as the store keeps it, else the default (an
    unknown target, or one stored before intervals were kept). Every series of a
    target is judged fresh or stale by this interval."""
    interval = target.interval_s if target is not None else None
    return interval if interval is not None and interval > 0 else DEFAULT_INTERVAL_S


def collector_running(targets: Iterable[ScrapedTarget], now: float) -> bool:
    """Whether any collector scraped any of ``targets`` lately (successfully or not)."""
    return any(is_fresh(t.last_scrape_at, now, scrape_interval_s(t)) for t in targets)


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def target_health(target: ScrapedTarget, now: float, *, collector_runs: bool) -> Health:
    """The one rule for "is this target up *now*": ``target`` as the store keeps it,
    judged at ``now``; ``collector_runs`` says whether any collector scraped any
    target lately (``collector_running``)."""
    seen = target.last_seen_at
    if target.up is None:
        return Health(HealthState.UNKNOWN, "not scraped yet", seen)
    if not collector_runs:
        since = max(now - (target.last_scrape_at or 0.0), 0.0)
        return Health(HealthState.STALE, f"no collector has scraped it for {_ago(since)}", seen)
    if target.up and is_fresh(seen, now, scrape_interval_s(target)):
        return Health(HealthState.UP, "scraped", seen)
    if not target.up:
        return Health(HealthState.DOWN, "its latest scrape failed", seen)
    if seen is None:  # pragma: no cover - an up target has been seen
        return Health(HealthState.DOWN, "never scraped successfully", seen)
    return Health(HealthState.DOWN, f"no successful scrape for {_ago(now - seen)}", seen)


def target_healths(targets: Sequence[ScrapedTarget], now: float) -> list[Health]:
    """``target_health`` of each of ``targets`` (in their order), with whether a
    collector runs judged from all of them."""
    runs = collector_running(targets, now)
    return [target_health(t, now, collector_runs=runs) for t in targets]
