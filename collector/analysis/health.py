"""Whether a target is up, from the states of the sources that scrape it.

The store keeps what each (target, source) last did; which of those decide the
target's own state is this module's rule:

* a Triton target is up when its latest scrape by the ``"triton"`` source succeeded;
  the other sources on it (host, NVML) do not change it;
* any other target (a host) is up when the latest scrape of every source that ever
  scraped it succeeded.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["HOST_KIND", "PRIMARY_SOURCE", "TRITON_KIND", "scrape_decides", "target_up"]

#: Target kinds: a Triton server, or a host read by host-level sources (NVML, /proc).
TRITON_KIND = "triton"
HOST_KIND = "host"
#: The source whose scrapes decide whether a target of kind ``TRITON_KIND`` is up.
PRIMARY_SOURCE = "triton"


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
