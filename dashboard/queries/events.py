"""Events for the findings page: every kind of event the store keeps, filtered and
ordered (open ones first, the most severe first, newest first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from collector.store import Store, StoredFinding
from dashboard.queries.views import EventsView, is_open, severity_rank

__all__ = ["EVENT_READERS", "model_findings", "read_events"]


def _findings_since(store: Store, since: float) -> list[StoredFinding]:
    seen = {f.id: f for f in store.findings(since=since)}
    seen.update({f.id: f for f in store.active_findings()})
    return list(seen.values())


#: Each reader turns one kind of stored event into findings-shaped events since a time.
EVENT_READERS: Final[tuple[Callable[[Store, float], list[StoredFinding]], ...]] = (_findings_since,)


def read_events(
    store: Store,
    *,
    since: float,
    target: str | None,
    subject: str | None,
    kind: str | None,
    severity: str | None,
    state: str,
) -> EventsView:
    every = [e for read in EVENT_READERS for e in read(store, since)]
    chosen = [
        e
        for e in every
        if (target is None or e.target == target)
        and (subject is None or e.subject == subject)
        and (kind is None or e.kind == kind)
        and (severity is None or e.severity == severity)
        and (state == "all" or (state == "active") == is_open(e))
    ]
    chosen.sort(key=lambda e: (not is_open(e), severity_rank(e.severity), -e.created_at, -e.id))
    return EventsView(
        events=chosen[:500],
        targets=sorted({e.target for e in every}),
        subjects=sorted({e.subject for e in every}),
        kinds=sorted({e.kind for e in every}),
        severities=sorted({e.severity for e in every}, key=severity_rank),
    )


def model_findings(store: Store, target: str, model: str, since: float) -> list[StoredFinding]:
    """The model's open findings and those created since ``since``; open ones first,
    then newest first."""
    seen: dict[int, StoredFinding] = {}
    for f in [*store.active_findings(target=target), *store.findings(target=target, since=since)]:
        if f.subject == model:
            seen[f.id] = f
    return sorted(seen.values(), key=lambda f: (not is_open(f), -f.created_at, -f.id))
