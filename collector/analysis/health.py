"""Whether a target is up, from the states of the sources that scrape it.

The store keeps what each (target, source) last did; which of those decide the
target's own state is this module's rule:

* a Triton target is up when its latest scrape by the ``"triton"`` source succeeded;
  the other sources on it (host, NVML) do not change it;
* any other target (a host) is up when the latest scrape of every source that ever
  scraped it succeeded.

Everything is judged from *now*: a target, or a series of samples, is fresh while its
newest successful reading is younger than ``stale_after_s`` of its scrape interval.
Nothing (a rate, a finding, a recommendation) is computed from a window that holds no
fresh sample, and a target not scraped lately is stale, never up.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

__all__ = [
    "HOST_KIND",
    "MIN_STALE_S",
    "PRIMARY_SOURCE",
    "STALE_AFTER_INTERVALS",
    "TRITON_KIND",
    "is_fresh",
    "scrape_decides",
    "series_interval_s",
    "stale_after_s",
    "target_up",
]

#: Target kinds: a Triton server, or a host read by host-level sources (NVML, /proc).
TRITON_KIND = "triton"
HOST_KIND = "host"
#: The source whose scrapes decide whether a target of kind ``TRITON_KIND`` is up.
PRIMARY_SOURCE = "triton"
#: A reading is stale once this many scrape intervals pass without a newer one: one
#: late or failed scrape is jitter, three in a row is a target that is gone.
STALE_AFTER_INTERVALS = 3
#: ... but never sooner than this, so sub-second intervals do not flap on a slow tick.
MIN_STALE_S = 5.0


def scrape_decides(kind: str, source: str) -> bool:
    """Whether a scrape by ``source`` bears on the state of a target of ``kind``."""
    return kind != TRITON_KIND or source == PRIMARY_SOURCE


def target_up(kind: str, states: Mapping[str, bool]) -> bool | None:
    """Whether a target of ``kind`` is up, given whether the latest scrape of each
    source succeeded; ``None`` while no deciding source has scraped it."""
    deciding = [up for source, up in states.items() if scrape_decides(kind, source)]
    if not deciding:
        return None
    return all(deciding)


def stale_after_s(interval_s: float) -> float:
    """How old the newest reading of something scraped every ``interval_s`` may be
    before it is stale."""
    return max(STALE_AFTER_INTERVALS * interval_s, MIN_STALE_S)


def is_fresh(last_at: float | None, now: float, interval_s: float) -> bool:
    """Whether a reading taken at ``last_at`` (``None``: never) still counts at ``now``."""
    return last_at is not None and now - last_at <= stale_after_s(interval_s)


def series_interval_s(times: Sequence[float]) -> float | None:
    """The scrape interval a series of sample times shows: the median gap between
    neighbours (robust to one missed scrape); ``None`` with fewer than two samples."""
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    return statistics.median(gaps) if gaps else None
