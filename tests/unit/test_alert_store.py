"""The store's alert tables on SQLite and PostgreSQL: alert states read back as they
were written (and are forgotten on request), state changes and their notifications
are written together, silences match and end, and the outbox hands a due notification
to one delivery at a time: a claim holds it for its lease, so a second delivery does
not take it, and a delivery that died mid-try leaves it to be tried once the lease
ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.store import Store
from collector.store.alerts import AlertState, NewNotification

T0 = 1_800_000_000.0


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'alerts.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    with Store(url) as s:
        yield s


def alert(fp: str = "fp1", **changes: object) -> AlertState:
    values: dict[str, object] = {
        "fingerprint": fp,
        "rule": "queue_saturation",
        "target": "triton-a",
        "subject": "m",
        "state": "firing",
        "severity": "warning",
        "active_since": T0,
        "evaluated_at": T0 + 5,
        "held_at": T0 + 5,
        "fired_at": T0,
        "labels": {"alertname": "BatchscopeQueueSaturation", "model": "m"},
        "annotations": {"summary": "m queues", "config_diff": "-a\n+b\n"},
    }
    values.update(changes)
    return AlertState(**values)  # type: ignore[arg-type]


def note(
    webhook_id: str, at: float = T0, fp: str = "fp1", receiver: str = "hook"
) -> NewNotification:
    return NewNotification(webhook_id, receiver, fp, "firing", '{"k": 1}', at)


def test_states_and_their_notifications_are_written_together(store: Store) -> None:
    store.save_alert_evaluation([alert(), alert("fp2", subject="n")], notifications=[note("a")])
    assert store.alert_states() == [alert(), alert("fp2", subject="n")]
    resolved = alert(state="resolved", resolved_at=T0 + 60)
    store.save_alert_evaluation([resolved], forget=["fp2"], notifications=[note("b", T0 + 60)])
    assert store.alert_states() == [resolved]
    assert store.alert_states(state="firing") == []
    assert store.last_notified(["fp1", "nope"]) == {("fp1", "hook"): T0 + 60}
    assert [n.webhook_id for n in store.notifications()] == ["b", "a"]  # newest first
    assert store.notification_counts() == {("hook", "pending"): 2}


def test_a_failed_write_leaves_no_state_and_no_notification(store: Store) -> None:
    store.save_alert_evaluation([], notifications=[note("a")])
    with pytest.raises(Exception):  # noqa: B017 - the backend's own IntegrityError
        store.save_alert_evaluation([alert("fp9")], notifications=[note("a")])  # id taken
    assert store.alert_states() == []
    assert len(store.notifications()) == 1


def test_silences_match_by_rule_target_and_subject_until_they_end(store: Store) -> None:
    everything_on_a = store.add_silence(starts_at=T0, ends_at=T0 + 100, target="triton-a")
    other_rule = store.add_silence(starts_at=T0, ends_at=T0 + 100, rule="target_down")
    assert everything_on_a.matches(alert(), T0 + 1)
    assert not everything_on_a.matches(alert(target="triton-b"), T0 + 1)
    assert not everything_on_a.matches(alert(), T0 + 100)  # ended
    assert not other_rule.matches(alert(), T0 + 1)
    assert [s.id for s in store.silences(active_at=T0 + 1)] == [everything_on_a.id, other_rule.id]
    store.end_silence(everything_on_a.id, T0 + 10)
    assert [s.id for s in store.silences(active_at=T0 + 10)] == [other_rule.id]
    with pytest.raises(KeyError):
        store.end_silence(12345, T0)
    with pytest.raises(ValueError):
        store.add_silence(starts_at=T0, ends_at=T0)


def test_a_claim_holds_a_notification_for_its_lease(store: Store) -> None:
    store.enqueue_notifications([note("a", T0), note("b", T0 + 1), note("later", T0 + 50)])
    first = store.claim_due_notification(T0 + 2, lease_s=30)
    second = store.claim_due_notification(T0 + 2, lease_s=30)
    assert (first and first.webhook_id, second and second.webhook_id) == ("a", "b")
    # Nothing else is due: both are claimed, the third is not due yet.
    assert store.claim_due_notification(T0 + 2, lease_s=30) is None
    assert store.due_notifications(T0 + 2) == []
    # The delivery holding "a" died: once the lease ends it is due again, as it was.
    again = store.claim_due_notification(T0 + 40, lease_s=30)
    assert again is not None and (again.webhook_id, again.attempts) == ("a", 0)
    # "b"'s lease ended too; a delivery that tried "a" already in this call skips it.
    skipping = store.claim_due_notification(T0 + 40, lease_s=30, skip_ids=[again.id])
    assert skipping is not None and skipping.webhook_id == "b"
    only = store.claim_due_notification(T0 + 100, lease_s=30, webhook_ids=["later"])
    assert only is not None and only.webhook_id == "later"


def test_delivery_outcomes_and_receivers_gone(store: Store) -> None:
    store.enqueue_notifications([note("a"), note("b", receiver="chat")])
    [a] = store.notifications(receiver="hook")
    store.record_delivery_attempt(
        a.id,
        state="delivered",
        attempts=1,
        next_attempt_at=T0,
        last_status=204,
        last_error=None,
        finished_at=T0 + 1,
    )
    [a] = store.notifications(state="delivered")
    assert (a.webhook_id, a.attempts, a.last_status, a.finished_at) == ("a", 1, 204, T0 + 1)
    with pytest.raises(ValueError):
        store.record_delivery_attempt(
            a.id,
            state="lost",
            attempts=1,
            next_attempt_at=T0,
            last_status=None,
            last_error=None,
            finished_at=None,
        )
    store.mark_receiver_gone("chat", T0 + 2, "answered 410 Gone")
    [b] = store.notifications(receiver="chat")
    assert (b.state, b.last_error, b.finished_at) == ("gone", "answered 410 Gone", T0 + 2)
    assert store.receivers_gone() == {"chat": "answered 410 Gone"}
    assert store.clear_receiver_gone("chat") and not store.clear_receiver_gone("chat")
    assert store.receivers_gone() == {}


def test_pruning_forgets_only_what_is_over(store: Store) -> None:
    store.save_alert_evaluation(
        [alert("old", state="resolved", resolved_at=T0), alert("live", state="firing")],
        notifications=[note("done", fp="old"), note("waiting", fp="live")],
    )
    [done] = [n for n in store.notifications() if n.webhook_id == "done"]
    store.record_delivery_attempt(
        done.id,
        state="delivered",
        attempts=1,
        next_attempt_at=T0,
        last_status=200,
        last_error=None,
        finished_at=T0 + 1,
    )
    store.add_silence(starts_at=T0, ends_at=T0 + 10)
    kept = store.add_silence(starts_at=T0, ends_at=T0 + 1000)
    assert store.prune_alerts(T0 + 100) == 3
    assert [s.fingerprint for s in store.alert_states()] == ["live"]
    assert [n.webhook_id for n in store.notifications()] == ["waiting"]
    assert [s.id for s in store.silences()] == [kept.id]


def test_one_evaluator_holds_the_store_until_its_lease_ends(store: Store) -> None:
    assert store.hold_alert_evaluation("a", T0, 30)
    assert not store.hold_alert_evaluation("b", T0 + 10, 30)  # a holds it
    assert store.hold_alert_evaluation("a", T0 + 20, 30)  # renewed, until T0 + 50
    assert not store.hold_alert_evaluation("b", T0 + 45, 30)
    assert store.hold_alert_evaluation("b", T0 + 51, 30)  # a stopped renewing
    assert not store.hold_alert_evaluation("a", T0 + 52, 30)
