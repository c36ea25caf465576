"""The alerts page in headless Chromium, served on localhost (an admin: no password, a
loopback address) from a seeded SQLite store holding a firing alert and a dead
notification: the page shows both, and a silence is created from the form, marks the
alert, and is ended from its button; the findings page links to the same form."""

from __future__ import annotations

import json
import time

from collector.store.alerts import AlertState, NewNotification
from dashboard.app import create_app
from dashboard.ids import Alerts, Findings, Shell
from tests.browser.conftest import click_when_ready, severe_logs, text_when_ready

# Slow refresh: the page redraws when a silence changes, not on a timer.
REFRESH_S = 60.0
MATCHER = "rule queue_saturation · target testbed · model unbatched"


def _firing_alert(now: float) -> AlertState:
    return AlertState(
        fingerprint="fp-unbatched",
        rule="queue_saturation",
        target="testbed",
        subject="unbatched",
        state="firing",
        severity="warning",
        active_since=now - 180,
        evaluated_at=now,
        held_at=now,
        fired_at=now - 120,
        labels={"alertname": "BatchscopeQueueSaturation", "model": "unbatched"},
        annotations={"summary": "unbatched queues: 90% of request time queued"},
    )


def test_an_admin_sees_a_firing_alert_and_silences_it(dash_duo, seeded_store, screenshot) -> None:
    store = seeded_store()
    now = time.time()
    body = json.dumps({"status": "firing"})
    store.save_alert_evaluation(
        [_firing_alert(now)],
        notifications=[NewNotification("msg_dead", "hook", "fp-unbatched", "firing", body, now)],
    )
    [dead] = store.notifications()
    store.record_delivery_attempt(
        dead.id,
        state="dead",
        attempts=8,
        next_attempt_at=now,
        last_status=500,
        last_error="HTTP 500: receiver broke",
        finished_at=now,
    )
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))

    # The nav leads to the page.
    dash_duo.wait_for_text_to_equal(f"#{Shell.ROLE}", "admin", timeout=20)
    click_when_ready(dash_duo, f"#{Shell.NAV} a", text="Alerts")
    dash_duo.wait_for_contains_text(f"#{Alerts.STATES}", "queue_saturation", timeout=20)
    # Read again until they hold: the table may be redrawn once more as the page settles.
    for part in ("firing", "testbed", "unbatched", "90% of request time queued"):
        dash_duo.wait_for_contains_text(f"#{Alerts.STATES} tr.alert-row-firing", part, timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.OUTBOX}", "HTTP 500: receiver broke", timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.SUMMARY}", "1 firing", timeout=20)
    screenshot("alerts-firing")

    # A silence for that alert: its link fills in the form.
    click_when_ready(dash_duo, f"#{Alerts.STATES} a.silence-link")
    dash_duo.wait_for_contains_text(f"#{Alerts.RULE}", "queue saturation", timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.TARGET}", "testbed", timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.SUBJECT}", "unbatched", timeout=20)
    duration = dash_duo.find_element(f"#{Alerts.DURATION}")
    dash_duo.clear_input(duration)
    duration.send_keys("30m")
    dash_duo.find_element(f"#{Alerts.COMMENT}").send_keys("load test")
    dash_duo.find_element(f"#{Alerts.ADD}").click()
    dash_duo.wait_for_contains_text(f"#{Alerts.RESULT}", "Silence #1", timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.SILENCES}", MATCHER, timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.STATES}", "silenced by #1", timeout=20)
    [silence] = store.silences(active_at=time.time())
    assert (silence.rule, silence.target, silence.subject) == (
        "queue_saturation",
        "testbed",
        "unbatched",
    )
    assert 1790 <= silence.ends_at - silence.starts_at <= 1810
    assert silence.comment == "load test"
    screenshot("alerts-silenced")

    # Ended from its button: the alert is no longer held back.
    click_when_ready(dash_duo, f"#{Alerts.SILENCES} button")
    dash_duo.wait_for_contains_text(f"#{Alerts.RESULT}", "Silence #1 ended", timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.SILENCES}", "no silence in force", timeout=20)
    assert "silenced by" not in text_when_ready(dash_duo, f"#{Alerts.STATES}")
    assert store.silences(active_at=time.time()) == []

    # The findings page offers the same form for an open finding's alerts.
    click_when_ready(dash_duo, f"#{Shell.NAV} a", text="Findings")
    click_when_ready(dash_duo, f"#{Findings.LIST} a.silence-link")
    dash_duo.wait_for_contains_text(f"#{Alerts.RULE}", "batching off", timeout=20)
    dash_duo.wait_for_contains_text(f"#{Alerts.SUBJECT}", "unbatched", timeout=20)
    assert severe_logs(dash_duo) == []
