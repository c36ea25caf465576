"""Delivery from the outbox to real HTTP receivers on 127.0.0.1 (each on a free port,
in a thread): signatures verified by the ``standardwebhooks`` package (not our code),
retries through 500 and 429 with Retry-After until every alert arrives exactly once
after dedupe by webhook-id, a 401 dead at once, 410 Gone, dead after the bounded number
of tries, and a new Store on the same file taking up what an earlier one left pending."""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from alerts.delivery import DeliveryWorker, backoff_s, deliver_due, retry_after_s
from alerts.engine import evaluate_alerts
from collector.config import AlertSettings, Settings
from collector.store import Store
from collector.store.alerts import NewNotification
from tests.alert_support import SECRET, Receiver, add_saturation_findings

T0 = 1_800_000_000.0


def alert_settings(url: str, **extra: Any) -> AlertSettings:
    hook: dict[str, Any] = {"url": url + "/hook"}
    if extra.pop("signed", True):
        hook["secret"] = SECRET
    return AlertSettings(receivers=[{"name": "hook", "webhook": hook}], **extra)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'outbox.db'}"


def fire_findings(store: Store, alerts: AlertSettings, models: Sequence[str], at: float) -> None:
    """One firing alert per model (a queue_saturation finding each), in the outbox."""
    add_saturation_findings(store, models, at)
    report = evaluate_alerts(store, Settings(alerts=alerts), now=at)
    assert len(report.notifications) == len(models)


def test_signed_webhooks_verify_with_the_standardwebhooks_package(db: str) -> None:
    with Receiver(secret=SECRET) as receiver, Store(db) as store:
        alerts = alert_settings(receiver.url)
        fire_findings(store, alerts, ["m1", "m2"], time.time())
        report = deliver_due(store, alerts)
        assert (report.delivered, report.tried) == (2, 2)
        assert [r.verified for r in receiver.received] == [True, True]
        assert {r.path for r in receiver.received} == {"/hook"}
        for r in receiver.received:
            doc = json.loads(r.body)
            assert doc["version"] == "4" and doc["alerts"][0]["labels"]["model"] in {"m1", "m2"}
            assert r.headers["webhook-signature"].startswith("v1,")
            assert abs(int(r.headers["webhook-timestamp"]) - time.time()) < 60
            # Signed over exactly these bytes: a changed body no longer verifies.
            with pytest.raises(WebhookVerificationError):
                Webhook(SECRET).verify(r.body.replace("m", "M"), r.headers)
        assert {n.state for n in store.notifications()} == {"delivered"}


def test_a_receiver_with_another_secret_rejects_and_it_is_dead_at_once(db: str) -> None:
    other = "whsec_" + base64.b64encode(b"another-key-another-key-another!").decode()
    with Receiver(secret=other) as receiver, Store(db) as store:
        alerts = alert_settings(receiver.url)
        fire_findings(store, alerts, ["m1"], time.time())
        report = deliver_due(store, alerts)
        assert (report.dead, [r.verified for r in receiver.received]) == (1, [False])
        [n] = store.notifications()
        assert (n.state, n.attempts, n.last_status) == ("dead", 1, 401)
        assert n.last_error is not None and n.last_error.startswith("HTTP 401")
        # Not tried again: the same request would be refused again.
        assert deliver_due(store, alerts, now=time.time() + 3600).tried == 0


def test_500_then_429_with_retry_after_then_every_alert_once(db: str) -> None:
    script = [(500, {}), (429, {"Retry-After": "1"}), (503, {}), (500, {})]
    with Receiver(secret=SECRET, script=script) as receiver, Store(db) as store:
        alerts = alert_settings(receiver.url, backoff_s=0.05, backoff_max_s=0.2, max_attempts=10)
        models = ["m1", "m2", "m3"]
        fire_findings(store, alerts, models, time.time())
        with DeliveryWorker(store, alerts, poll_s=0.05):
            deadline = time.monotonic() + 20
            while len(receiver.delivered()) < len(models) and time.monotonic() < deadline:
                time.sleep(0.05)
        delivered = receiver.delivered()
        # Every alert arrived, exactly once after dedupe by webhook-id.
        fingerprints = [json.loads(b)["alerts"][0]["fingerprint"] for b in delivered.values()]
        assert len(delivered) == 3 and len(set(fingerprints)) == 3
        assert len(receiver.received) == 3 + len(script)  # each failure tried again
        # The try after the 429 came no sooner than its Retry-After said.
        throttled = next(r for r in receiver.received if r.status == 429)
        retry = next(
            r
            for r in receiver.received
            if r.at > throttled.at and r.headers["webhook-id"] == throttled.headers["webhook-id"]
        )
        assert retry.at - throttled.at >= 1.0
        # The same notification carries the same webhook-id on every try.
        ids_tried = {r.headers["webhook-id"] for r in receiver.received}
        assert ids_tried == set(delivered)
        assert {n.state for n in store.notifications()} == {"delivered"}


def test_410_gone_stops_sending_to_the_receiver(db: str) -> None:
    with Receiver(script=[(410, {})]) as receiver, Store(db) as store:
        alerts = alert_settings(receiver.url, signed=False)
        fire_findings(store, alerts, ["m1", "m2"], T0)
        report = deliver_due(store, alerts, now=T0)
        assert (report.gone, len(receiver.received)) == (1, 1)  # the second is never sent
        assert [n.state for n in store.notifications()] == ["gone", "gone"]
        assert store.receivers_gone() == {"hook": "answered 410 Gone"}
        later = NewNotification("msg_later", "hook", "fp", "firing", "{}", T0 + 1)
        store.enqueue_notifications([later])
        assert deliver_due(store, alerts, now=T0 + 2).gone == 1 and len(receiver.received) == 1
        assert store.clear_receiver_gone("hook")
        store.enqueue_notifications(
            [NewNotification("msg_again", "hook", "fp", "test", "{}", T0 + 3)]
        )
        assert deliver_due(store, alerts, now=T0 + 4).delivered == 1


def test_dead_after_the_bounded_number_of_tries(db: str) -> None:
    with Receiver() as receiver:
        closed_url = receiver.url  # nothing listens there once the receiver is gone
    alerts = alert_settings(closed_url, signed=False, max_attempts=3, backoff_s=1, backoff_max_s=4)
    with Store(db) as store:
        fire_findings(store, alerts, ["m1"], T0)
        now = T0
        for _ in range(3):
            [due] = store.due_notifications(now + 1000)
            now = due.next_attempt_at
            deliver_due(store, alerts, now=now, rng=random.Random(7))
        [n] = store.notifications()
        assert (n.state, n.attempts, n.last_status) == ("dead", 3, None)
        assert n.last_error == "no answer: ConnectionError"
        assert store.due_notifications(now + 1e6) == []


def test_a_new_store_on_the_same_file_resumes_pending_notifications(db: str) -> None:
    with Receiver() as receiver:
        down_url = receiver.url
    alerts = alert_settings(down_url)
    with Store(db) as first:
        fire_findings(first, alerts, ["m1", "m2"], time.time())
        # The receiver is down: one try per pass to a receiver that did not answer, the
        # other notification left due for the next pass.
        assert [deliver_due(first, alerts).retried for _ in range(2)] == [1, 1]
    # Started again, with the receiver back on the same port.
    port = int(down_url.rsplit(":", 1)[1])
    with Receiver(secret=SECRET, port=port) as receiver, Store(db) as second:
        due = second.due_notifications(time.time() + 3600)
        assert [n.attempts for n in due] == [1, 1]
        report = deliver_due(second, alerts, now=time.time() + 3600)
        assert report.delivered == 2 and [r.verified for r in receiver.received] == [True, True]
        assert {r.headers["webhook-id"] for r in receiver.received} == {n.webhook_id for n in due}


def test_backoff_doubles_with_jitter_and_retry_after_reads_both_forms() -> None:
    alerts = AlertSettings(backoff_s=2, backoff_max_s=30)
    rng = random.Random(1)
    waits = [backoff_s(n, alerts, rng) for n in range(1, 7)]
    for n, wait in enumerate(waits, start=1):
        full = min(2 * 2 ** (n - 1), 30)
        assert full / 2 <= wait <= full
    assert retry_after_s("7", T0) == 7.0
    assert retry_after_s("Fri, 15 Jan 2027 08:00:10 GMT", 1_800_000_000.0) == pytest.approx(10.0)
    assert retry_after_s("soon", T0) is None and retry_after_s(None, T0) is None


def test_a_timeout_is_no_answer_and_is_tried_again(db: str) -> None:
    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            release.wait(5)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        alerts = alert_settings(url, signed=False, timeout_s=0.2)
        with Store(db) as store:
            fire_findings(store, alerts, ["m1"], T0)
            assert deliver_due(store, alerts, now=T0, session=requests.Session()).retried == 1
            [n] = store.notifications()
            assert (n.state, n.last_error) == ("pending", "no answer: ReadTimeout")
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_slack_gets_one_message_per_delivery_call(db: str) -> None:
    with Receiver() as receiver, Store(db) as store:
        alerts = AlertSettings(receivers=[{"name": "chat", "slack": {"url": receiver.url + "/s"}}])
        fire_findings(store, alerts, ["m1", "m2"], T0)
        assert deliver_due(store, alerts, now=T0).delivered == 1
        assert deliver_due(store, alerts, now=T0).delivered == 1
        assert deliver_due(store, alerts, now=T0).tried == 0
        texts = sorted(json.loads(r.body)["text"] for r in receiver.received)
        assert texts == [
            "[WARNING] BatchscopeQueueSaturation: m1 queues",
            "[WARNING] BatchscopeQueueSaturation: m2 queues",
        ]
        assert all("webhook-signature" not in r.headers for r in receiver.received)
