"""Rules → states → outbox: alerts go pending → firing → resolved as the store's
findings, target health and model figures say, each state change's notifications are
in the outbox with it, and a restart (a new Store on the same file) neither fires an
alert again nor forgets one. Silences, the repeat interval, routes, disabled rules and
no-data resolution."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from alerts.annotate import fingerprint
from alerts.engine import evaluate_alerts
from collector.config import AlertSettings, Settings
from collector.records import (
    BatcherConfig,
    ConfigChange,
    ModelMetrics,
    Prediction,
    Recommendation,
    TritonSnapshot,
)
from collector.sources.triton_metrics import REQUEST_SUMMARY
from collector.store import Store
from collector.store.alerts import Notification

T0 = 1_800_000_000.0
HOOK = {"name": "hook", "webhook": {"url": "http://127.0.0.1:9/hook"}}
AM = {"name": "am", "alertmanager": {"url": "http://127.0.0.1:9", "resend_s": 60}}


def settings(**alerts: Any) -> Settings:
    alerts.setdefault("receivers", [HOOK])
    alerts.setdefault("dashboard_url", "http://ui:8050")
    return Settings(alerts=AlertSettings(**alerts), slo_p95_ms={"m": 40.0})


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'alerts.db'}"


@pytest.fixture
def store(db: str) -> Iterator[Store]:
    with Store(db) as s:
        yield s


def scrape(
    store: Store, i: int, *, up: bool = True, fail: float = 0.0, p95_ms: float = 10.0
) -> float:
    """Scrape ``i`` (5 s apart) of triton-a serving model m at 20 req/s, ``fail`` failed
    requests per second, Triton's p95 ``p95_ms``; ``up=False``: the scrape failed."""
    at = T0 + 5 * i
    if up:
        metrics = ModelMetrics(
            model="m",
            version="1",
            request_success=100.0 * i,
            request_failure_by_reason={"OTHER": 5 * fail * i},
            inference_count=100.0 * i,
            exec_count=100.0 * i,
            request_duration_us=1e5 * i,
            queue_duration_us=1e4 * i,
            summary_quantiles_us={REQUEST_SUMMARY: {0.95: p95_ms * 1e3}},
        )
        store.write_triton(
            TritonSnapshot(target="triton-a", collected_at=at, model_metrics=(metrics,))
        )
    store.record_scrape(
        "triton-a",
        "triton",
        kind="triton",
        started_at=at,
        duration_s=0.01,
        error_kind=None if up else "down",
        error=None if up else "connection refused",
        interval_s=5.0,
    )
    return at


def queue_finding(store: Store, at: float) -> int:
    return store.add_finding(
        kind="queue_saturation",
        severity="warning",
        target="triton-a",
        subject="m",
        summary="m queues: 60% of request time is queueing",
        window_start=at - 30,
        window_end=at,
        evidence={"queue_share": 0.6, "queue_us_per_request": 12_345.0},
        created_at=at,
    )


def recommendation(at: float) -> Recommendation:
    current = BatcherConfig(max_batch_size=32)
    proposed = replace(
        current, dynamic_batching=True, max_queue_delay_us=500, preferred_batch_sizes=(8,)
    )
    return Recommendation(
        target="triton-a",
        model="m",
        created_at=at,
        kind="tune",
        changes=(
            ConfigChange("dynamic_batching", False, True),
            ConfigChange("max_queue_delay_us", 0, 500),
        ),
        current_config=current,
        proposed_config=proposed,
        current=Prediction(qps=100.0, p95_ms=30.0),
        predicted=Prediction(qps=400.0, p95_ms=20.0),
        confidence=0.8,
        reason="batches form at the delay limit",
        config_pbtxt="max_batch_size: 32\n",
    )


def outbox(store: Store) -> list[Notification]:
    return sorted(store.notifications(), key=lambda n: n.id)


def test_a_finding_fires_once_carries_the_fix_and_resolves(store: Store, db: str) -> None:
    config = settings()
    at = scrape(store, 0)
    finding = queue_finding(store, at)
    store.add_recommendation(recommendation(at))

    report = evaluate_alerts(store, config, now=at)
    [alert] = report.states
    assert (alert.rule, alert.state, alert.fired_at) == ("queue_saturation", "firing", at)
    assert alert.fingerprint == fingerprint("queue_saturation", "triton-a", "m")
    [sent] = outbox(store)
    assert (sent.receiver, sent.alert_status, sent.state) == ("hook", "firing", "pending")
    body = json.loads(sent.body)
    assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "hook"
    [item] = body["alerts"]
    assert item["labels"] == {
        "alertname": "BatchscopeQueueSaturation",
        "rule": "queue_saturation",
        "severity": "warning",
        "target": "triton-a",
        "model": "m",
    }
    notes = item["annotations"]
    assert notes["summary"].startswith("m queues")
    assert "time spent queued: 60%" in notes["evidence"]
    assert "queue time per request: 12.3 ms" in notes["evidence"]
    assert "+dynamic_batching {" in notes["config_diff"]
    assert "+  max_queue_delay_microseconds: 500" in notes["config_diff"]
    assert "100 → 400 QPS" in notes["recommendation"]
    assert notes["link"] == "http://ui:8050/model?target=triton-a&model=m"
    assert item["generatorURL"] == notes["link"] and item["fingerprint"] == alert.fingerprint

    # Evaluated again, and again after a restart: still firing, nothing sent again.
    evaluate_alerts(store, config, now=at + 15)
    with Store(db) as restarted:
        again = evaluate_alerts(restarted, config, now=at + 30)
        assert [s.state for s in again.states] == ["firing"] and again.notifications == ()
        assert len(outbox(restarted)) == 1

        restarted.resolve_finding(finding, at + 40)
        resolved = evaluate_alerts(restarted, config, now=at + 45)
        assert [(s.state, s.resolved_at) for s in resolved.states] == [("resolved", at + 45)]
        [note] = resolved.notifications
        doc = json.loads(note.body)
        assert doc["status"] == "resolved" and doc["alerts"][0]["endsAt"].startswith("2027-01-15")
        assert evaluate_alerts(restarted, config, now=at + 60).notifications == ()


def test_target_down_waits_for_its_for_then_fires_and_resolves(store: Store) -> None:
    config = settings()
    scrape(store, 0)
    at = scrape(store, 1, up=False)
    first = evaluate_alerts(store, config, now=at)
    assert [(s.rule, s.state) for s in first.states] == [("target_down", "pending")]
    assert first.notifications == ()
    at = scrape(store, 13, up=False)  # 60 s after the first failure
    fired = evaluate_alerts(store, config, now=at)
    assert [(s.rule, s.state) for s in fired.states] == [("target_down", "firing")]
    [note] = fired.notifications
    labels = json.loads(note.body)["alerts"][0]["labels"]
    assert (labels["alertname"], labels["severity"], "model" in labels) == (
        "BatchscopeTargetDown",
        "critical",
        False,
    )
    at = scrape(store, 14)
    resolved = evaluate_alerts(store, config, now=at)
    assert [s.state for s in resolved.states if s.rule == "target_down"] == ["resolved"]
    assert [n.alert_status for n in resolved.notifications] == ["resolved"]


def test_a_pending_alert_that_clears_is_forgotten_without_a_word(store: Store) -> None:
    config = settings()
    scrape(store, 0)
    at = scrape(store, 1, up=False)
    assert [s.state for s in evaluate_alerts(store, config, now=at).states] == ["pending"]
    at = scrape(store, 2)
    assert evaluate_alerts(store, config, now=at).states == ()
    assert outbox(store) == []


def test_failure_rate_and_p95_above_the_objective(store: Store) -> None:
    config = settings(rules={"failure_rate": {"for_s": 0}, "p95_above_objective": {"for_s": 0}})
    for i in range(4):
        at = scrape(store, i, fail=5.0, p95_ms=55.0)  # 5 of 25 req/s fail; objective 40 ms
    report = evaluate_alerts(store, config, now=at)
    by_rule = {s.rule: s for s in report.states}
    assert set(by_rule) == {"failure_rate", "p95_above_objective"}
    assert all(s.state == "firing" for s in by_rule.values())
    assert "20% of requests fail" in by_rule["failure_rate"].annotations["summary"]
    assert (
        "p95 55.0 ms is above its objective of 40 ms"
        in (by_rule["p95_above_objective"].annotations["summary"])
    )
    for i in range(4, 20):
        at = scrape(store, i, fail=0.0, p95_ms=20.0)
    cleared = evaluate_alerts(store, config, now=at)
    assert {s.rule: s.state for s in cleared.states} == {
        "failure_rate": "resolved",
        "p95_above_objective": "resolved",
    }


def test_a_silence_holds_notifications_back_until_it_ends(store: Store) -> None:
    config = settings()
    at = scrape(store, 0)
    queue_finding(store, at)
    silence = store.add_silence(
        starts_at=at - 1, ends_at=at + 100, rule="queue_saturation", created_by="ops"
    )
    silenced = evaluate_alerts(store, config, now=at)
    assert [s.state for s in silenced.states] == ["firing"] and silenced.notifications == ()
    # Another target's alerts, or another rule's, are not silenced by it.
    assert not silence.matches(replace(silenced.states[0], rule="batching_off"), at)
    store.end_silence(silence.id, at + 10)
    assert store.silences(active_at=at + 20) == []
    after = evaluate_alerts(store, config, now=at + 20)
    assert [n.alert_status for n in after.notifications] == ["firing"]


def test_repeat_interval_and_alertmanager_resend(store: Store) -> None:
    config = settings(receivers=[HOOK, AM], repeat_interval_s=600)
    at = scrape(store, 0)
    queue_finding(store, at)
    first = evaluate_alerts(store, config, now=at)
    assert sorted(n.receiver for n in first.notifications) == ["am", "hook"]
    [am_body] = [json.loads(n.body) for n in first.notifications if n.receiver == "am"]
    # Alertmanager's array: valid four re-sends ahead, so it resolves should we vanish.
    assert am_body[0]["labels"]["alertname"] == "BatchscopeQueueSaturation"
    assert "status" not in am_body[0] and am_body[0]["endsAt"] > am_body[0]["startsAt"]
    assert [n.receiver for n in evaluate_alerts(store, config, now=at + 30).notifications] == []
    assert [n.receiver for n in evaluate_alerts(store, config, now=at + 60).notifications] == ["am"]
    later = evaluate_alerts(store, config, now=at + 600)
    assert sorted(n.receiver for n in later.notifications) == ["am", "hook"]
    ids = [n.webhook_id for n in outbox(store)]
    assert len(ids) == len(set(ids)) == 5  # every notification its own idempotency key


def test_routes_choose_receivers_by_labels_and_severity(store: Store) -> None:
    config = settings(
        receivers=[HOOK, AM],
        routes=[
            {"match": {"rule": "target_down"}, "receivers": ["am"]},
            {"severity": ["warning"], "receivers": ["hook"]},
        ],
        rules={"target_down": {"for_s": 0}},
    )
    scrape(store, 0)
    at = scrape(store, 1, up=False)
    queue_finding(store, at)
    report = evaluate_alerts(store, config, now=at)
    sent = {
        (json.loads(n.body)[0]["labels"]["rule"] if n.receiver == "am" else "queue", n.receiver)
        for n in report.notifications
    }
    assert sent == {("target_down", "am"), ("queue", "hook")}


def test_a_disabled_rule_never_fires_and_its_alerts_clear(store: Store) -> None:
    at = scrape(store, 0)
    queue_finding(store, at)
    evaluate_alerts(store, settings(), now=at)
    off = settings(rules={"queue_saturation": {"enabled": False}})
    report = evaluate_alerts(store, off, now=at + 5)
    assert [s.state for s in report.states] == ["resolved"]
    assert [n.alert_status for n in report.notifications] == ["resolved"]


def test_an_alert_without_data_resolves_after_no_data_resolve_s(store: Store) -> None:
    config = settings(rules={"failure_rate": {"for_s": 0}}, no_data_resolve_s=300)
    for i in range(3):
        at = scrape(store, i, fail=5.0)
    assert [s.state for s in evaluate_alerts(store, config, now=at).states] == ["firing"]
    # No scrape since: stale, nothing known; the alert holds on, then resolves.
    assert [s.state for s in evaluate_alerts(store, config, now=at + 200).states] == ["firing"]
    last = evaluate_alerts(store, config, now=at + 301)
    assert [s.state for s in last.states] == ["resolved"]
    assert [n.alert_status for n in last.notifications] == ["resolved"]


def test_a_second_evaluator_on_the_store_stands_by(store: Store, db: str) -> None:
    config = settings()
    at = scrape(store, 0)
    queue_finding(store, at)
    first = evaluate_alerts(store, config, now=at, holder="serve")
    assert first.evaluated and len(first.notifications) == 1
    with Store(db) as other_process:
        standby = evaluate_alerts(other_process, config, now=at + 15, holder="alerts-run")
        assert not standby.evaluated and standby.notifications == ()
        assert [s.state for s in standby.states] == ["firing"]  # what the holder decided
        # The holder stopped: once its lease (three analysis passes of 15 s) ran out, the
        # other takes over, continuing the stored states without notifying again.
        took_over = evaluate_alerts(other_process, config, now=at + 46, holder="alerts-run")
        assert took_over.evaluated and took_over.notifications == ()
    assert len(outbox(store)) == 1


def test_the_fix_is_offered_only_while_the_latest_recommendation_is_open(store: Store) -> None:
    config = settings()
    at = scrape(store, 0)
    queue_finding(store, at)
    rec_id = store.add_recommendation(recommendation(at))
    [alert] = evaluate_alerts(store, config, now=at).states
    assert "config_diff" in alert.annotations
    store.record_recommendation_outcome(rec_id, outcome="kept", at=at + 10)
    [alert] = evaluate_alerts(store, config, now=at + 15).states
    assert "config_diff" not in alert.annotations and "recommendation" not in alert.annotations
    no_change = replace(recommendation(at + 20), kind="no_change", changes=())
    store.add_recommendation(no_change)
    [alert] = evaluate_alerts(store, config, now=at + 30).states
    assert "config_diff" not in alert.annotations
