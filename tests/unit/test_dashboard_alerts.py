"""The alerts page's read and its silence actions over a real SQLite store filled
through the store API: alert states in order with the silence holding each back, the
outbox per receiver with its dead and gone notifications (their last error shown,
their bodies left out), and silences added and ended with everything checked first."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.store import Store
from collector.store.alerts import AlertState, NewNotification
from dashboard.actions import ActionRefused, AlertSilences
from dashboard.queries import AlertsView, DashboardQueries, from_json, to_json

T0 = 1_800_000_000.0
NOW = T0 + 600
BODY_MARK = "posted-body-not-for-the-page"


def alert(fp: str, rule: str, subject: str, state: str, **changes: object) -> AlertState:
    values: dict[str, object] = {
        "fingerprint": fp,
        "rule": rule,
        "target": "triton-a",
        "subject": subject,
        "state": state,
        "severity": "warning",
        "active_since": T0,
        "evaluated_at": NOW,
        "held_at": NOW,
        "fired_at": T0 + 60 if state != "pending" else None,
        "labels": {"alertname": "x", "model": subject},
        "annotations": {"summary": f"{subject} {rule}", "config_diff": "-a\n+b\n"},
    }
    values.update(changes)
    return AlertState(**values)  # type: ignore[arg-type]


def note(webhook_id: str, receiver: str, fp: str = "fp-fire") -> NewNotification:
    return NewNotification(
        webhook_id, receiver, fp, "firing", json.dumps({"mark": BODY_MARK}), T0 + 60
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'alerts-page.db'}") as s:
        yield s


@pytest.fixture
def filled(store: Store) -> Store:
    store.save_alert_evaluation(
        [
            alert("fp-old", "target_down", "", "resolved", resolved_at=T0 + 300, labels={}),
            alert("fp-pend", "p95_above_objective", "n", "pending"),
            alert("fp-fire", "queue_saturation", "m", "firing", severity="critical"),
            alert("fp-info", "batch_below_preferred", "k", "firing", severity="info"),
        ],
        notifications=[note("w-ok", "hook"), note("w-dead", "hook"), note("w-wait", "chat")],
    )
    ok, dead, _ = sorted(store.notifications(), key=lambda n: n.id)
    store.record_delivery_attempt(
        ok.id,
        state="delivered",
        attempts=1,
        next_attempt_at=T0 + 60,
        last_status=200,
        last_error=None,
        finished_at=T0 + 61,
    )
    store.record_delivery_attempt(
        dead.id,
        state="dead",
        attempts=8,
        next_attempt_at=T0 + 60,
        last_status=500,
        last_error="HTTP 500: receiver broke",
        finished_at=T0 + 400,
    )
    store.enqueue_notifications([note("w-gone", "old")])
    store.mark_receiver_gone("old", T0 + 500, "answered 410 Gone")
    return store


def read(store: Store, at: float = NOW) -> AlertsView:
    return DashboardQueries(store, clock=lambda: at).alerts()


def test_alerts_are_listed_firing_then_pending_then_resolved(filled: Store) -> None:
    view = read(filled)
    assert view.error is None
    assert [(r.alert.state, r.alert.rule) for r in view.alerts] == [
        ("firing", "queue_saturation"),  # critical before info
        ("firing", "batch_below_preferred"),
        ("pending", "p95_above_objective"),
        ("resolved", "target_down"),
    ]
    assert view.firing == 2
    assert all(r.silenced_by is None for r in view.alerts)
    assert "queue_saturation" in view.rules and "target_down" in view.rules
    assert view.targets == ["triton-a"] and view.subjects == ["k", "m", "n"]


def test_a_silence_in_force_marks_the_alerts_it_holds_back_until_it_ends(filled: Store) -> None:
    silence = filled.add_silence(
        starts_at=T0, ends_at=NOW + 3600, rule="queue_saturation", subject="m"
    )
    filled.add_silence(starts_at=T0, ends_at=T0 + 100, target="triton-a")  # over by NOW
    view = read(filled)
    silenced = {r.alert.fingerprint: r.silenced_by for r in view.alerts}
    assert silenced["fp-fire"] == silence
    assert silenced["fp-pend"] is None and silenced["fp-info"] is None
    assert view.silences == [silence]

    filled.end_silence(silence.id, NOW + 10)
    later = read(filled, NOW + 20)
    assert later.silences == [] and all(r.silenced_by is None for r in later.alerts)


def test_the_outbox_counts_each_receiver_and_names_what_was_not_delivered(filled: Store) -> None:
    view = read(filled)
    by_name = {r.receiver: r for r in view.outbox}
    assert sorted(by_name) == ["chat", "hook", "old"]
    hook, chat, old = by_name["hook"], by_name["chat"], by_name["old"]
    assert (hook.pending, hook.delivered, hook.dead, hook.gone) == (0, 1, 1, 0)
    assert (chat.pending, chat.delivered, chat.dead, chat.gone) == (1, 0, 0, 0)
    assert old.gone == 1 and old.gone_reason == "answered 410 Gone"
    assert hook.gone_reason is None
    # Newest end first: the gone one (T0 + 500), then the dead one (T0 + 400).
    assert [(n.webhook_id, n.state) for n in view.failed] == [
        ("w-gone", "gone"),
        ("w-dead", "dead"),
    ]
    dead = view.failed[1]
    assert (dead.last_status, dead.attempts) == (500, 8)
    assert dead.last_error == "HTTP 500: receiver broke"
    # What was posted stays in the store: the page is sent how delivery went.
    assert all(n.body == "" for n in view.failed)
    assert BODY_MARK not in json.dumps(to_json(view))


def test_the_view_survives_the_page_store(filled: Store) -> None:
    filled.add_silence(starts_at=T0, ends_at=NOW + 60, target="triton-a", comment="load test")
    view = read(filled)
    assert from_json(AlertsView, json.loads(json.dumps(to_json(view)))) == view


def test_an_empty_store_reads_as_nothing_to_show(store: Store) -> None:
    view = read(store)
    assert (view.alerts, view.silences, view.outbox, view.failed) == ([], [], [], [])
    assert view.error is None and view.firing == 0


def test_an_unreadable_store_gives_a_banner_line(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/missing-dir/x.db")  # opened on the first read
    try:
        view = read(store)
    finally:
        store.close()
    assert view.alerts == []
    assert view.error is not None and view.error.startswith("the store cannot be opened")


# --------------------------------------------------------------------------- actions


def test_a_silence_is_added_for_its_duration_and_ended(store: Store) -> None:
    silences = AlertSilences(store, clock=lambda: NOW)
    added = silences.add(
        rule="queue_saturation",
        target="triton-a",
        subject=None,
        duration="2h",
        comment="load test",
        created_by="dashboard (admin)",
    )
    assert (added.starts_at, added.ends_at) == (NOW, NOW + 7200)
    assert (added.rule, added.target, added.subject) == ("queue_saturation", "triton-a", None)
    assert store.silences(active_at=NOW) == [added]
    silences.end(added.id)
    assert store.silences(active_at=NOW) == []
    with pytest.raises(ActionRefused, match="not in force"):
        silences.end(added.id)
    with pytest.raises(ActionRefused, match="not in force"):
        silences.end(9999)


@pytest.mark.parametrize(
    "given,refusal",
    [
        ({"rule": "no_such_rule", "duration": "1h"}, "unknown rule 'no_such_rule'"),
        ({"rule": None, "duration": "1h"}, "choose a rule, a target or a model"),
        ({"duration": "soon"}, "such as 90s, 30m, 2h or 1d"),
        ({"duration": "0m"}, "such as 90s, 30m, 2h or 1d"),
        ({"duration": "31d"}, "at most 30 days"),
        ({"duration": "1h", "comment": "x" * 501}, "longer than 500"),
    ],
)
def test_a_bad_silence_is_refused_and_nothing_is_stored(
    store: Store, given: dict[str, str | None], refusal: str
) -> None:
    values: dict[str, str | None] = {"rule": "queue_saturation", "target": None, "subject": None}
    values.update(given)
    with pytest.raises(ActionRefused, match=refusal):
        AlertSilences(store, clock=lambda: NOW).add(**values)  # type: ignore[arg-type]
    assert store.silences() == []


def test_a_store_that_cannot_be_written_refuses_in_one_line(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/missing-dir/x.db")  # opened on the first use
    silences = AlertSilences(store, clock=lambda: NOW)
    try:
        with pytest.raises(ActionRefused, match="the store could not be written") as err:
            silences.add(rule="queue_saturation", target=None, subject=None, duration="1h")
        assert "\n" not in str(err.value)
        with pytest.raises(ActionRefused, match="the store could not be written"):
            silences.end(1)
    finally:
        store.close()
