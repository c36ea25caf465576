"""The findings page reads the rows it shows.

It offers the findings open now or created in the last week. The detectors store one
row per episode, so a week of a fleet holds thousands; the page shows at most
``EVENTS_SHOWN`` of them. Reading the whole week to sort and cut it in Python made each
view cost more, and hold more memory, the longer serve ran. The store now filters,
orders and cuts in SQL (``Store.finding_events``) and reads the filters' choices as
distinct tuples (``Store.finding_facets``).
"""

from __future__ import annotations

import random

import pytest

from bench.findings_page import whole_week
from collector.store import Store, StoredFinding
from dashboard.components import findings_list
from dashboard.queries import DashboardQueries
from dashboard.queries.events import EVENTS_SHOWN, MODEL_FINDINGS_SHOWN, model_findings

T0 = 1_700_000_000.0
WEEK = 7 * 24 * 3600.0
NOW = T0 + WEEK
SINCE = NOW - WEEK


def _fill(store: Store, count: int, seed: int) -> None:
    """``count`` findings over a week and a day before it: ties in creation time,
    a severity the page does not rank, some resolved, some older than the week (open
    ones among them, which the page still lists)."""
    rng = random.Random(seed)
    for i in range(count):
        created = SINCE - 86400 + rng.randrange(0, int(WEEK + 86400), 600)
        fid = store.add_finding(
            kind=rng.choice(["idle_capacity", "queue_saturation", "batching_off"]),
            severity=rng.choice(["critical", "warning", "info", "notice"]),
            target=rng.choice(["a", "b"]),
            subject=rng.choice(["m1", "m2", "gpu0"]),
            summary=f"finding {i}",
            window_start=created - 60,
            window_end=created,
            evidence={"queue_share": 0.5, "i": i},
            created_at=created,
        )
        if rng.random() < 0.6:
            store.resolve_finding(fid, created + 300)


@pytest.mark.parametrize(
    ("state", "filters", "limit"),
    [
        ("all", {}, None),
        ("active", {}, None),
        ("past", {}, None),
        ("all", {"target": "a"}, None),
        ("all", {"subject": "m2", "kind": "batching_off"}, None),
        ("active", {"severity": "notice"}, None),
        ("past", {"target": "b", "severity": "critical"}, None),
        ("all", {}, 17),
    ],
)
def test_the_store_orders_filters_and_cuts_as_the_page_did(
    store: Store, state: str, filters: dict[str, str], limit: int | None
) -> None:
    _fill(store, 120, seed=7)
    got = store.finding_events(since=SINCE, state=state, limit=limit, **filters)
    assert got == whole_week(store, SINCE, state=state, limit=limit, **filters)[0]
    assert got  # each case lists something, so the comparison says something


def test_the_page_reads_only_the_findings_it_shows(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store, EVENTS_SHOWN + 150, seed=11)
    every, facets = whole_week(store, SINCE, limit=None)
    assert len(every) > EVENTS_SHOWN
    expected = every[:EVENTS_SHOWN]

    def whole_history(*args: object, **kwargs: object) -> list[StoredFinding]:
        raise AssertionError("the whole week of findings was read")

    monkeypatch.setattr(store, "findings", whole_history)
    monkeypatch.setattr(store, "active_findings", whole_history)
    view = DashboardQueries(store, clock=lambda: NOW).events(state="all")
    assert view.error is None
    assert view.events == expected
    assert view.targets == sorted({f[0] for f in facets})
    assert view.subjects == sorted({f[1] for f in facets})
    assert view.kinds == sorted({f[2] for f in facets})
    assert view.severities == ["critical", "warning", "info", "notice"]


def test_an_unknown_state_is_refused_by_name(store: Store) -> None:
    with pytest.raises(ValueError, match="state must be one of .* got 'open'"):
        store.finding_events(since=SINCE, state="open")


def test_a_model_page_reads_that_models_findings_and_at_most_a_page_of_them(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store, 3 * MODEL_FINDINGS_SHOWN + 200, seed=5)
    every, _ = whole_week(store, SINCE, target="a", subject="m1", limit=None)
    assert len(every) > MODEL_FINDINGS_SHOWN

    def whole_history(*args: object, **kwargs: object) -> list[StoredFinding]:
        raise AssertionError("every finding of the target was read")

    monkeypatch.setattr(store, "findings", whole_history)
    monkeypatch.setattr(store, "active_findings", whole_history)
    got = DashboardQueries(store, clock=lambda: NOW).findings("a", "m1", since=SINCE)
    # The findings page's order and the first of its rows for this target and model.
    assert got == every[:MODEL_FINDINGS_SHOWN]


def test_a_cut_list_of_a_models_findings_links_to_all_of_them(store: Store) -> None:
    _fill(store, 3 * MODEL_FINDINGS_SHOWN + 200, seed=5)
    findings = model_findings(store, "a", "m1", SINCE)
    cut = str(findings_list(findings, NOW, target="a", model="m1"))
    assert f"The first {MODEL_FINDINGS_SHOWN} shown" in cut
    assert "/findings?target=a&model=m1&state=all" in cut
    whole = str(findings_list(findings[:3], NOW, target="a", model="m1"))
    assert "/findings?" not in whole and "finding " in whole
