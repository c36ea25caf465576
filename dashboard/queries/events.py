"""Events for the findings page: every kind of event the store keeps, filtered and
ordered (open ones first, the most severe first, newest first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from collector.store import Store, StoredFinding
from dashboard.queries.views import EventsView, is_open, severity_rank

__all__ = [
    "EVENTS_SHOWN",
    "EVENT_READERS",
    "EventQuery",
    "EventsRead",
    "MODEL_FINDINGS_SHOWN",
    "model_findings",
    "page_order",
    "read_events",
]


#: The most events the page lists.
EVENTS_SHOWN: Final = 500
#: The most findings a model's page lists; the findings page has the rest.
MODEL_FINDINGS_SHOWN: Final = 50


@dataclass(frozen=True)
class EventQuery:
    """What the findings page asks for: events open now or since ``since`` that match
    the filters (``None``: any), ``state`` ``"active"``, ``"past"`` or ``"all"``."""

    since: float
    target: str | None = None
    subject: str | None = None
    kind: str | None = None
    severity: str | None = None
    state: str = "active"


@dataclass(frozen=True)
class EventsRead:
    """One kind of event's share of the page: at most ``limit`` of its matching events
    in the page's order, and the (target, subject, kind, severity) its events offer to
    the filters."""

    events: list[StoredFinding]
    facets: list[tuple[str, str, str, str]]


def _findings(store: Store, query: EventQuery, limit: int) -> EventsRead:
    events = store.finding_events(
        since=query.since,
        target=query.target,
        subject=query.subject,
        kind=query.kind,
        severity=query.severity,
        state=query.state,
        limit=limit,
    )
    return EventsRead(events, store.finding_facets(since=query.since))


#: Each reader reads one kind of stored event for a query, at most ``limit`` of them:
#: the page's read stays the size of the page, however long the history.
EVENT_READERS: Final[tuple[Callable[[Store, EventQuery, int], EventsRead], ...]] = (_findings,)


def page_order(event: StoredFinding) -> tuple[bool, int, float, int]:
    """Open ones first, the most severe first, then newest first."""
    return (not is_open(event), severity_rank(event.severity), -event.created_at, -event.id)


def read_events(store: Store, query: EventQuery) -> EventsView:
    reads = [read(store, query, EVENTS_SHOWN) for read in EVENT_READERS]
    events = sorted((e for r in reads for e in r.events), key=page_order)[:EVENTS_SHOWN]
    facets = {facet for r in reads for facet in r.facets}
    return EventsView(
        events=events,
        targets=sorted({f[0] for f in facets}),
        subjects=sorted({f[1] for f in facets}),
        kinds=sorted({f[2] for f in facets}),
        severities=sorted({f[3] for f in facets}, key=severity_rank),
    )


def model_findings(store: Store, target: str, model: str, since: float) -> list[StoredFinding]:
    """The model's findings open now or created since ``since``, in the findings
    page's order (open first, the most severe first, newest first), at most
    ``MODEL_FINDINGS_SHOWN``. Read by model in SQL: a week of a target's findings holds
    every model's episodes."""
    return store.finding_events(
        since=since, target=target, subject=model, limit=MODEL_FINDINGS_SHOWN
    )
